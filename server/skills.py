"""Bundled skills served through MCP: resources, prompts and the get_guide tool.

Files live in the package (`gpuscope/skills/<name>/SKILL.md`, `.../references/*.md`), so the same
lookup works from the editable checkout and from an installed wheel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resources import TextResource
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

import gpuscope

SKILLS_DIR = Path(gpuscope.__file__).parent / "skills"


def skill_names() -> list[str]:
    return sorted(p.parent.name for p in SKILLS_DIR.glob("*/SKILL.md"))


def topics() -> dict[str, Path]:
    """Topic -> file: '<skill>' for SKILL.md, '<skill>/<reference stem>' for each reference."""
    out: dict[str, Path] = {}
    for name in skill_names():
        out[name] = SKILLS_DIR / name / "SKILL.md"
        for ref in sorted((SKILLS_DIR / name / "references").glob("*.md")):
            out[f"{name}/{ref.stem}"] = ref
    return out


def read(topic: str) -> str:
    return topics()[topic].read_text(encoding="utf-8")


def body(name: str) -> str:
    """SKILL.md without its YAML frontmatter."""
    text = read(name)
    if text.startswith("---"):
        end = text.find("\n---", 3)
        if end != -1:
            text = text[end + 4:]
    return text.strip()


def frontmatter(name: str) -> dict[str, str]:
    text = read(name)
    out: dict[str, str] = {}
    if text.startswith("---"):
        for line in text[3:text.find("\n---", 3)].splitlines():
            if ":" in line:
                key, _, value = line.partition(":")
                out[key.strip()] = value.strip()
    return out


class GuideResult(BaseModel):
    topic: str = Field(description="the guide returned")
    uri: str = Field(description="the same text as an MCP resource")
    text: str = Field(description="markdown of the guide")
    topics: list[str] = Field(description="every available topic")


def _uri(topic: str) -> str:
    skill, _, ref = topic.partition("/")
    return f"skill://{skill}/references/{ref}.md" if ref else f"skill://{skill}/SKILL.md"


def register(server: MCPServer, read_only: ToolAnnotations | None = None) -> None:
    for topic, path in topics().items():
        skill = topic.split("/")[0]
        desc = frontmatter(skill).get("description", "") if "/" not in topic else f"{skill} reference: {path.stem}"
        server.add_resource(TextResource(uri=_uri(topic), name=topic, title=f"gpuscope guide: {topic}",
                                         description=desc[:300], mime_type="text/markdown",
                                         text=path.read_text(encoding="utf-8")))

    @server.prompt(title="Analyze a GPU profile")
    def analyze_trace(trace: str) -> str:
        """Analyze one GPU profile (Nsight SQLite, rocpd, PyTorch trace) with the trace-analysis playbook."""
        return (f"Analyze the GPU profile `{trace}` with the gpuscope tools, following this playbook. "
                f"Classify the bottleneck and report as described in the perf-analysis skill "
                f"(Summary, Metrics, Findings, Recommendations; every number names its tool).\n\n"
                f"{body('trace-analysis')}")

    @server.prompt(title="Compare two GPU profiles")
    def compare_traces(baseline: str, candidate: str) -> str:
        """Compare a candidate profile against a baseline (reference) profile."""
        return (f"Compare the candidate profile `{candidate}` against the baseline `{baseline}` with the "
                f"gpuscope tools: start with the `compare_traces` tool (baseline=`{baseline}`, candidate=`{candidate}`), "
                f"then use the same steady window definition on both, explain the step-time "
                f"delta by class and then by kernel/op, and keep the framing neutral.\n\n"
                f"{body('trace-analysis')}\n\n{read('trace-analysis/comparison')}")

    @server.prompt(title="Delegate GPU profiling")
    def delegate_profiling(workload: str, goal: str, cluster: str = "") -> str:
        """Write a delegation prompt for a profiling specialist (optionally on a Slurm cluster)."""
        parts = [f"Goal: {goal}\nWorkload: {workload}\n",
                 "Write the delegation prompt for a profiling specialist following the rules below: describe the "
                 "outcome, workload, problem sizes, FLOP counts and wanted metrics — never tool flags, fallback "
                 "recipes or output paths.\n",
                 read("perf-analysis/delegation")]
        if cluster.strip():
            parts += [f"Remote Execution Context (pass verbatim):\n{cluster}\n"
                      "If this is only a cluster name or a list of settings, render the block first with the "
                      "`remote_context` tool (cluster=<name> from clusters.toml, or the fields as arguments) and pass "
                      "its markdown.", body("remote-slurm")]
        # The capture recipe (flags, exports, output names) is the specialist's: point to it, do not inline it,
        # or it ends up in the delegation prompt against the rules above.
        parts.append("The specialist owns the capture commands: tell it to follow the `profile-capture` playbook "
                     "(Claude Code skill `profile-capture`, or the `get_guide` tool with topic 'profile-capture'), "
                     "and ask for the profile path(s) back, checked with `trace_info` and `iterations`.")
        return "\n\n".join(parts)

    annotations = read_only or ToolAnnotations(read_only_hint=True, idempotent_hint=True,
                                               open_world_hint=False, destructive_hint=False)

    @server.tool(annotations=annotations, title="Playbook / guide")
    async def get_guide(
        topic: Annotated[str, Field(description="Skill name (perf-analysis, trace-analysis, remote-slurm, "
                                                "profile-capture) or '<skill>/<reference>'")],
    ) -> Annotated[CallToolResult, GuideResult]:
        """Return a bundled playbook as markdown: how to analyse a profile, classify bottlenecks, delegate
        profiling, capture profiles, run on Slurm. Cheap; no profile is read."""
        available = list(topics())
        key = topic.strip().removeprefix("skill://").removesuffix(".md").removesuffix("/SKILL")
        key = key.replace("/references/", "/")
        if key not in available:
            raise ToolError(f"unknown topic {topic!r}; topics: {', '.join(available)}")
        result = GuideResult(topic=key, uri=_uri(key), text=read(key), topics=available)
        return CallToolResult(content=[TextContent(type="text", text=result.text)],
                              structured_content=result.model_dump(mode="json"))
