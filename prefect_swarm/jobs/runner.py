"""The async data plane: send one request per row, bounded, retried, spread over endpoints.

``concurrency`` worker coroutines share one aiohttp session and pull prepared rows from one
iterator, so at most ``concurrency`` requests are in flight. A row is retried (exponential
backoff with full jitter, honouring ``Retry-After``) on 429, 5xx, timeouts and connection
errors; any other 4xx, or an unparsable answer, fails it at once. A row whose retries are spent
becomes an error row (status ``error`` + reason): nothing a single row does can stop the shard.

Requests go to the endpoint with the fewest outstanding requests. With ``adaptive`` the
in-flight limit starts low, grows by one per window of successes, and shrinks (x0.7, at most
once per window) on 429/503 or when latency rises past twice its floor.

Where a row is retried: :meth:`Runner._send` (one place).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp

from prefect_swarm.jobs import fastjson
from prefect_swarm.jobs.api import SwarmJob

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RunnerConfig:
    """Knobs of :class:`Runner` (copied from the JobSpec)."""

    concurrency: int = 64
    max_retries: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    adaptive: bool = False
    drain_seconds: float = 5.0
    keep_raw: bool = False


class Item(NamedTuple):
    """One prepared row: global index, id, endpoint path, JSON body."""

    row: int
    rid: str
    path: str
    body: bytes


@dataclass(slots=True)
class Result:
    """What became of one row."""

    item: Item
    status: str
    error: str | None = None
    http_status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    attempts: int = 1
    outputs: dict[str, Any] | None = None
    raw: str | None = None


@dataclass(slots=True)
class Endpoint:
    """One base URL and its outstanding requests."""

    url: str
    outstanding: int = 0


class EndpointPool:
    """Pick the endpoint with the fewest outstanding requests."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("no endpoint URL")
        self.endpoints = [Endpoint(u.rstrip("/")) for u in urls]

    def acquire(self) -> Endpoint:
        """The least busy endpoint, its count raised."""
        eps = self.endpoints
        ep = eps[0] if len(eps) == 1 else min(eps, key=_outstanding)
        ep.outstanding += 1
        return ep

    @staticmethod
    def release(ep: Endpoint) -> None:
        """Lower the endpoint's count."""
        ep.outstanding -= 1


def _outstanding(ep: Endpoint) -> int:
    return ep.outstanding


@dataclass
class AdaptiveLimit:
    """AIMD limit on requests in flight (used only with ``adaptive``)."""

    ceiling: int
    limit: float = 0.0
    inflight: int = 0
    floor_ms: float = float("inf")
    ewma_ms: float = 0.0
    successes: int = 0
    last_cut: float = 0.0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.limit = float(min(self.ceiling, max(4, self.ceiling // 8)))

    async def acquire(self) -> None:
        """Wait until a slot is free under the current limit."""
        async with self.cond:
            while self.inflight >= int(self.limit):
                await self.cond.wait()
            self.inflight += 1

    async def release(self, latency_ms: float, overloaded: bool) -> None:
        """Free a slot and adjust the limit from what the request saw."""
        self.floor_ms = min(self.floor_ms, latency_ms) if not overloaded else self.floor_ms
        self.ewma_ms = latency_ms if not self.ewma_ms else 0.9 * self.ewma_ms + 0.1 * latency_ms
        slow = self.ewma_ms > 2 * self.floor_ms + 5
        now = time.monotonic()
        if overloaded or slow:
            if now - self.last_cut > max(self.ewma_ms / 1000, 0.05):
                self.limit = max(1.0, self.limit * 0.7)
                self.last_cut = now
                if slow:
                    self.floor_ms = self.ewma_ms / 2  # let the floor follow a slower regime
        else:
            self.successes += 1
            if self.successes >= int(self.limit):
                self.successes = 0
                self.limit = min(float(self.ceiling), self.limit + 1)
        async with self.cond:
            self.inflight -= 1
            self.cond.notify_all()


class Runner:
    """Run prepared rows against the endpoints; report each finished row to ``on_result``."""

    def __init__(
        self,
        job: SwarmJob,
        endpoints: list[str],
        cfg: RunnerConfig,
        on_result: Callable[[Result], None],
        *,
        api_key: str | None = None,
        on_tick: Callable[[], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.job, self.cfg, self.on_result = job, cfg, on_result
        self.pool = EndpointPool(endpoints)
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.on_tick, self.tick_s = on_tick, tick_s
        self.stop = asyncio.Event()
        self.stopped = False
        self.requests = 0
        self.limit: AdaptiveLimit | None = None

    def request_stop(self) -> None:
        """Stop issuing requests (signal handlers call this)."""
        self.stopped = True
        self.stop.set()

    async def run(self, items: Iterator[Item]) -> bool:
        """Send every item; return True when all were sent, False when stopped first."""
        self.limit = AdaptiveLimit(self.cfg.concurrency) if self.cfg.adaptive else None
        timeout = aiohttp.ClientTimeout(
            total=self.cfg.request_timeout_s, sock_connect=self.cfg.connect_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=self.cfg.concurrency, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers
        ) as session:
            workers = [asyncio.create_task(self._worker(session, items)) for _ in range(self.cfg.concurrency)]
            everything = asyncio.gather(*workers)
            ticker = asyncio.create_task(self._tick())
            stop_wait = asyncio.create_task(self.stop.wait())
            try:
                first: set[asyncio.Future[Any]] = {everything, stop_wait}
                await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
                if self.stopped and not everything.done():
                    await asyncio.wait({everything}, timeout=self.cfg.drain_seconds)
            finally:
                for task in (*workers, ticker, stop_wait):
                    task.cancel()
                await asyncio.gather(everything, ticker, stop_wait, return_exceptions=True)
        return not self.stopped

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            if self.on_tick:
                self.on_tick()

    async def _worker(self, session: aiohttp.ClientSession, items: Iterator[Item]) -> None:
        on_result, limit = self.on_result, self.limit
        while not self.stopped:
            item = next(items, None)
            if item is None:
                return
            if limit is not None:
                await limit.acquire()
            result = await self._send(session, item)
            if result is not None:
                on_result(result)

    async def _send(self, session: aiohttp.ClientSession, item: Item) -> Result | None:
        """One row: request, retry what is worth retrying, parse. Never raises for a row's fault."""
        cfg, attempt = self.cfg, 0
        while True:
            attempt += 1
            ep = self.pool.acquire()
            started = time.monotonic()
            status, error, retry_after, data = 0, "", None, b""
            self.requests += 1
            try:
                async with session.post(ep.url + item.path, data=item.body) as resp:
                    status = resp.status
                    data = await resp.read()
                    if status != 200:
                        retry_after = resp.headers.get("Retry-After")
            except TimeoutError:
                error = f"timeout after {cfg.request_timeout_s:g}s"
            except aiohttp.ClientError as exc:
                error = f"connection error: {type(exc).__name__}: {exc}"
            finally:
                self.pool.release(ep)
            latency = (time.monotonic() - started) * 1000
            if self.limit is not None:
                await self.limit.release(latency, overloaded=status in (429, 503) or bool(error))
            if status == 200:
                return self._parse(item, data, latency, attempt)
            if status:
                error = f"HTTP {status}: {_snippet(data)}"
            if (status and status not in RETRY_STATUSES) or attempt > cfg.max_retries:
                if attempt > cfg.max_retries and (not status or status in RETRY_STATUSES):
                    error = f"gave up after {attempt} attempts; last: {error}"
                return Result(
                    item, "error", error=error, http_status=status, latency_ms=latency, attempts=attempt
                )
            await asyncio.sleep(self._backoff(attempt, retry_after))
            if self.stopped:
                return None  # a stopping shard redoes this row on resume
            if self.limit is not None:
                await self.limit.acquire()

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        cfg = self.cfg
        delay = random.uniform(0, min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempt - 1)))
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP date: the jittered backoff will do
                delay = max(delay, min(cfg.backoff_max_s, float(retry_after)))
        return delay

    def _parse(self, item: Item, data: bytes, latency: float, attempts: int) -> Result:
        try:
            body = fastjson.loads(data)
            outputs = self.job.parse(body)
            pt, ct = self.job.usage(body)
        except Exception as exc:  # a bad answer fails this row, not the shard
            return Result(
                item,
                "error",
                error=f"unparsable response: {type(exc).__name__}: {exc}: {_snippet(data)}",
                http_status=200,
                latency_ms=latency,
                attempts=attempts,
            )
        raw = data.decode() if self.cfg.keep_raw else None
        return Result(item, "ok", None, 200, pt, ct, latency, attempts, outputs, raw)


def _snippet(data: bytes, n: int = 300) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= n else text[:n] + "..."
