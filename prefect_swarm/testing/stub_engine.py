"""A fast, deterministic OpenAI-compatible stub engine, for speed tests and benchmarks.

    python -m prefect_swarm.testing.stub_engine --port 8000 [--latency-ms 50] [--error-rate 0.2]

Raw asyncio HTTP/1.1 (keep-alive, Content-Length bodies): ~tens of thousands of requests/s on one core,
so benchmarks measure the client, not the server. Routes: ``GET /health``, ``GET /v1/models``,
``GET /stats`` (request counters as JSON), ``GET /metrics`` (vLLM-shaped Prometheus text: running and
waiting requests, KV cache usage, prompt and generation tokens), ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``.

Answers are a pure function of the request body (same prompt, same answer; token counts from the
prompt's length), so two runs of a job produce identical outputs. Fault knobs draw from one seeded
random stream: ``--error-rate`` (500/503), ``--rate-429`` (429 with Retry-After), ``--timeout-rate``
(never answers), ``--truncate-rate`` (a 200 whose body is cut by closing the connection),
``--stall-body-rate`` (a 200 whose body stops halfway: the client's read times out),
``--storm-429-s S --storm-429-period-s P`` (every completion in the first S seconds of each P
seconds is a 429 with Retry-After), ``--exit-after N`` (the process dies after N completions:
watchdog tests, a replica dying mid-job), ``--startup-delay-s`` (health is 503 until then),
``--api-key`` (401 without it, on every route), ``--invalid-json-rate`` (the answer to a request with a
``response_format`` is not valid JSON, or misses a required field: structured-output retries),
``--require-ray-nodes K`` (health is 503 until the local Ray cluster has K alive nodes: multi-node tests),
``--ignore-n`` (one choice whatever OpenAI's ``n`` asks, as an engine that does not serve it),
``--broken-prompt REGEX --broken-form FORM`` (every answer to a request whose prompt matches is a 200
with a broken body: one of :data:`BROKEN_FORMS`, as a misbehaving proxy or a dying replica sends).

Like an engine, it refuses with a 400 and an OpenAI error body (``{"error": {"message", "type",
"param", "code"}}``): a ``temperature`` outside 0..2, ``max_tokens`` above ``--max-model-len``,
``stream: true``, and message parts that are not OpenAI's shape (``text``; ``image_url`` with an
http(s) URL or a ``data:image/...;base64,`` URL whose data decodes). A request with
``response_format`` ``json_schema`` is answered with JSON that follows the schema (``json_object``:
a small JSON object); the answer of a request with images says how many it saw (``images=N``).

It is never the only engine a feature is tested with: see the vLLM-marked tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect_swarm.interfaces.jobenv import API_KEY, env_value

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""POST routes that generate (subject to the fault knobs)."""

ROUTES = ("/health", "/stats", "/metrics", "/v1/models", *COMPLETION_PATHS)
"""Every route the stub serves (the security tests try each without the key)."""

BROKEN_FORMS = ("html", "empty", "no-choices", "truncated-json", "array", "cut")
"""Broken 200s (``--broken-form``): an HTML page, an empty body, JSON without ``choices`` (an embedding
without ``data``), JSON cut in half (a whole HTTP message), a JSON array, and a body cut by closing
the connection (its ``Content-Length`` says the whole answer, 16 bytes of it are sent)."""
BROKEN_HTML = (
    b"<html><head><title>502 Bad Gateway</title></head>"
    b"<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>"
)

_REASONS = {
    200: b"OK",
    401: b"Unauthorized",
    404: b"Not Found",
    400: b"Bad Request",
    429: b"Too Many Requests",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass
class StubOptions:
    """Knobs of the stub engine."""

    model: str = "stub-model"
    """Served model name (``--served-model-name``)."""
    latency_s: float = 0.0
    """Delay before every answer."""
    error_rate: float = 0.0
    """Share of 500/503 answers."""
    fail_while: str | None = None
    """A file: ``error_rate`` applies only while it exists (a test deletes it between two runs, so the
    rows that failed on the first run are answered on the retry by a stub started with the same flags)."""
    hold_while: str | None = None
    """A file: every answer waits while it exists (a test holds a job running for as long as it needs
    to look at it, then deletes the file and the answers go out)."""
    hold_prompt: str | None = None
    """A regex: ``hold_while`` holds only the answers to prompts it matches (a job's rows, not the
    readiness probe's ``ping``), so a swarm comes up while its job is held."""
    rate_429: float = 0.0
    """Share of 429 answers (with ``Retry-After: retry_after_s``)."""
    timeout_rate: float = 0.0
    """Share of requests never answered."""
    truncate_rate: float = 0.0
    """Share of 200s whose body is cut by closing the connection."""
    stall_body_rate: float = 0.0
    """Share of 200s whose body stops halfway (the client's read times out)."""
    storm_429_s: float = 0.0
    """Every completion in the first ``storm_429_s`` seconds of each period is a 429."""
    storm_429_period_s: float = 0.0
    """Period of those 429 storms."""
    retry_after_s: float = 0.0
    """``Retry-After`` of a 429."""
    exit_after: int | None = None
    """Exit (code 3) after this many good completions."""
    startup_delay_s: float = 0.0
    """``/health`` answers 503 for this long after start."""
    stop_delay_s: float = 0.0
    """After SIGTERM, keep serving this long before exiting (an engine that drains slowly); it then
    prints ``stub engine: stopped after TERM`` on stderr, so a test sees whether it was let finish."""
    api_key: str | None = None
    """Bearer token required on every request (401 without it)."""
    key_scope: str = "all"
    """Where ``api_key`` is required: ``all`` routes (a closed replica behind psw_key_guard), or ``v1``
    only (plain vLLM ``--api-key``, as a platform that guards the rest itself runs it)."""
    seed: int = 0
    """Seed of the fault knobs' random stream."""
    invalid_json_rate: float = 0.0
    """Share of answers to a ``response_format`` request that are not valid for it."""
    max_model_len: int = 4096
    """``max_tokens`` above this is a 400."""
    require_ray_nodes: int | None = None
    """``/health`` answers 503 until the local Ray cluster (``ray.init(address="auto")``, so
    ``RAY_ADDRESS``) reports this many alive nodes: a multi-node test cannot pass without the cluster."""
    ignore_n: bool = False
    """Answer one choice whatever OpenAI's ``n`` asks (an engine that does not serve ``n``)."""
    broken_prompt: str | None = None
    """A regex: every answer to a completion whose prompt text matches it is a broken 200 (``broken_form``);
    the same row is broken on every try, while every other row and ``/health`` are fine."""
    broken_form: str = "html"
    """Which broken 200 (one of :data:`BROKEN_FORMS`)."""
    started: float = field(default_factory=time.monotonic)
    """When the stub started (``time.monotonic``)."""


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _prompt_text(req: dict[str, Any]) -> str:
    if "messages" in req:
        parts = []
        for m in req.get("messages") or []:
            content = m.get("content", "")
            if isinstance(content, list):
                parts += [str(p.get("text", "")) for p in content if p.get("type") == "text"]
            else:
                parts.append(str(content))
        return " ".join(parts)
    prompt = req.get("prompt", req.get("input", ""))
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _bad_request(message: str, param: str | None) -> bytes:
    """An OpenAI error body (as vLLM writes one)."""
    error = {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    return json.dumps({"error": error, "object": "error"}).encode()


def check_request(req: dict[str, Any], max_model_len: int = 4096) -> bytes | None:
    """The 400 body an engine would answer ``req`` with, or None when it is fine."""
    temperature = req.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 2):
        return _bad_request(f"temperature must be in [0, 2], got {temperature!r}.", "temperature")
    max_tokens = req.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens > max_model_len:
        return _bad_request(
            f"max_tokens={max_tokens} is more than the model's context length ({max_model_len} tokens).",
            "max_tokens",
        )
    if req.get("stream"):
        return _bad_request("this stub engine does not stream.", "stream")
    for m in req.get("messages") or []:
        if isinstance(m.get("content"), list):
            for part in m["content"]:
                problem = _part_problem(part)
                if problem:
                    return _bad_request(problem, "messages")
    return None


def _part_problem(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
        return f"a content part must be {{type: text|image_url, ...}}, got {str(part)[:80]}"
    if part["type"] == "text":
        return None if isinstance(part.get("text"), str) else "a text part needs 'text'"
    url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
    if not isinstance(url, str):
        return "an image_url part needs image_url: {url: ...}"
    if url.startswith(("http://", "https://")):
        return None
    head, _, data = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64")):
        return f"image url must be http(s) or data:image/<type>;base64,..., got {url[:40]}"
    try:
        base64.b64decode(data, validate=True)
    except ValueError:
        return "image data URL is not valid base64"
    return None


def _images(req: dict[str, Any]) -> int:
    return sum(
        1
        for m in req.get("messages") or []
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    )


def schema_value(schema: dict[str, Any], seed: str, defs: dict[str, Any] | None = None) -> Any:
    """A value that follows the JSON schema ``schema`` (objects, arrays, scalars, enums, $ref, anyOf)."""
    defs = defs if defs is not None else schema.get("$defs") or schema.get("definitions") or {}
    if "$ref" in schema:
        return schema_value(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), seed, defs)
    if "enum" in schema:
        return schema["enum"][int(seed[:2], 16) % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return schema_value(options[0], seed, defs)
    typ = schema.get("type", "object")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    n = int(seed[:4], 16)
    if typ == "object":
        props = schema.get("properties") or {}
        return {k: schema_value(v, _digest((seed + k).encode()), defs) for k, v in props.items()}
    if typ == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        return [schema_value(schema.get("items") or {}, _digest(f"{seed}{i}".encode()), defs) for i in range(count)]
    lo = schema.get("minimum", 0)
    span = int(schema.get("maximum", lo + 99) - lo) + 1
    scalars: dict[str, Any] = {
        "string": f"s-{seed[:6]}",
        "integer": int(lo) + n % max(span, 1),
        "number": float(lo) + (n % max(span, 1)) * 0.5 if span > 1 else float(lo),
        "boolean": bool(n % 2),
        "null": None,
    }
    return scalars.get(typ, f"s-{seed[:6]}")


def structured_content(req: dict[str, Any], h: str) -> str | None:
    """The JSON text answering a request with ``response_format`` (None without one)."""
    fmt = req.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        return None
    if fmt["type"] == "json_object":
        return json.dumps({"answer": f"stub-{h}"})
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    return json.dumps(schema_value(schema, h))


def invalid_content(req: dict[str, Any], roll: float) -> str:
    """An answer that breaks the request's response_format: not JSON, or JSON lacking what it requires."""
    return '{"answer": "cut sho' if roll < 0.5 else json.dumps({"unexpected": True})


def answer(path: str, req: dict[str, Any], model: str, serve_n: bool = True) -> dict[str, Any]:
    """The deterministic response body for ``req`` on ``path`` (one choice whatever ``n`` asks when
    not ``serve_n``)."""
    text = _prompt_text(req)
    h = _digest(json.dumps(req, sort_keys=True).encode())[:12]
    prompt_tokens = max(1, len(text.split()))
    completion_tokens = min(int(req.get("max_tokens") or 16), 4 + int(h[:2], 16) % 12)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if path.startswith("/v1/embeddings"):
        vec = [int(h[i : i + 2], 16) / 255.0 for i in range(0, 12, 2)]
        return {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": vec}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    content = structured_content(req, h)
    if content is None:
        images = _images(req)
        content = f"stub-{h} " + " ".join(text.split()[:3]) + (f" images={images}" if images else "")
    n = int(req.get("n") or 1) if serve_n else 1  # OpenAI's n: n choices, each its own text; usage counts them all
    usage["completion_tokens"] *= n
    usage["total_tokens"] = prompt_tokens + usage["completion_tokens"]
    texts = [content] + [f"{content} #{i}" for i in range(1, n)]
    choices: list[dict[str, Any]]
    if path.startswith("/v1/completions"):
        choices = [{"index": i, "text": t, "finish_reason": "length"} for i, t in enumerate(texts)]
        obj = "text_completion"
    else:
        choices = [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
            for i, t in enumerate(texts)
        ]
        obj = "chat.completion"
    return {"id": f"stub-{h}", "object": obj, "created": 0, "model": model, "choices": choices, "usage": usage}


class StubProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection."""

    opts: StubOptions = StubOptions()
    stats: Counter[str] = Counter()
    rng: random.Random = random.Random(0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:])}
            clen = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + clen:
                return
            body = self.buf[end + 4 : end + 4 + clen]
            self.buf = self.buf[end + 4 + clen :]
            self.handle(method, path, headers, body)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        """Route one request. With ``--api-key`` every route (health, metrics and unknown paths too)
        answers 401 without ``Authorization: Bearer <key>``, as a closed vLLM replica does (psw_key_guard)."""
        opts, stats = self.opts, self.stats
        if self.refused(method, path, headers):
            return
        if path.startswith("/health"):
            ready = time.monotonic() - opts.started >= opts.startup_delay_s
            if ready and opts.require_ray_nodes:
                ready = RayNodes.alive >= opts.require_ray_nodes
            self.send(200 if ready else 503, b'{"status":"ok"}' if ready else b'{"status":"loading"}')
        elif path.startswith("/stats"):
            self.send(200, json.dumps(dict(stats)).encode())
        elif path.startswith("/metrics"):
            self.send(200, vllm_metrics(opts.model, stats).encode(), content_type="text/plain; version=0.0.4")
        elif path.startswith("/v1/models"):
            self.send(200, json.dumps({"object": "list", "data": [{"id": opts.model, "object": "model"}]}).encode())
        elif method == "POST" and path.startswith(COMPLETION_PATHS):
            self.complete(path, headers, body)
        else:
            self.send(404, b'{"error":{"message":"not found"}}')

    def refused(self, method: str, path: str, headers: dict[str, str]) -> bool:
        """Answer 401 and return True when ``--api-key`` guards ``path`` and the request lacks the key."""
        opts = self.opts
        guarded = bool(opts.api_key) and (opts.key_scope == "all" or path.startswith("/v1/"))
        if guarded and not hmac.compare_digest(headers.get("authorization", ""), f"Bearer {opts.api_key}"):
            if method == "POST" and path.startswith(COMPLETION_PATHS):
                self.stats["requests"] += 1
            self.send(401, b'{"error":"Unauthorized"}')
            return True
        return False

    def accepted(self, headers: dict[str, str], body: bytes) -> dict[str, Any] | None:
        """The request, or None once refused (400 not JSON or invalid, 404 unknown model)."""
        opts = self.opts
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            self.send(400, b'{"error":{"message":"body is not JSON"}}')
            return None
        if req.get("model") not in (None, opts.model):
            error = {
                "message": f"The model `{req.get('model')}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
            self.send(404, json.dumps({"error": error, "object": "error"}).encode())
            return None
        refusal = check_request(req, opts.max_model_len)
        if refusal is not None:
            self.stats["400"] += 1
            self.send(400, refusal)
            return None
        return dict(req)

    def complete(self, path: str, headers: dict[str, str], body: bytes) -> None:
        """A completion, subject to the fault knobs."""
        opts, stats = self.opts, self.stats
        stats["requests"] += 1
        req = self.accepted(headers, body)
        if req is None:
            return
        if opts.broken_prompt is not None and re.search(opts.broken_prompt, _prompt_text(req)):
            stats["broken"] += 1
            payload = json.dumps(answer(path, req, opts.model, not opts.ignore_n)).encode()
            self._reply(self.send_broken, payload, self._holds(req))
            return
        if opts.storm_429_s and (time.monotonic() - opts.started) % opts.storm_429_period_s < opts.storm_429_s:
            stats["429"] += 1
            stats["storm_429"] += 1
            retry = f"Retry-After: {opts.retry_after_s:g}\r\n"
            self.send(429, b'{"error":{"message":"rate limited (storm)"}}', extra=retry)
            return
        roll = self.rng.random()
        if roll < opts.timeout_rate:
            stats["timeouts"] += 1
            return  # never answer: the client's timeout fires
        roll -= opts.timeout_rate
        if roll < opts.rate_429:
            stats["429"] += 1
            self.send(429, b'{"error":{"message":"rate limited"}}', extra=f"Retry-After: {opts.retry_after_s:g}\r\n")
            return
        roll -= opts.rate_429
        error_rate = opts.error_rate if opts.fail_while is None or os.path.exists(opts.fail_while) else 0.0
        if roll < error_rate:
            stats["5xx"] += 1
            self.send(500 if roll < error_rate / 2 else 503, b'{"error":{"message":"injected failure"}}')
            return
        roll -= error_rate
        body_out = answer(path, req, opts.model, not opts.ignore_n)
        if opts.invalid_json_rate and req.get("response_format"):
            bad = self.rng.random()
            if bad < opts.invalid_json_rate:
                stats["invalid_json"] += 1
                body_out["choices"][0]["message"]["content"] = invalid_content(req, bad / opts.invalid_json_rate)
        payload = json.dumps(body_out).encode()
        reply: Callable[[int, bytes], None] = self.send
        if roll < opts.truncate_rate:
            stats["truncated"] += 1
            reply = self.send_truncated
        elif roll - opts.truncate_rate < opts.stall_body_rate:
            stats["stalled"] += 1
            reply = self.send_stalled
        else:
            stats["ok"] += 1
            stats["prompt_tokens"] += body_out["usage"]["prompt_tokens"]
            stats["generation_tokens"] += body_out["usage"].get("completion_tokens", 0)
        self._reply(reply, payload, self._holds(req))
        if opts.exit_after is not None and stats["ok"] >= opts.exit_after:
            asyncio.get_running_loop().call_later(opts.latency_s + 0.05, os._exit, 3)

    def _reply(self, reply: Callable[[int, bytes], None], payload: bytes, holds: bool) -> None:
        """``reply(200, payload)`` now, or after ``latency_s`` and, when the request ``holds``, while
        ``hold_while`` exists (counted as running meanwhile)."""
        if self.opts.latency_s or (holds and self._held()):
            self.stats["running"] += 1
            asyncio.get_running_loop().call_later(self.opts.latency_s, self._reply_later, reply, payload, holds)
        else:
            reply(200, payload)

    def _holds(self, req: dict[str, Any]) -> bool:
        """Whether ``hold_while`` applies to this request (``hold_prompt`` matches its prompt, or is unset)."""
        return self.opts.hold_prompt is None or re.search(self.opts.hold_prompt, _prompt_text(req)) is not None

    def _held(self) -> bool:
        return self.opts.hold_while is not None and os.path.exists(self.opts.hold_while)

    def _reply_later(self, reply: Callable[[int, bytes], None], payload: bytes, holds: bool) -> None:
        if holds and self._held():
            asyncio.get_running_loop().call_later(0.05, self._reply_later, reply, payload, holds)
            return
        self.stats["running"] -= 1
        reply(200, payload)

    def send_truncated(self, status: int, body: bytes) -> None:
        """Headers and half the body, then the connection is dropped (a replica dying mid-answer)."""
        if not self.t.is_closing():
            self.t.write(self._head(status, len(body)) + body[: len(body) // 2])
            self.t.abort()

    def send_broken(self, status: int, body: bytes) -> None:
        """A 200 whose body is broken as ``broken_form`` says (``body``: the good answer it stands for)."""
        form = self.opts.broken_form
        if form == "cut":  # the whole answer announced, 16 bytes of it sent, then the connection closed
            if not self.t.is_closing():
                self.t.write(self._head(status, len(body)) + body[:16])
                self.t.close()
            return
        value = json.loads(body)
        broken = {
            "html": BROKEN_HTML,
            "empty": b"",
            "no-choices": json.dumps({k: v for k, v in value.items() if k not in ("choices", "data")}).encode(),
            "truncated-json": body[: len(body) // 2],
            "array": json.dumps([value]).encode(),
        }[form]
        self.send(status, broken, content_type="text/html" if form == "html" else "application/json")

    def send_stalled(self, status: int, body: bytes) -> None:
        """Headers and half the body, then nothing more (the client's read timeout fires)."""
        if not self.t.is_closing():
            self.t.write(self._head(status, len(body)) + body[: len(body) // 2])

    @staticmethod
    def _head(status: int, length: int, extra: str = "", content_type: str = "application/json") -> bytes:
        return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            status,
            _REASONS.get(status, b"Status"),
            content_type.encode(),
            length,
            extra.encode(),
        )

    def send(self, status: int, body: bytes, extra: str = "", content_type: str = "application/json") -> None:
        """Write one response (keep-alive)."""
        if self.t.is_closing():
            return
        self.t.write(self._head(status, len(body), extra, content_type) + body)


def vllm_metrics(
    model: str,
    stats: Counter[str],
    *,
    waiting: int = 0,
    kv_usage: float | None = None,
    extra: tuple[tuple[str, str, str, float], ...] = (),
) -> str:
    """Prometheus text shaped like vLLM's ``/metrics`` (the series `prefect-swarm top`, the dashboard and
    the job's in-flight controller read): ``stats["running"]``, ``waiting``, the KV cache usage (by
    default the running requests' share of 256 slots), token and success counters, then ``extra``
    series as (name, type, help, value).

    The stub counts requests waiting for their delayed answer as running and has no queue; the GPU-like
    simulator (:mod:`prefect_swarm.testing.gpu_sim`) passes its own queue, cache usage and prefix-cache counters.
    """
    labels = f'{{engine="0",model_name="{model}"}}'
    series = [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", stats["running"]),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", waiting),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            min(1.0, stats["running"] / 256) if kv_usage is None else kv_usage,
        ),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", stats["prompt_tokens"]),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats["generation_tokens"],
        ),
        ("vllm:request_success_total", "counter", "Count of successfully processed requests.", stats["ok"]),
        *extra,
    ]
    out = []
    for name, kind, doc, value in series:
        family = name.removesuffix("_total") if kind == "counter" else name
        out.append(f"# HELP {family} {doc}\n# TYPE {family} {kind}\n{name}{labels} {float(value)}\n")
    return "".join(out)


class RayNodes:
    """Alive nodes of the local Ray cluster, counted every second in a daemon thread (``--require-ray-nodes``)."""

    alive = 0

    @classmethod
    def watch(cls) -> None:
        """Start counting."""
        threading.Thread(target=cls._count, name="ray-nodes", daemon=True).start()

    @classmethod
    def _count(cls) -> None:
        import ray

        said = ""
        while True:
            try:
                if not ray.is_initialized():
                    ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
                cls.alive = sum(1 for node in ray.nodes() if node["Alive"])
                news = f"stub engine: {cls.alive} alive Ray node(s)"
            except Exception as exc:  # no cluster (yet): not ready
                cls.alive, news = 0, f"stub engine: Ray not reachable: {exc}"
            if news != said:
                print(news, file=sys.stderr, flush=True)
                said = news
            time.sleep(1.0)


async def serve(host: str, port: int, opts: StubOptions) -> None:
    """Serve until cancelled or signalled."""
    if opts.require_ray_nodes:
        RayNodes.watch()
    StubProtocol.opts = opts
    StubProtocol.rng = random.Random(opts.seed)
    StubProtocol.stats = Counter()
    await serve_until_signalled(StubProtocol, host, port, stop_delay_s=opts.stop_delay_s)
    if opts.stop_delay_s:
        print("stub engine: stopped after TERM", file=sys.stderr, flush=True)


async def serve_until_signalled(
    protocol: type[asyncio.Protocol], host: str, port: int, *, stop_delay_s: float = 0.0
) -> None:
    """Serve ``protocol`` on ``host:port`` until SIGTERM or SIGINT (the stub's and the simulator's loop),
    and ``stop_delay_s`` after it."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
        await asyncio.sleep(stop_delay_s)


def parse_args(argv: list[str] | None = None) -> tuple[str, int, StubOptions]:
    """CLI arguments to (host, port, options)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", "--served-model-name", dest="model", default="stub-model")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--error-rate", type=float, default=0.0, help="share of 500/503 answers")
    ap.add_argument("--fail-while", default=None, help="a file: --error-rate applies only while it exists")
    ap.add_argument("--hold-while", default=None, help="a file: every answer waits while it exists")
    ap.add_argument("--hold-prompt", default=None, help="a regex: --hold-while holds only prompts it matches")
    ap.add_argument("--rate-429", type=float, default=0.0, help="share of 429 answers")
    ap.add_argument("--timeout-rate", type=float, default=0.0, help="share of requests never answered")
    ap.add_argument("--truncate-rate", type=float, default=0.0, help="share of 200s cut by a dropped connection")
    ap.add_argument("--stall-body-rate", type=float, default=0.0, help="share of 200s whose body stops halfway")
    ap.add_argument("--storm-429-s", type=float, default=0.0, help="seconds of 429-only at the start of each period")
    ap.add_argument("--storm-429-period-s", type=float, default=1.0, help="period of the 429 storms")
    ap.add_argument("--retry-after-s", type=float, default=0.0)
    ap.add_argument("--exit-after", type=int, default=None, help="exit (code 3) after N good completions")
    ap.add_argument("--startup-delay-s", type=float, default=0.0)
    ap.add_argument("--stop-delay-s", type=float, default=0.0, help="after TERM, serve this long, then exit")
    ap.add_argument("--api-key", default=env_value(API_KEY) or os.environ.get("STUB_API_KEY"))
    ap.add_argument(
        "--key-scope",
        choices=("all", "v1"),
        default=os.environ.get("STUB_KEY_SCOPE", "all"),
        help="routes that need --api-key: all (a closed replica) or v1 (plain vLLM --api-key)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--invalid-json-rate", type=float, default=0.0, help="share of response_format answers that break it"
    )
    ap.add_argument("--max-model-len", type=int, default=4096, help="max_tokens above this is a 400")
    ap.add_argument(
        "--require-ray-nodes", type=int, default=None, help="health is 503 until Ray reports this many alive nodes"
    )
    ap.add_argument("--ignore-n", action="store_true", help="one choice whatever n asks (an engine without n)")
    ap.add_argument("--broken-prompt", default=None, help="regex: a prompt matching it always gets a broken 200")
    ap.add_argument("--broken-form", choices=BROKEN_FORMS, default="html", help="what is broken in those 200s")
    a, _unknown = ap.parse_known_args(argv)  # tolerate vLLM-style extra flags
    opts = StubOptions(
        model=a.model,
        latency_s=a.latency_ms / 1000,
        error_rate=a.error_rate,
        fail_while=a.fail_while,
        hold_while=a.hold_while,
        hold_prompt=a.hold_prompt,
        rate_429=a.rate_429,
        timeout_rate=a.timeout_rate,
        truncate_rate=a.truncate_rate,
        stall_body_rate=a.stall_body_rate,
        storm_429_s=a.storm_429_s,
        storm_429_period_s=a.storm_429_period_s,
        retry_after_s=a.retry_after_s,
        exit_after=a.exit_after,
        startup_delay_s=a.startup_delay_s,
        stop_delay_s=a.stop_delay_s,
        api_key=a.api_key,
        key_scope=a.key_scope,
        seed=a.seed,
        invalid_json_rate=a.invalid_json_rate,
        max_model_len=a.max_model_len,
        require_ray_nodes=a.require_ray_nodes,
        ignore_n=a.ignore_n,
        broken_prompt=a.broken_prompt,
        broken_form=a.broken_form,
    )
    return a.host, a.port, opts


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    host, port, opts = parse_args(argv)
    asyncio.run(serve(host, port, opts))


STUB_MODULE = "prefect_swarm.testing.stub_engine"


def knob_args(knobs: dict[str, Any]) -> list[str]:
    """``--flag value`` arguments for stub knobs given as keyword names (``latency_ms=50``; a switch
    as ``ignore_n=True``)."""
    args: list[str] = []
    for key, value in knobs.items():
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            args += [flag] if value else []
        elif value is not None:
            args += [flag, str(value)]
    return args


def engine_command(host: str = "{host}", *, module: str = STUB_MODULE, **knobs: Any) -> list[str]:
    """The ``engine.command`` template (engine kind ``command``) that runs this stub as a swarm replica.

    ``{python}``, ``{port}`` and ``{served_model_name}`` are left for the backend to fill in;
    ``knobs`` become flags (``engine_command(latency_ms=50)`` adds ``--latency-ms 50``); ``module`` runs
    another engine of this package with the same flags (the GPU-like simulator, ``prefect_swarm.testing.gpu_sim``).
    """
    return [
        "{python}", "-m", module, "--host", host, "--port", "{port}",
        "--model", "{served_model_name}", *knob_args(knobs),
    ]  # fmt: skip


def stub_swarm_config(
    name: str,
    *,
    replicas: int = 1,
    port: int | None = None,
    backend: dict[str, Any] | None = None,
    module: str = STUB_MODULE,
    engine: dict[str, Any] | None = None,
    **knobs: Any,
) -> dict[str, Any]:
    """An inline swarm config: ``replicas`` stub engines (``knobs`` as in :func:`engine_command`) on
    free ports of the local backend; ``backend`` adds fields to the backend section, ``engine`` to the
    engine section; ``module`` runs another engine of this package (see :func:`engine_command`)."""
    from prefect_swarm.testing.ports import free_port_block

    return {
        "name": name,
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": port or free_port_block(replicas),
        "ready_timeout_s": 60,
        "engine": {
            "kind": "command",
            "command": engine_command(module=module, **knobs),
            "startup_timeout_s": 60,
            **(engine or {}),
        },
        "backend": {"type": "local", **(backend or {})},
    }


class StubEngine:
    """Run the stub engine in a subprocess: ``with StubEngine(port, latency_ms=50) as s: s.url``."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *args: str,
        cpu: int | None = None,
        module: str = STUB_MODULE,
        env: dict[str, str] | None = None,
        **knobs: Any,
    ) -> None:
        self.host, self.port = host, port
        self.env = {**os.environ, **env} if env else None
        """The engine's environment (None: this process's)."""
        self.argv = [sys.executable, "-m", module, "--host", host, "--port", str(port)]
        self.argv += [*knob_args(knobs), *args]
        if cpu is not None:
            self.argv = ["taskset", "-c", str(cpu), *self.argv]
        self.proc: subprocess.Popen[bytes] | None = None
        key = knobs.get("api_key")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        """What this object's own requests (start, stats) send: a keyed stub refuses every route without it."""

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> StubEngine:
        """Start and wait until /health answers."""
        import httpx

        from prefect_swarm.interfaces.readiness import http_client

        self.proc = subprocess.Popen(self.argv, start_new_session=True, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if http_client().get(self.url + "/health", headers=self.headers, timeout=1).status_code in (200, 503):
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"stub engine on {self.url} did not start")

    def stats(self) -> dict[str, int]:
        """Request counters."""
        from prefect_swarm.interfaces.readiness import http_client

        return dict(http_client().get(self.url + "/stats", headers=self.headers, timeout=5).json())

    def stop(self) -> None:
        """Stop the process (and only it)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> StubEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
