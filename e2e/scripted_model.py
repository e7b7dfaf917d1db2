"""A scripted stand-in for the Anthropic Messages API, so `make e2e` can drive a real Claude Code
session offline: `claude -p "analyze this trace ..."` with ANTHROPIC_BASE_URL pointing here.

It is not a model and decides nothing about the profile. It plays the opening moves the
trace-analysis skill prescribes (invoke the skill, then trace_info, then diagnose) so that the
parts we own are exercised by the real host: Claude Code must list our skill to the model, load
its SKILL.md when invoked, expose our MCP tools and return their results. Every request Claude
Code sends is appended to a JSONL log; `check` then asserts on what the host actually sent.

    python scripted_model.py serve PORT LOG PROFILE      # until killed
    python scripted_model.py check LOG EXPECTED_CLASS SKILL_MD   # exit 1 with the reasons if a check fails
"""

from __future__ import annotations

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SKILL = "trace-analysis"  # "gpuscope:trace-analysis" when it comes from the plugin
TOOLS = ("trace_info", "diagnose")  # mcp__gpuscope__<tool>, or mcp__plugin_gpuscope_gpuscope__<tool> from the plugin


def _texts(content) -> list[str]:
    """Every text inside a message's content, tool results included."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for block in content or []:
        if block.get("type") == "text":
            out.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            out += _texts(block.get("content"))
    return out


def _tool_uses(req: dict) -> list[str]:
    """Names of the tools this conversation has already called, in order."""
    return [b["name"] for m in req.get("messages", []) if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"] if b.get("type") == "tool_use"]


def _our_tool(tools: set[str], short: str) -> str | None:
    return next((t for t in sorted(tools) if re.fullmatch(rf"mcp__(gpuscope|plugin_gpuscope_gpuscope)__{short}", t)), None)


def _skill_name(req: dict) -> str | None:
    """The trace-analysis skill as Claude Code lists it to the model (plain, or plugin-namespaced)."""
    listing = "\n".join(t for m in req.get("messages", []) for t in _texts(m.get("content")))
    found = re.search(rf"^- ((?:gpuscope:)?{SKILL}): ", listing, re.M)
    return found.group(1) if found else None


def next_move(req: dict, profile: str) -> dict:
    """The next content block: a tool_use from the script, or the closing text."""
    tools = {t.get("name") for t in req.get("tools") or []}
    done = _tool_uses(req)
    skill = _skill_name(req)
    if "Skill" in tools and skill and "Skill" not in done:
        return {"type": "tool_use", "name": "Skill", "input": {"skill": skill}}
    for name in filter(None, (_our_tool(tools, short) for short in TOOLS)):
        if name not in done:
            return {"type": "tool_use", "name": name, "input": {"trace": profile}}
    return {"type": "text", "text": f"scripted session finished after {len(done)} tool calls: {', '.join(done) or 'none'}"}


class Handler(BaseHTTPRequestHandler):
    profile = ""
    log_path = ""
    calls = 0

    def do_POST(self):  # noqa: N802 (http.server API)
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            req = json.loads(body or b"{}")
        except json.JSONDecodeError:
            req = {}
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"path": self.path, "request": req}) + "\n")
        if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
            return self._json({"input_tokens": 100})
        # Side requests (titles, summaries) carry no tools: answer them with plain text.
        block = next_move(req, self.profile) if req.get("tools") else {"type": "text", "text": "gpuscope trace analysis"}
        Handler.calls += 1
        if block["type"] == "tool_use":
            block["id"] = f"toolu_scripted_{Handler.calls}"
        stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
        message = {"id": f"msg_scripted_{Handler.calls}", "type": "message", "role": "assistant",
                   "model": req.get("model", "scripted"), "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 10}}
        if not req.get("stream"):
            return self._json({**message, "content": [block], "stop_reason": stop})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self._event("message_start", {"type": "message_start", "message": message})
        if block["type"] == "tool_use":
            start = {k: block[k] for k in ("type", "id", "name")} | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        self._event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
        self._event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
        self._event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 10}})
        self._event("message_stop", {"type": "message_stop"})

    def do_GET(self):  # noqa: N802
        self.send_response(404)
        self.end_headers()

    def _json(self, obj: dict) -> None:
        out = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _event(self, name: str, data: dict) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


def check(log_path: str, expected_class: str, skill_md: str) -> list[str]:
    """What the host sent, checked: the problems found (empty when the session went as scripted)."""
    reqs = [json.loads(line)["request"] for line in open(log_path, encoding="utf-8")]
    main = [r for r in reqs if r.get("tools")]
    if not main:
        return ["Claude Code sent no request with tools"]
    last = max(main, key=lambda r: len(r.get("messages", [])))
    problems = []
    if _skill_name(main[0]) is None:
        problems.append(f"the {SKILL} skill is not in the skill list Claude Code gave the model")
    names = {t.get("name") for t in last.get("tools", [])}
    problems += [f"gpuscope's {short} not offered to the model" for short in TOOLS if _our_tool(names, short) is None]
    results = {}  # tool_use id -> (name, text, is_error)
    uses = {b["id"]: b["name"] for m in last["messages"] if m.get("role") == "assistant" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"}
    for m in last["messages"]:
        if m.get("role") == "user" and isinstance(m["content"], list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    results[uses.get(b["tool_use_id"])] = ("\n".join(_texts(b.get("content"))), bool(b.get("is_error")))
    body = open(skill_md, encoding="utf-8").read().split("---", 2)[2].strip()
    sent = "\n".join(t for m in last["messages"] for t in _texts(m.get("content")))
    if body[:400] not in sent:
        problems.append(f"the body of {skill_md} never reached the model")
    for short in TOOLS:
        text, err = results.get(_our_tool(names, short), ("", True))
        if err or not text:
            problems.append(f"{short}: no successful result ({text[:300]!r})")
    diag = results.get(_our_tool(names, "diagnose"), ("", True))[0]
    try:
        first = json.loads(diag)["findings"][0]["bottleneck"]
    except (ValueError, KeyError, IndexError, TypeError):
        first = None
    if first != expected_class:
        problems.append(f"diagnose ranked {first!r} first, expected {expected_class!r}: {diag[:300]!r}")
    return problems


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        Handler.profile, Handler.log_path = sys.argv[4], sys.argv[3]
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
    elif sys.argv[1:2] == ["check"]:
        found = check(sys.argv[2], sys.argv[3], sys.argv[4])
        print("\n".join(found) if found else "scripted Claude Code session: skill listed and loaded, tools called, results returned")
        sys.exit(1 if found else 0)
    else:
        sys.exit(__doc__)
