"""Running the MCP server: stdio or streamable HTTP, a prompt exit on SIGTERM/SIGINT, a token off loopback.

Why a busy server used to ignore SIGTERM/SIGINT: tool calls run in anyio worker threads, which are
not daemon threads, and a DuckDB query or a profile load in one of them cannot be cancelled. Over
HTTP, uvicorn's graceful shutdown waited for the running call; over stdio, asyncio's SIGINT handling
cancelled the main task and then waited for that thread and for the thread blocked reading stdin;
the interpreter joins such threads at exit as well. Now gpuscope watches the signals itself: it runs
the registered shutdown callbacks (child processes; gpuscope.tools.model.lifecycle) and ends the
process without joining those threads — at once over stdio, and over HTTP after at most
EXIT_GRACE_S of uvicorn's graceful shutdown (idle servers close their sessions cleanly).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import signal
import socket
import threading
from typing import Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope.tools.model import lifecycle
from gpuscope.tools.model.errors import ProfileError

log = logging.getLogger("gpuscope")

EXIT_GRACE_S = 1.0
MAX_BODY_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE  # 4 MiB: a tool call is a few hundred bytes
TOKEN_ENV = "GPUSCOPE_TOKEN"
MIN_TOKEN_CHARS = 16
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # what an Authorization header carries unchanged
_LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
_MAKE_TOKEN = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def _exit_now(signum: int) -> None:
    """Stop child processes, then end the process without joining worker threads stuck in a query."""
    lifecycle.shutdown()
    os._exit(128 + signum)


async def _watch_signals(on_signal: Callable[[int], None]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            on_signal(signum)


def _run(serve: Callable, on_signal: Callable[[int], None]) -> None:
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            # Signal handlers can only be set from the main thread, and asyncio has them only on POSIX.
            if threading.current_thread() is threading.main_thread() and os.name == "posix":
                tg.start_soon(_watch_signals, on_signal)
            await serve()
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        lifecycle.shutdown()


def run_stdio(server: MCPServer) -> None:
    # No graceful path: the SDK's stdin reader blocks in a thread until the host closes the pipe.
    _run(server.run_stdio_async, _exit_now)


# ------------------------------------------------------------------------------------------ HTTP


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(host: str, token: str | None) -> str | None:
    """The token to enforce, or None on loopback without one; refuses a non-loopback bind without a token."""
    if token is not None:
        if len(token) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.fullmatch(token):
            raise ProfileError(f"the HTTP token must be at least {MIN_TOKEN_CHARS} printable ASCII characters without "
                               f"spaces. Generate one with: {_MAKE_TOKEN}")
        return token
    if is_loopback(host):
        return None
    raise ProfileError(f"refusing to serve HTTP on {host} without a token: anyone who can reach that address could "
                       f"read every profile this user can read. Pass --token or set {TOKEN_ENV} (generate one with: "
                       f"{_MAKE_TOKEN}); clients then send 'Authorization: Bearer <token>'. Or bind 127.0.0.1 "
                       "(the default) and reach it through an SSH tunnel.")


def _host_names(host: str) -> list[str]:
    """Names clients may put in the Host header for a non-loopback bind (a wildcard bind: this machine's)."""
    bare = host.strip("[]")
    if bare not in ("0.0.0.0", "::"):
        return [bare]
    names = [socket.gethostname()]
    try:
        names += sorted({info[4][0] for info in socket.getaddrinfo(names[0], None)})
    except OSError:  # the hostname does not resolve: clients must use it by name
        pass
    return names


def security_settings(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection: Host and Origin must name this server (the SDK answers 421 / 403)."""
    hosts = list(_LOOPBACK_HOSTS)
    if not is_loopback(host):
        hosts += [f"[{n}]" if ":" in n else n for n in _host_names(host)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for name in hosts for h in (name, f"{name}:*")],
        allowed_origins=[o for name in hosts for scheme in ("http", "https")
                         for o in (f"{scheme}://{name}", f"{scheme}://{name}:*")])


class BearerTokenGate:
    """ASGI middleware: every request must carry `Authorization: Bearer <token>`, else 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(token.encode()).digest()

    def _authorized(self, scope: Scope) -> bool | None:
        """True, False (a wrong token) or None (no bearer token at all)."""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, supplied = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    # Digests of equal length: the comparison leaks neither the content nor the length.
                    return hmac.compare_digest(hashlib.sha256(supplied.strip()).digest(), self._digest)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        ok = self._authorized(scope)
        if ok:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket endpoint exists; refuse before accepting
            await send({"type": "websocket.close", "code": 1008})
            return
        challenge = 'Bearer realm="gpuscope"' + ('' if ok is None else ', error="invalid_token"')
        body = (b"missing bearer token: send 'Authorization: Bearer <token>'" if ok is None
                else b"invalid bearer token")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"www-authenticate", challenge.encode()), (b"content-type", b"text/plain"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def run_http(server: MCPServer, host: str, port: int, token: str | None) -> None:
    import uvicorn

    token = check_token(host, token)  # before anything binds
    app: ASGIApp = server.streamable_http_app(host=host, transport_security=security_settings(host),
                                              max_request_body_size=MAX_BODY_BYTES)
    if token is not None:
        app = BearerTokenGate(app, token)

    class Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # gpuscope handles SIGTERM/SIGINT itself (module docstring)
            yield

    web = Uvicorn(uvicorn.Config(app, host=host, port=port, log_level=server.settings.log_level.lower()))
    stopping: list[int] = []

    def on_signal(signum: int) -> None:
        if stopping:  # a second signal: no more grace
            _exit_now(signum)
        stopping.append(signum)
        lifecycle.shutdown()
        web.should_exit = True
        timer = threading.Timer(EXIT_GRACE_S, _exit_now, (signum,))
        timer.daemon = True
        timer.start()

    _run(web.serve, on_signal)
    if stopping:  # graceful shutdown finished in time; worker threads may still hold a query
        _exit_now(stopping[0])
