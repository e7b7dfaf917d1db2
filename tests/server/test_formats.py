"""Stable outputs for scripts: every result carries schema_version, `gpuscope schema TOOL` prints its JSON Schema,
the keys pinned for a schema version never disappear, and every tool command writes table, json, csv or parquet."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pytest

from conftest import write_scenario
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.server.cli import COMMANDS, main, result_models, table_rows
from gpuscope.tools import analyses as A
from gpuscope.tools.model.trace import load_trace

PINNED = Path(__file__).with_name("result_keys_v1.json")


def _keys(schema: dict, node: dict | None = None, prefix: str = "") -> set[str]:
    """Every property path of a JSON Schema (rows of lists as name[])."""
    node = schema if node is None else node
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]]
    out = set()
    for variant in node.get("anyOf", []):
        out |= _keys(schema, variant, prefix)
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        out |= _keys(schema, node["items"], prefix + "[]")
    for name, sub in node.get("properties", {}).items():
        out.add(prefix + "." + name if prefix else name)
        out |= _keys(schema, sub, prefix + "." + name if prefix else name)
    return out


def test_every_result_carries_its_schema_version_and_pinned_keys_stay():
    """Keys recorded for schema_version 1 (result_keys_v1.json) must all still exist: a rename or removal needs the
    tool's schema_version raised and a new pin. Regenerate after adding fields: PYTHONPATH=tests python tests/server/test_formats.py"""
    pinned = json.loads(PINNED.read_text())
    models = result_models()
    for tool, model in models.items():
        if tool == "save_baseline":  # a file layout with its own schema_version (regression.SCHEMA_VERSION)
            continue
        assert model.model_fields["schema_version"].default == 1, tool
        assert tool in pinned, f"{tool} has no pinned keys: run PYTHONPATH=tests python tests/server/test_formats.py"
        missing = set(pinned[tool]) - _keys(model.model_json_schema(mode="serialization"))
        assert not missing, f"{tool}: keys of schema_version 1 gone: {sorted(missing)}"


def test_schema_command(capsys):
    main(["schema", "top-kernels"])
    schema = json.loads(capsys.readouterr().out)
    assert {"schema_version", "devices", "kernels", "kernels[].total_ns"} <= _keys(schema)
    main(["schema", "list"])
    assert "top_kernels          schema_version 1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["schema", "nope"])
    assert info.value.code == 2 and "gpuscope schema list" in capsys.readouterr().err


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return write_scenario(SCENARIOS["concurrent_streams"](), "nsys", tmp_path_factory.mktemp("fmt") / "p.sqlite")


def test_csv_rows_are_the_json_rows(profile, capsys):
    main(["top-kernels", str(profile), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1
    main(["top-kernels", str(profile), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["name"] for r in rows] == [k["name"] for k in doc["kernels"]]  # the longest list: kernels
    assert [int(r["total_ns"]) for r in rows] == [k["total_ns"] for k in doc["kernels"]]
    assert list(rows[0]) == list(doc["kernels"][0])  # columns = JSON field names, in order
    assert json.loads(rows[0]["grid"]) == doc["kernels"][0]["grid"]  # lists as JSON text
    main(["top-kernels", str(profile), "--format", "csv", "--rows", "devices"])
    devices = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(d["kernel_count"]) for d in devices] == [d["kernel_count"] for d in doc["devices"]]
    main(["top-kernels", str(profile), "--format", "table"])
    assert "schema_version" not in capsys.readouterr().out  # for programs, not readers


def test_parquet_needs_a_file_and_holds_the_rows(profile, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["gap-histogram", str(profile), "--format", "parquet"])
    assert info.value.code == 2 and "--output" in capsys.readouterr().err
    out = tmp_path / "ops.parquet"
    main(["api-summary", str(profile), "--format", "parquet", "-o", str(out)])
    res = A.api_summary(load_trace(profile))
    field, expected = table_rows(res)
    got = duckdb.sql(f"SELECT * FROM read_parquet('{out}')").fetchall()
    assert len(got) == len(expected) > 0
    assert [list(r) for r in got] == [list(r.values()) for r in expected]


def test_every_tool_command_has_the_format_options():
    from gpuscope.server.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for name in COMMANDS:
        opts = {o for a in sub[name]._actions for o in a.option_strings}
        assert {"--format", "--json", "--rows", "--output"} <= opts, name


if __name__ == "__main__":  # regenerate the pinned keys (only additions should ever appear in its diff)
    PINNED.write_text(json.dumps({t: sorted(_keys(m.model_json_schema(mode="serialization")))
                                  for t, m in sorted(result_models().items()) if t != "save_baseline"}, indent=1) + "\n")
