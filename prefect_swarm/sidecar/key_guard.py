"""ASGI middleware that refuses every request without the swarm's API key: a closed vLLM replica.

vLLM's own ``--api-key`` guards ``/v1/*`` only: ``/invocations``, ``/tokenize``, ``/metrics``,
``/docs``, ``/health`` and the rest answer anyone. A closed Slurm swarm starts vLLM with
``--middleware psw_key_guard.KeyGuard`` (backends/slurm/render.py): this file, copied into the run
dir as ``psw_key_guard.py`` and put on the engine's ``PYTHONPATH``, wraps the whole application, so
every HTTP route (mounts such as ``/metrics`` included) answers 401 without
``Authorization: Bearer <key>`` and every websocket is closed.

The key comes from the engine's environment (``VLLM_API_KEY``, else ``PREFECT_SWARM_API_KEY``),
never from a file or a command line. Without a key the engine does not start: a guard that lets
everything through would be worse than none. Standard library only: it is imported by the engine's
interpreter, which need not have prefect-swarm installed.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = ("VLLM_API_KEY", "PREFECT_SWARM_API_KEY")
"""Where the key is read from, first found wins (the names engine_secret_env sets)."""

REFUSED = b'{"error":"Unauthorized"}'
"""The body of a refusal (vLLM's own 401 body)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def expected_header(environ: MutableMapping[str, str] | None = None) -> bytes:
    """``Bearer <key>`` as bytes; RuntimeError when no key is set."""
    env = os.environ if environ is None else environ
    for name in KEY_ENV:
        if env.get(name):
            return f"Bearer {env[name]}".encode()
    raise RuntimeError(f"psw_key_guard: none of {', '.join(KEY_ENV)} is set; refusing to serve without a key")


class KeyGuard:
    """Wraps an ASGI app: HTTP and websocket scopes need the key; lifespan passes through."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.expected = expected_header()

    def allowed(self, scope: Scope) -> bool:
        """True when the request carries the right ``Authorization`` header (compared in constant time)."""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(REFUSED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": REFUSED})
