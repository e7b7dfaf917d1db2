"""The one way a name or value read from a profile (or chosen by a user) enters SQL text.

Table and column names inside a profile are attacker-controlled: a SQLite export can hold a table
called `x"; ATTACH ...`. Every f-string that puts such a name into DuckDB or SQLite SQL goes
through quote_ident; values go through parameters where the statement allows them and through
quote_literal where it does not (ATTACH paths, view bodies). tests/model/test_quote.py greps the
engine for names put into SQL any other way.
"""

from __future__ import annotations

from .errors import ProfileError


def quote_ident(name: str) -> str:
    """A double-quoted identifier, valid in DuckDB and SQLite, that can only ever name `name`."""
    if not isinstance(name, str):
        raise TypeError(f"identifier must be text, not {type(name).__name__}")
    if "\x00" in name:
        raise ProfileError("a table or column name in the profile contains a NUL character; gpuscope does not read such "
                           "names. The file is damaged or crafted: re-export the profile.")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A single-quoted string literal for the few places that take no parameters (ATTACH, view bodies)."""
    if "\x00" in value:
        raise ProfileError("a path or name contains a NUL character, which SQL text cannot hold.")
    return "'" + value.replace("'", "''") + "'"
