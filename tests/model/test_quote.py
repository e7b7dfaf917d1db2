"""The one quoting helper, and the grep-able rule that nothing puts a name into SQL any other way."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import duckdb
import pytest
import sqlite3

from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.quote import quote_ident, quote_literal

TOOLS = Path(__file__).resolve().parents[2] / "tools"
NAMES = ['plain', 'with space', 'a"b', '"; DROP TABLE t; --', "it's", 'x" AS SELECT 1; --', '""', "ünï", "a\nb", "[x]", "`y`"]


@pytest.mark.parametrize("name", NAMES)
def test_quote_ident_names_exactly_that_table(name):
    for con in (duckdb.connect(), sqlite3.connect(":memory:")):
        con.execute(f"CREATE TABLE {quote_ident(name)} ({quote_ident(name)} INTEGER)")
        con.execute(f"INSERT INTO {quote_ident(name)} VALUES (7)")
        assert con.execute(f"SELECT {quote_ident(name)} FROM {quote_ident(name)}").fetchall() == [(7,)]
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master" if isinstance(con, sqlite3.Connection)
                                            else "SELECT table_name FROM duckdb_tables()").fetchall()]
        assert tables == [name]
        con.close()


@pytest.mark.parametrize("value", NAMES)
def test_quote_literal_is_that_string(value):
    assert duckdb.connect().execute(f"SELECT {quote_literal(value)}").fetchall() == [(value,)]


def test_nul_is_refused():
    with pytest.raises(ProfileError, match="NUL"):
        quote_ident("a\x00b")
    with pytest.raises(ProfileError, match="NUL"):
        quote_literal("a\x00b")


def _fstrings(path: Path):
    with open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type == tokenize.STRING:
                prefix = re.match(r"[A-Za-z]*", tok.string).group(0).lower()
                if "f" in prefix:
                    yield tok.start[0], tok.string


def _offenders(paths: list[Path]) -> list[str]:
    offenders = []
    for path in paths:
        for line, text in _fstrings(path):
            body = re.sub(r"^[A-Za-z]*('''|\"\"\"|'|\")", "", text)
            if re.search(r'(?<!\\)"\{[^{}]*\}"|\\"\{', body):
                offenders.append(f"{path.name}:{line}")
        source = path.read_text()
        for m in re.finditer(r"""\.replace\(\s*(["'])'\1\s*,\s*(["'])''\2\s*\)""", source):
            offenders.append(f"{path.name}:{source[:m.start()].count(chr(10)) + 1} (hand-escaped literal)")
    return offenders


def test_no_hand_quoted_names_in_sql():
    """A `"{...}"` inside an f-string is an identifier quoted by hand (a `"` in the name breaks out of it), and
    `.replace("'", "''")` is a literal quoted by hand: both must go through quote_ident / quote_literal."""
    paths = [p for p in sorted(TOOLS.rglob("*.py")) if not (p.name == "quote.py" and p.parent.name == "model")]
    offenders = _offenders(paths)
    assert not offenders, "quote these with gpuscope.tools.model.quote: " + ", ".join(offenders)


def test_the_rule_catches_hand_quoting(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(t, h):\n"
                   "    a = f'SELECT * FROM \"{t}\"'\n"
                   "    b = f\"SELECT * FROM \\\"{t}\\\"\"\n"
                   "    c = \"'\" + h.replace(\"'\", \"''\") + \"'\"\n"
                   "    d = f'SELECT * FROM {quote_ident(t)}'\n")
    assert _offenders([bad]) == ["bad.py:2", "bad.py:3", "bad.py:4 (hand-escaped literal)"]
