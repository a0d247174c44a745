"""Readiness probes: a replica is ready when /health says 200 *and* a real chat completion answers.

Control-plane HTTP (httpx, imported when a probe first runs: a job process imports this module for
:func:`key_refused` alone); short timeouts; never raises for a replica that is merely not up yet.
"""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


@functools.cache
def http_client() -> httpx.Client:
    """The process's control-plane HTTP client. One for every probe: ``httpx.get`` builds a client,
    and its TLS context, per call (~50 ms of CPU), which a watchdog probing every 2 s paid forever.
    No kept-alive connections: a probe always reaches the engine as it is now (a replica restarted
    on the same port, an LB that closed an idle connection), never a stale socket."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe: ok, and a short reason when not."""

    ok: bool
    detail: str = ""


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_health(
    base_url: str, path: str = "/health", timeout_s: float = 5.0, api_key: str | None = None
) -> ProbeResult:
    """GET ``base_url + path`` (with the key: a closed swarm refuses every route without it); ok on HTTP 200."""
    import httpx

    try:
        resp = http_client().get(base_url.rstrip("/") + path, headers=_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as exc:
        return ProbeResult(False, f"{type(exc).__name__}: {exc}")
    return ProbeResult(resp.status_code == 200, f"HTTP {resp.status_code}")


def check_answer(base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0) -> ProbeResult:
    """One real answer from ``model``: a tiny chat completion, ok when it returns a choice. An endpoint
    with no chat route (an embedding model: vLLM's ``--runner pooling``, a TEI server) answers 404 or
    405 to it; then one tiny embeddings request, ok when it returns a vector."""
    import httpx

    chat = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "temperature": 0}
    embed = {"model": model, "input": "ping"}
    for route, body, field in (("chat/completions", chat, "choices"), ("embeddings", embed, "data")):
        try:
            resp = http_client().post(
                f"{base_url.rstrip('/')}/v1/{route}", json=body, headers=_headers(api_key), timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            return ProbeResult(False, f"{type(exc).__name__}: {exc}")
        if resp.status_code in (404, 405) and route == "chat/completions" and _no_route(resp):
            continue  # no chat here: is it an embedding endpoint?
        if resp.status_code != 200:
            return ProbeResult(False, f"HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            ok = bool(resp.json().get(field))
        except (ValueError, AttributeError):
            return ProbeResult(False, "response is not a JSON object")
        return ProbeResult(ok, "" if ok else f"no {field} in the {route} response")
    return ProbeResult(False, "HTTP 404: neither /v1/chat/completions nor /v1/embeddings")


def _no_route(resp: Any) -> bool:
    """A 404/405 that says the route is missing (``{"detail": "Not Found"}``, an empty or HTML body),
    not that the model is unknown (OpenAI's and vLLM's ``{"error": {...}}``)."""
    try:
        body = resp.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and "error" in body)


def key_refused(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """One GET of ``/v1/models`` with ``api_key`` (none when None): ``"HTTP 401"``/``"HTTP 403"`` when the
    swarm refuses the key (or its absence), else None. Whether the swarm is up is not this probe's
    business: an unreachable swarm answers None here and is waited for by the job.

    The standard library's client (as the metrics scrape's): every job process asks this once, and
    importing httpx (which imports its command line's rich and click) would cost each ~0.2 s of CPU."""
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models", headers=_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}" if exc.code in (401, 403) else None
    except (OSError, ValueError):  # refused, timed out, reset, no such host: not this probe's business
        return None
