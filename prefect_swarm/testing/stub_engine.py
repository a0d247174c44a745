"""A fast, deterministic OpenAI-compatible stub engine, for speed tests and benchmarks.

    python -m prefect_swarm.testing.stub_engine --port 8000 [--latency-ms 50] [--error-rate 0.2]

Raw asyncio HTTP/1.1 (keep-alive, Content-Length bodies): ~tens of thousands of requests/s on one core,
so benchmarks measure the client, not the server. Routes: ``GET /health``, ``GET /v1/models``,
``GET /stats`` (request counters as JSON), ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``.

Answers are a pure function of the request body (same prompt, same answer; token counts from the
prompt's length), so two runs of a job produce identical outputs. Fault knobs draw from one seeded
random stream: ``--error-rate`` (500/503), ``--rate-429`` (429 with Retry-After), ``--timeout-rate``
(never answers), ``--truncate-rate`` (a 200 whose body is cut by closing the connection),
``--stall-body-rate`` (a 200 whose body stops halfway: the client's read times out),
``--storm-429-s S --storm-429-period-s P`` (every completion in the first S seconds of each P
seconds is a 429 with Retry-After), ``--exit-after N`` (the process dies after N completions:
watchdog tests, a replica dying mid-job), ``--startup-delay-s`` (health is 503 until then),
``--api-key`` (401 without it).

It is never the only engine a feature is tested with: see the vLLM-marked tests.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect_swarm.interfaces.jobenv import API_KEY

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
    api_key: str | None = None
    """Bearer token required on every request (401 without it)."""
    seed: int = 0
    """Seed of the fault knobs' random stream."""
    started: float = field(default_factory=time.monotonic)
    """When the stub started (``time.monotonic``)."""


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _prompt_text(req: dict[str, Any]) -> str:
    if "messages" in req:
        return " ".join(str(m.get("content", "")) for m in req.get("messages") or [])
    prompt = req.get("prompt", req.get("input", ""))
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def answer(path: str, req: dict[str, Any], model: str) -> dict[str, Any]:
    """The deterministic response body for ``req`` on ``path``."""
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
    content = f"stub-{h} " + " ".join(text.split()[:3])
    if path.startswith("/v1/completions"):
        choice: dict[str, Any] = {"index": 0, "text": content, "finish_reason": "length"}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        obj = "chat.completion"
    return {"id": f"stub-{h}", "object": obj, "created": 0, "model": model, "choices": [choice], "usage": usage}


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
        """Route one request."""
        opts, stats = self.opts, self.stats
        if path.startswith("/health"):
            ready = time.monotonic() - opts.started >= opts.startup_delay_s
            self.send(200 if ready else 503, b'{"status":"ok"}' if ready else b'{"status":"loading"}')
        elif path.startswith("/stats"):
            self.send(200, json.dumps(dict(stats)).encode())
        elif path.startswith("/v1/models"):
            self.send(200, json.dumps({"object": "list", "data": [{"id": opts.model, "object": "model"}]}).encode())
        elif method == "POST" and path.startswith(("/v1/chat/completions", "/v1/completions", "/v1/embeddings")):
            self.complete(path, headers, body)
        else:
            self.send(404, b'{"error":{"message":"not found"}}')

    def complete(self, path: str, headers: dict[str, str], body: bytes) -> None:
        """A completion, subject to the fault knobs."""
        opts, stats = self.opts, self.stats
        stats["requests"] += 1
        if opts.api_key and headers.get("authorization") != f"Bearer {opts.api_key}":
            self.send(401, b'{"error":{"message":"invalid api key"}}')
            return
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            self.send(400, b'{"error":{"message":"body is not JSON"}}')
            return
        if req.get("model") not in (None, opts.model):
            self.send(404, json.dumps({"error": {"message": f"model {req.get('model')} does not exist"}}).encode())
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
        if roll < opts.error_rate:
            stats["5xx"] += 1
            self.send(500 if roll < opts.error_rate / 2 else 503, b'{"error":{"message":"injected failure"}}')
            return
        roll -= opts.error_rate
        payload = json.dumps(answer(path, req, opts.model)).encode()
        reply: Callable[[int, bytes], None] = self.send
        if roll < opts.truncate_rate:
            stats["truncated"] += 1
            reply = self.send_truncated
        elif roll - opts.truncate_rate < opts.stall_body_rate:
            stats["stalled"] += 1
            reply = self.send_stalled
        else:
            stats["ok"] += 1
        if opts.latency_s:
            asyncio.get_running_loop().call_later(opts.latency_s, reply, 200, payload)
        else:
            reply(200, payload)
        if opts.exit_after is not None and stats["ok"] >= opts.exit_after:
            asyncio.get_running_loop().call_later(opts.latency_s + 0.05, os._exit, 3)

    def send_truncated(self, status: int, body: bytes) -> None:
        """Headers and half the body, then the connection is dropped (a replica dying mid-answer)."""
        if not self.t.is_closing():
            self.t.write(self._head(status, len(body)) + body[: len(body) // 2])
            self.t.abort()

    def send_stalled(self, status: int, body: bytes) -> None:
        """Headers and half the body, then nothing more (the client's read timeout fires)."""
        if not self.t.is_closing():
            self.t.write(self._head(status, len(body)) + body[: len(body) // 2])

    @staticmethod
    def _head(status: int, length: int, extra: str = "") -> bytes:
        return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (
            status,
            _REASONS.get(status, b"Status"),
            length,
            extra.encode(),
        )

    def send(self, status: int, body: bytes, extra: str = "") -> None:
        """Write one response (keep-alive)."""
        if self.t.is_closing():
            return
        self.t.write(self._head(status, len(body), extra) + body)


async def serve(host: str, port: int, opts: StubOptions) -> None:
    """Serve until cancelled or signalled."""
    StubProtocol.opts = opts
    StubProtocol.rng = random.Random(opts.seed)
    StubProtocol.stats = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StubProtocol, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def parse_args(argv: list[str] | None = None) -> tuple[str, int, StubOptions]:
    """CLI arguments to (host, port, options)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", "--served-model-name", dest="model", default="stub-model")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--error-rate", type=float, default=0.0, help="share of 500/503 answers")
    ap.add_argument("--rate-429", type=float, default=0.0, help="share of 429 answers")
    ap.add_argument("--timeout-rate", type=float, default=0.0, help="share of requests never answered")
    ap.add_argument("--truncate-rate", type=float, default=0.0, help="share of 200s cut by a dropped connection")
    ap.add_argument("--stall-body-rate", type=float, default=0.0, help="share of 200s whose body stops halfway")
    ap.add_argument("--storm-429-s", type=float, default=0.0, help="seconds of 429-only at the start of each period")
    ap.add_argument("--storm-429-period-s", type=float, default=1.0, help="period of the 429 storms")
    ap.add_argument("--retry-after-s", type=float, default=0.0)
    ap.add_argument("--exit-after", type=int, default=None, help="exit (code 3) after N good completions")
    ap.add_argument("--startup-delay-s", type=float, default=0.0)
    ap.add_argument("--api-key", default=os.environ.get(API_KEY) or os.environ.get("STUB_API_KEY"))
    ap.add_argument("--seed", type=int, default=0)
    a, _unknown = ap.parse_known_args(argv)  # tolerate vLLM-style extra flags
    opts = StubOptions(
        model=a.model,
        latency_s=a.latency_ms / 1000,
        error_rate=a.error_rate,
        rate_429=a.rate_429,
        timeout_rate=a.timeout_rate,
        truncate_rate=a.truncate_rate,
        stall_body_rate=a.stall_body_rate,
        storm_429_s=a.storm_429_s,
        storm_429_period_s=a.storm_429_period_s,
        retry_after_s=a.retry_after_s,
        exit_after=a.exit_after,
        startup_delay_s=a.startup_delay_s,
        api_key=a.api_key,
        seed=a.seed,
    )
    return a.host, a.port, opts


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    host, port, opts = parse_args(argv)
    asyncio.run(serve(host, port, opts))


def knob_args(knobs: dict[str, Any]) -> list[str]:
    """``--flag value`` arguments for stub knobs given as keyword names (``latency_ms=50``)."""
    args: list[str] = []
    for key, value in knobs.items():
        if value is not None:
            args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def engine_command(host: str = "{host}", **knobs: Any) -> list[str]:
    """The ``engine.command`` template (engine kind ``command``) that runs this stub as a swarm replica.

    ``{python}``, ``{port}`` and ``{served_model_name}`` are left for the backend to fill in;
    ``knobs`` become flags (``engine_command(latency_ms=50)`` adds ``--latency-ms 50``).
    """
    return [
        "{python}", "-m", "prefect_swarm.testing.stub_engine", "--host", host, "--port", "{port}",
        "--model", "{served_model_name}", *knob_args(knobs),
    ]  # fmt: skip


def stub_swarm_config(
    name: str, *, replicas: int = 1, port: int | None = None, backend: dict[str, Any] | None = None, **knobs: Any
) -> dict[str, Any]:
    """An inline swarm config: ``replicas`` stub engines (``knobs`` as in :func:`engine_command`) on
    free ports of the local backend; ``backend`` adds fields to the backend section."""
    from prefect_swarm.testing.ports import free_port_block

    return {
        "name": name,
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": port or free_port_block(replicas),
        "ready_timeout_s": 60,
        "engine": {"kind": "command", "command": engine_command(**knobs), "startup_timeout_s": 60},
        "backend": {"type": "local", **(backend or {})},
    }


class StubEngine:
    """Run the stub engine in a subprocess: ``with StubEngine(port, latency_ms=50) as s: s.url``."""

    def __init__(self, port: int, host: str = "127.0.0.1", *args: str, cpu: int | None = None, **knobs: Any) -> None:
        self.host, self.port = host, port
        self.argv = [sys.executable, "-m", "prefect_swarm.testing.stub_engine", "--host", host, "--port", str(port)]
        self.argv += [*knob_args(knobs), *args]
        if cpu is not None:
            self.argv = ["taskset", "-c", str(cpu), *self.argv]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> StubEngine:
        """Start and wait until /health answers."""
        import httpx

        self.proc = subprocess.Popen(self.argv, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code in (200, 503):
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"stub engine on {self.url} did not start")

    def stats(self) -> dict[str, int]:
        """Request counters."""
        import httpx

        return dict(httpx.get(self.url + "/stats", timeout=5).json())

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
