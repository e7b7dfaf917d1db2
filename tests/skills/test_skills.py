"""Bundled skills: frontmatter, tool references, size limits, MCP resources/prompts/get_guide."""

from __future__ import annotations

import re

import pytest
from mcp import Client

from gpuscope.server import skills as S
from gpuscope.server.app import server

pytestmark = pytest.mark.anyio
EXPECTED = {"perf-analysis", "trace-analysis", "remote-slurm", "profile-capture"}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@pytest.fixture
async def client(anyio_backend):
    async with Client(server) as c:
        yield c


def _schema_props(schema, out: set[str]) -> set[str]:
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k == "properties" and isinstance(v, dict):
                out.update(v)
            _schema_props(v, out)
    elif isinstance(schema, list):
        for v in schema:
            _schema_props(v, out)
    return out


def test_frontmatter_and_sizes():
    assert set(S.skill_names()) == EXPECTED
    for name in S.skill_names():
        fm = S.frontmatter(name)
        assert fm["name"] == name and NAME_RE.match(name) and len(name) <= 64
        assert 50 <= len(fm["description"]) <= 1024, name
        assert "use when" in fm["description"].lower(), name
        tools = fm["allowed-tools"].split()
        assert tools and all(t.startswith("mcp__gpuscope__") for t in tools), name
        assert len(S.read(name).splitlines()) < 200, name
    for topic, path in S.topics().items():
        assert len(path.read_text().encode()) < 20_000, topic


async def test_tool_and_field_references_exist(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    fields = {n: _schema_props(t.output_schema or {}, set()) for n, t in tools.items()}
    params = set().union(*(_schema_props(t.input_schema, set()) for t in tools.values()))
    all_fields = set().union(*fields.values()) | params
    for topic, path in S.topics().items():
        text = path.read_text()
        for t in re.findall(r"mcp__gpuscope__(\w+)", text):
            assert t in tools, (topic, t)
        for span in re.findall(r"`([^`\n]+)`", text):
            dotted = re.fullmatch(r"([a-z_]+)\.([a-z_]+)(?:\.[a-z_]+)?", span)
            if dotted and dotted.group(1) in tools:                      # `tool.field`
                assert dotted.group(2) in fields[dotted.group(1)], (topic, span)
            elif dotted and "_" in dotted.group(1):
                pytest.fail(f"{topic}: unknown tool in `{span}`")
            elif re.fullmatch(r"[a-z]+(_[a-z]+)+", span):                 # bare snake_case: tool or figure
                assert span in tools or span in all_fields, (topic, span)


async def test_resources_listed_and_readable(client):
    res = {str(r.uri): r for r in (await client.list_resources()).resources}
    for topic in S.topics():
        uri = S._uri(topic)
        assert uri in res and res[uri].mime_type == "text/markdown", uri
        text = (await client.read_resource(uri)).contents[0].text
        assert text == S.read(topic)
    assert "skill://perf-analysis/SKILL.md" in res
    assert "skill://trace-analysis/references/comparison.md" in res


async def test_prompts_render(client):
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert {"analyze_trace", "compare_traces", "delegate_profiling"} <= set(prompts)
    txt = (await client.get_prompt("analyze_trace", {"trace": "run1.sqlite"})).messages[0].content.text
    assert "run1.sqlite" in txt and "trace_info" in txt and "---\nname:" not in txt
    txt = (await client.get_prompt("compare_traces", {"baseline": "a.sqlite", "candidate": "b.db"})).messages[0].content.text
    assert "a.sqlite" in txt and "b.db" in txt and "Cross-platform" in txt
    txt = (await client.get_prompt("delegate_profiling", {"workload": "train.py", "goal": "faster"})).messages[0].content.text
    assert "train.py" in txt and "nsys" in txt and "Remote Execution Context (pass" not in txt
    txt = (await client.get_prompt("delegate_profiling", {"workload": "w", "goal": "g",
                                                          "cluster": "login: u@h"})).messages[0].content.text
    assert "login: u@h" in txt and "srun" in txt


async def test_get_guide(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    a = tools["get_guide"].annotations
    assert (a.read_only_hint, a.idempotent_hint, a.open_world_hint, a.destructive_hint) == (True, True, False, False)
    assert tools["get_guide"].output_schema["type"] == "object"
    r = await client.call_tool("get_guide", {"topic": "perf-analysis"})
    assert not r.is_error and r.structured_content["text"] == S.read("perf-analysis")
    assert r.structured_content["uri"] == "skill://perf-analysis/SKILL.md"
    for alias in ("trace-analysis/comparison", "skill://trace-analysis/references/comparison.md"):
        r = await client.call_tool("get_guide", {"topic": alias})
        assert not r.is_error and r.structured_content["topic"] == "trace-analysis/comparison"
    r = await client.call_tool("get_guide", {"topic": "nope"})
    assert r.is_error and "remote-slurm" in r.content[0].text and "profile-capture/torch-profiler" in r.content[0].text
