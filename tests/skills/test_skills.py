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


PLUGIN_WILDCARD = "mcp__plugin_gpuscope_gpuscope__*"   # the same tools when served by the Claude Code plugin
YAML_UNSAFE = re.compile(r": | #|^[\[\]{}&*!|>'\"%@`,?-]")  # would break or change a plain YAML scalar


def _schema_props(schema, out: set[str]) -> set[str]:
    """Every property name (and string enum value) anywhere in a JSON schema, $defs included."""
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k == "properties" and isinstance(v, dict):
                out.update(v)
            elif k in ("enum", "const"):
                out.update(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str))
            _schema_props(v, out)
    elif isinstance(schema, list):
        for v in schema:
            _schema_props(v, out)
    return out


def _raw_frontmatter(name: str) -> list[str]:
    text = S.read(name)
    assert text.startswith("---\n"), name
    end = text.index("\n---\n", 3)
    return text[4:end].splitlines()


def _allowed(name: str) -> list[str]:
    return S.frontmatter(name)["allowed-tools"].split()


def _backticked_tools(text: str, tools) -> set[str]:
    out = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        head = re.match(r"[a-z_]+", span)
        if head and head.group(0) in tools:
            out.add(head.group(0))
    return out


def test_frontmatter_and_sizes():
    assert set(S.skill_names()) == EXPECTED
    for name in S.skill_names():
        # One `key: value` line per field, plain scalars a YAML parser reads back unchanged.
        lines = _raw_frontmatter(name)
        keys = [line.partition(":")[0] for line in lines]
        assert keys and len(keys) == len(set(keys)) and set(keys) <= {"name", "description", "allowed-tools",
                                                                      "license", "compatibility", "metadata"}, name
        assert {"name", "description", "allowed-tools"} <= set(keys), name
        for line in lines:
            key, sep, value = line.partition(": ")
            assert sep and value.strip() == value and value and not YAML_UNSAFE.search(value), (name, key)
        fm = S.frontmatter(name)
        assert fm["name"] == name and NAME_RE.match(name) and len(name) <= 64
        assert 50 <= len(fm["description"]) <= 1024, name
        assert "use when" in fm["description"].lower() and '"' in fm["description"], name   # trigger phrases
        tools = _allowed(name)
        assert tools and len(tools) == len(set(tools)), name
        assert all(t.startswith("mcp__gpuscope__") or t == PLUGIN_WILDCARD for t in tools), name
        assert PLUGIN_WILDCARD in tools, name
        # Cheap to load: the Agent Skills limit is < 500 lines / ~5k tokens; ours stay far below.
        assert len(S.read(name).splitlines()) < 200 and len(S.read(name).encode()) < 12_000, name
    for topic, path in S.topics().items():
        assert len(path.read_text().encode()) < 20_000, topic
    assert all(S.topics()[n].parent.name == n for n in S.skill_names())
    assert any("/" in t for t in S.topics())                                          # references are split out


async def test_allowed_tools_exist_and_cover_the_body(client):
    tools = {t.name for t in (await client.list_tools()).tools}
    for name in S.skill_names():
        allowed = {t.removeprefix("mcp__gpuscope__") for t in _allowed(name) if t != PLUGIN_WILDCARD}
        assert allowed <= tools, (name, allowed - tools)
        # Every tool the SKILL.md tells the agent to call is pre-approved (else the host asks each time).
        named = _backticked_tools(S.body(name), tools)
        assert named <= allowed, (name, named - allowed)
    # The coordinating and analysis skills can reach every analysis tool.
    for name in ("perf-analysis", "trace-analysis"):
        allowed = {t.removeprefix("mcp__gpuscope__") for t in _allowed(name)}
        assert tools - {"remote_context"} <= allowed, (name, tools - allowed)


def test_required_topics_are_covered():
    def text(skill: str) -> str:
        return "\n".join(S.read(t) for t in S.topics() if t.split("/")[0] == skill).lower()

    perf, trace, slurm, capture = (text(n) for n in ("perf-analysis", "trace-analysis", "remote-slurm", "profile-capture"))
    for step in ("understand", "plan", "delegate", "measure", "classify", "report"):
        assert f"**{step}" in perf, step
    for cls in ("compute", "memory", "launch overhead", "communication", "synchronization"):
        assert f"| {cls}" in perf, cls                                                   # a row of the class table
    for section in ("summary", "metrics", "findings", "recommendations"):
        assert f"## {section}" in text("perf-analysis").split("# report template")[1], section   # the example
    for never in ("tool flags", "fallback recipes", "output paths"):
        assert never in perf, never
    for must in ("flop count", "problem sizes", "metrics wanted"):
        assert must in perf, must
    for must in ("compare_traces", "diagnose", "neutral", "fusion", "kernel-only", "impact range", "replay_spec",
                 "bank conflicts", "occupancy", "efficiency thresholds"):
        assert must in trace, must
    for field in ("login_host", "ssh_options", "launcher", "partition", "account", "nodes", "gpus_per_node", "time",
                  "container_image", "container_mounts", "modules", "workdir"):
        assert re.search(rf"^  {field}: ", S.read("remote-slurm"), re.M), field         # a line of the block
    for must in ("srun", "sbatch", "nsys", "ncu", "rocprofv3", "nvidia-smi", "remote_context", "comes back"):
        assert must in slurm, must
    for must in ("-t cuda,nvtx,osrt", "--type sqlite", "--sys-trace", "--output-format rocpd", "record_shapes=true",
                 "with_stack=true", "warm", "record_function", "schedule("):
        assert must in capture, must


def test_slurm_block_fields_match_remote_context():
    """The block the skill documents uses the remote_context tool's field names, no more, no less."""
    from gpuscope.tools.remote_context import FIELDS

    block = S.read("remote-slurm").split("Remote Execution Context\n", 1)[1].split("```", 1)[0]
    documented = re.findall(r"^  ([a-z_]+):", block, re.M)
    assert documented == list(FIELDS)


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
            dotted = re.fullmatch(r"([a-z_]+)((?:\.[a-z_]+)+)", span)
            if dotted and dotted.group(1) in tools:                      # `tool.field[.subfield]`
                for part in dotted.group(2).split(".")[1:]:
                    assert part in fields[dotted.group(1)], (topic, span, part)
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
    args = {n: {a.name: a.required for a in prompts[n].arguments or []} for n in prompts}
    assert args["analyze_trace"] == {"trace": True}
    assert args["compare_traces"] == {"baseline": True, "candidate": True}
    assert args["delegate_profiling"] == {"workload": True, "goal": True, "cluster": False}
    txt = (await client.get_prompt("analyze_trace", {"trace": "run1.sqlite"})).messages[0].content.text
    assert "run1.sqlite" in txt and "trace_info" in txt and "---\nname:" not in txt
    txt = (await client.get_prompt("compare_traces", {"baseline": "a.sqlite", "candidate": "b.db"})).messages[0].content.text
    assert "a.sqlite" in txt and "b.db" in txt and "Cross-platform" in txt
    assert "`compare_traces` tool" in txt
    txt = (await client.get_prompt("delegate_profiling", {"workload": "train.py", "goal": "faster"})).messages[0].content.text
    assert "train.py" in txt and "faster" in txt and "Remote Execution Context (pass" not in txt
    assert "never tool flags" in txt and "get_guide" in txt and "profile-capture" in txt
    assert "cuda,nvtx,osrt" not in txt and "--sys-trace" not in txt          # no capture flags for the coordinator
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


UNTRUSTED_RULE = re.compile(r"untrusted\s+data.*?never\s+instructions", re.S | re.I)


async def test_skills_and_instructions_say_profile_text_is_data(client):
    """Kernel names, NVTX text, op names, stacks and paths can carry prompt injections: every playbook says so."""
    for name in [*S.skill_names(), "instructions"]:
        text = " ".join((client.instructions if name == "instructions" else S.body(name)).split())
        rule = UNTRUSTED_RULE.search(text)
        assert rule, name
        sentence = text[max(0, rule.start() - 200):rule.end()].lower()   # the rule names what it covers
        for what in ("kernel names", "marker", "op names", "call stacks", "paths"):
            assert what in sentence, (name, what)
