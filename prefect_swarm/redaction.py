"""What prefect-swarm masks in text it did not write itself (an engine's log, say) before keeping it.

    redact('INFO: "GET /v1/models?key=sk-123 HTTP/1.1" 200', secrets=["sk-123"])
    -> 'INFO: "GET /v1/models?*** HTTP/1.1" 200'

The rules: the value of any secret handed in (a swarm's API key, a token from the environment);
a URL's user-info (``https://user:pw@host`` -> ``https://***@host``); the query string of an HTTP
request line as access logs print it (a key sent as ``?api_key=`` lands there); the value after an
``Authorization``-like header name or a ``Bearer`` scheme. Stdlib only: it runs in the watchdog
beside each engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "***"
"""What a secret is replaced with."""

_MIN_SECRET = 6
"""Shorter values are not masked by value (``"1"`` would mask every digit); the patterns still apply."""

_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]+@")
_REQUEST_QUERY = re.compile(r"(\"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS|CONNECT|TRACE) [^\s?\"]*)\?[^\s\"]*")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key)([\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|basic|token)\s+)?[^\s\"',;}]+"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{4,}")
_SECRET_ENV_NAME = re.compile(r"(?i)(token|secret|passw(or)?d|api_?key|_key$|credential)")


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of ``env`` whose names say they are secret (``*_TOKEN``, ``*SECRET*``, ``*_KEY``, ...)."""
    return [v for k, v in env.items() if _SECRET_ENV_NAME.search(k) and len(v) >= _MIN_SECRET]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret value and every secret-shaped part masked (see the module docstring)."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = _REQUEST_QUERY.sub(rf"\g<1>?{MASK}", text)
    text = _AUTH_HEADER.sub(rf"\g<1>\g<2>{MASK}", text)
    return _BEARER.sub(rf"\g<1> {MASK}", text)
