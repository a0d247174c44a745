"""The async data plane: send one request per row, bounded, retried, spread over endpoints.

``concurrency`` worker coroutines share one aiohttp session and pull prepared rows from one
iterator, so at most ``concurrency`` requests are in flight. A row is retried (exponential
backoff with full jitter, honouring ``Retry-After``) on 429, 5xx, timeouts and connection
errors; any other 4xx, or an unparsable answer, fails it at once. A row whose retries are spent
becomes an error row (status ``error`` + reason): nothing a single row does can stop the shard.

Outages pause, they do not fail rows: a timeout or connection error counts against the row's
``max_retries`` only when its endpoint answered some other request after this one was sent (the
endpoint is alive, so the failure is the row's own); when nothing answered since, or the failure
takes the endpoint out of rotation, the row is sent again without counting it (elsewhere when
another endpoint is in rotation, else after waiting for the swarm). So a row becomes an error row
only for what it caused: a 4xx, an answer that cannot be used, or retries spent on 429/5xx, on
no answer while its endpoint answered others, or on answers whose body broke (below).
A 200 whose answer the job refuses (:class:`~prefect_swarm.jobs.api.InvalidAnswer`, e.g. it breaks
the response schema) is asked again at once, up to the job's ``answer_retries`` times (not counted
against ``max_retries``). An HTTP error's body is kept as valid JSON (long strings shortened, see
:func:`shorten_json`): in the row's error text, and whole up to 64 KiB for the OpenAI Batch output.

A 200 counts only once its whole body is read: a body cut by a dropped connection, or a timeout
while reading it, fails the request and the row is sent again. Its endpoint did answer (its status
line and headers came), so that failure is the row's own, never an outage's: it counts against
``max_retries`` (a row whose every answer is cut becomes an error row saying so) and it keeps the
endpoint in rotation (it brings an ejected one back, as any answer does).

How many requests are in flight: by default the closed loop of :mod:`prefect_swarm.jobs.dispatch.control`
(each replica kept full with a short queue, read from its ``/metrics``, latency when it has none;
replicas added to the swarm join); ``concurrency`` caps the total. Worker coroutines are started as
the window grows; those above it wait for a slot without costing anything. With ``adaptive`` the
older AIMD limit (below) replaces the loop, on ``concurrency`` workers.

Requests go to the endpoint with the most room under its limit (without the loop: the fewest
outstanding requests), among the endpoints in rotation; a retry goes to another endpoint than its
last attempt when there is one. An endpoint
that fails ``eject_after`` requests in a row with a connection error or a timeout is ejected (a
circuit breaker, like nginx ``max_fails`` or Envoy's outlier detection): no request goes to it
until its ejection ends (``eject_base_s``, doubled on each ejection in a row, at most
``eject_max_s``); then one probe request is let through (half-open): an answer puts it back in
rotation, a failure ejects it again for longer. A connection error on an endpoint that is then
ejected, while another one is in rotation, does not count against the row's retries (it is sent
elsewhere at once). When every endpoint is ejected (an outage of the swarm: every replica lost,
the LB down) rows wait for a probe to succeed, and no row fails for it. While the swarm is parked
(``parked_file`` is there) they wait for as long as it takes: the restore brings the endpoints back
and the probes find them. Otherwise, once every endpoint has
been out for longer than ``outage_timeout_s`` and no probe is still in flight, the runner stops
itself (:attr:`Runner.stop_reason` says why): the requests in flight finish, the rows not
answered stay out of the ledger, and the shard flushes and exits 75 (resumable: a rerun sends
them once the swarm is back).

With ``adaptive`` the in-flight limit starts low, grows by one per window of successes, and
shrinks (x0.7, at most once per window) on 429/503 or when latency rises past twice its floor.

An exception raised by the row source (a damaged input file) stops new requests; the requests in
flight finish and are reported, then :meth:`Runner.run` raises that exception.

Where a row is retried: :meth:`Runner._send` (one place).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import random
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from yarl import URL

from prefect_swarm.budget import Admission
from prefect_swarm.exceptions import InvalidAnswer, TooFewChoices
from prefect_swarm.jobs.api import SwarmJob, join_choices
from prefect_swarm.jobs.checkpoint.ledger import STATUS_ERROR, STATUS_OK, RowResult
from prefect_swarm.jobs.dispatch import fastjson
from prefect_swarm.jobs.dispatch.control import Controller, process_cap
from prefect_swarm.jobs.dispatch.ratelimit import RateLimiter

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
OVERLOAD_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers that make the in-flight loop back off from the endpoint."""
log = logging.getLogger("prefect_swarm.jobs")


@dataclass(frozen=True)
class RunnerConfig:
    """Knobs of :class:`Runner` (copied from the JobSpec)."""

    concurrency: int | None = None
    """Most requests in flight in this process (an explicit cap); None: the loop's window alone."""
    replica_capacity: int | None = None
    """What one replica can batch, when the swarm declares it (see :mod:`prefect_swarm.jobs.dispatch.control`);
    None: the loop starts from :data:`DEFAULT_CAPACITY` and finds it from each replica's /metrics."""
    nshards: int = 1
    """Processes sharing the replicas (each starts at its share of a replica)."""
    replicas_file: str | None = None
    """The swarm's replica list (file_sd JSON), re-read for replicas added mid-job."""
    control_s: float = 1.0
    """Period of the in-flight loop."""
    max_retries: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    adaptive: bool = False
    drain_seconds: float = 5.0
    keep_raw: bool = False
    eject_after: int = 5
    eject_base_s: float = 1.0
    eject_max_s: float = 30.0
    outage_timeout_s: float = 900.0
    """How long every endpoint may be out before the runner stops itself (the shard exits 75, resumable)."""
    parked_file: str | None = None
    """The swarm's snapshot file: while it is there the swarm is parked, and an outage pauses rows for as
    long as it lasts (``outage_timeout_s`` does not run): they go on once the swarm is restored."""
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    """The job's rate limits (all shards together; this process holds its share: see jobs.ratelimit)."""
    hedge: bool = True
    """The tail kept full: once every row is sent, a replica with room takes a copy of the rows that would
    end latest elsewhere, the first answer wins (see :meth:`Runner._steal`)."""


class _SplitSamples(Exception):
    """Raised out of a row's request when the engine ignored ``n`` under ``samples_by="auto"``: the
    row is sent again as one request per answer (see :meth:`Runner._send`)."""


class Item(NamedTuple):
    """One prepared row: global index, id, endpoint path, JSON body, prefix key (0: none)."""

    row: int
    rid: str
    path: str
    body: bytes
    key: int = 0


HEDGE_GAIN = 1.2
"""A row in flight is copied to an endpoint with room only when it is expected to end later there than
HEDGE_GAIN x that endpoint's latency from now: a copy that would not clearly win is not sent."""
STEAL_S = 0.1
"""How often, at the tail, the rows in flight are looked at for a copy (see :meth:`Runner._steal`)."""


@dataclass(slots=True)
class Flight:
    """A row whose request is in flight, for the tail (:meth:`Runner._steal`): where and when its last
    attempt went, the worker awaiting it, and the copy sent elsewhere (at most one)."""

    item: Item
    worker: asyncio.Task[None] | None
    ep: Endpoint | None = None
    sent_at: float = 0.0
    attempts: int = 0
    copy: asyncio.Task[None] | None = None
    result: RowResult | None = None
    """The copy's answer, once it came first (the worker reports it instead of its own)."""


AFFINITY_WAIT_S = 2.0
"""How long a row waits for room at the replica owning its prefix before it goes elsewhere."""
MAX_KEYS = 4096
"""Most prefix keys given an owner (a dataset of unique long prompts does not grow the map further)."""
PREFIX_BYTES = 1024
"""Rows whose request bodies share their first PREFIX_BYTES bytes (a long system prompt, few-shot
examples: ~250 tokens) share a prefix key: see :func:`prefix_key`."""


def prefix_key(body: bytes) -> int:
    """The prefix key of a request body: rows with the same key go to the same replica while it has
    room (its prefix cache then holds their shared prefix once); 0 for a body too short to share a
    long prefix."""
    return zlib.crc32(body[:PREFIX_BYTES]) + 1 if len(body) > PREFIX_BYTES else 0


@dataclass(slots=True)
class Endpoint:
    """One base URL, its outstanding requests and its circuit-breaker state."""

    url: str
    outstanding: int = 0
    fails: int = 0
    """Connection errors or timeouts in a row (an answer resets it)."""
    ejected_until: float = 0.0
    """Monotonic time the ejection ends; 0 while in rotation."""
    ejections: int = 0
    """Ejections in a row (each lasts twice as long as the last)."""
    probing: bool = False
    """A half-open probe is in flight."""
    answered_at: float = 0.0
    """Monotonic time of its last answer (any HTTP status): a request sent before it met a live endpoint."""
    sent: int = 0
    conn_errors: int = 0
    timeouts: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    """Requests sent, connection errors, timeouts, answers per non-200 status (read by jobs.metrics)."""
    limit: float = float("inf")
    """This process's in-flight limit for the endpoint (set by the in-flight loop)."""
    overloads: int = 0
    """429/5xx answers and timeouts since the loop's last step."""
    lat_ewma_ms: float = 0.0
    lat_floor_ms: float = float("inf")
    """Latency of 200s: moving average and lowest seen (the loop's fallback without /metrics)."""
    metrics_ok: bool | None = None
    """Whether the endpoint's /metrics told running/waiting the last time it was asked."""
    metrics_dead_until: float = 0.0
    seen: list[tuple[float, float]] = field(default_factory=list)
    """The loop's last (running, waiting) samples of the endpoint's engine."""
    last_limit: float = 0.0
    grew_from: float | None = None
    """The running batch (median) before the loop's last growth of the limit; None after a cut."""
    flat: int = 0
    """Growths in a row that did not raise the running batch (two: the batch is the engine's most)."""
    peak: float = 0.0
    """The highest running batch (median of a window) seen: the engine runs at least this many."""
    found: float = 0.0
    """The engine's batch as the loop found it (the running batch under a standing queue); 0: not yet."""
    keys: int = 0
    """Prefix keys this endpoint owns (prefix affinity)."""
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    """Rows waiting for room here (their prefix key's owner)."""


class EndpointPool:
    """Pick the endpoint with the fewest outstanding requests among those in rotation (see module doc)."""

    def __init__(
        self, urls: list[str], *, eject_after: int = 5, eject_base_s: float = 1.0, eject_max_s: float = 30.0
    ) -> None:
        if not urls:
            raise ValueError("no endpoint URL")
        self.endpoints = [Endpoint(u.rstrip("/")) for u in urls]
        self.eject_after, self.eject_base_s, self.eject_max_s = max(1, eject_after), eject_base_s, eject_max_s
        self.ejected = 0
        self.all_out_since: float | None = None
        self.ejection_log: list[tuple[str, float]] = []
        """(url, seconds) of every ejection, for the log and tests."""
        self.inflight = 0
        """Requests outstanding on every endpoint together."""
        self.room = 1 << 30
        """Free slots under the endpoints' limits (those in rotation); see :meth:`wait_room`."""
        self.cap = 1 << 30
        """Most requests outstanding together (the process's explicit cap)."""
        self.closed = False
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self.owners: dict[int, Endpoint] = {}
        """Prefix key -> the endpoint its rows go to while it has room (prefix affinity)."""

    def acquire(self, avoid: Endpoint | None = None, key: int = 0) -> Endpoint | None:
        """The least busy endpoint in rotation (or one due for a probe), its count raised; None when none is.

        ``key`` (a row's :func:`prefix_key`) picks the endpoint owning that key first when it is under its
        limit (prefix affinity: rows sharing a prefix meet the same prefix cache; see :meth:`_owner`).

        ``avoid`` (a retry's previous endpoint) is taken only when no other endpoint is in rotation:
        an endpoint that fails fast (429, refused connections) has the fewest requests outstanding,
        so least-outstanding alone would send the retry straight back to it.
        """
        eps = self.endpoints
        if self.ejected or (avoid is not None and len(eps) > 1):
            return self._acquire_degraded(avoid)
        if key and len(eps) > 1:
            ep = self._owner(key)
            if ep is not None and ep.outstanding < ep.limit:
                self._take(ep)
                return ep
        ep = eps[0] if len(eps) == 1 else min(eps, key=_fullness)
        self._take(ep)
        return ep

    def claim(self, ep: Endpoint) -> None:
        """Count one more request on ``ep``, chosen by the caller (a copy of a row at the tail)."""
        self._take(ep)

    def _take(self, ep: Endpoint) -> None:
        if ep.outstanding < ep.limit and not ep.ejected_until:
            self.room -= 1
        ep.outstanding += 1
        self.inflight += 1

    async def wait_room(self) -> bool:
        """Wait until some endpoint in rotation is under its limit and the cap allows one more request;
        False once :meth:`close` d. (Only the in-flight loop sets limits; without it there is always room.)"""
        while not self.closed and ((self.room <= 0 and not self._all_out()) or self.inflight >= self.cap):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._room_waiters.append(fut)
            await fut
        return not self.closed

    def recount(self) -> None:
        """Count the free slots again (limits changed, an endpoint left or joined rotation); wake waiters."""
        room = 0
        for ep in self.endpoints:
            if not ep.ejected_until:
                room += (1 << 30) if ep.limit == float("inf") else max(0, math.ceil(ep.limit) - ep.outstanding)
        self.room = room
        # every endpoint out: let the rows through to wait for a probe (the runner stops past outage_timeout_s)
        self._wake(len(self._room_waiters) if self._all_out() else max(0, min(room, self.cap - self.inflight)))

    def _all_out(self) -> bool:
        return self.ejected >= len(self.endpoints)

    def close(self) -> None:
        """Let every request waiting for room go (the runner stops)."""
        self.closed = True
        self._wake(len(self._room_waiters))

    def _wake(self, n: int) -> None:
        while n > 0 and self._room_waiters:
            fut = self._room_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    async def wait_for_owner(self, key: int, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the endpoint owning ``key`` has room: a batch job keeps every
        replica full, so without waiting a row would almost never find its owner free."""
        ep = self._owner(key)
        if ep is None or ep.outstanding < ep.limit or ep.ejected_until or len(self.endpoints) < 2:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ep.waiters.append(fut)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout_s)

    def _owner(self, key: int) -> Endpoint | None:
        """The endpoint a prefix key belongs to: given on first sight to the endpoint owning the fewest
        keys (so a handful of prefixes spread evenly), kept after; None past :data:`MAX_KEYS` keys."""
        ep = self.owners.get(key)
        if ep is None and len(self.owners) < MAX_KEYS:
            ep = min(self.endpoints, key=_owned)
            ep.keys += 1
            self.owners[key] = ep
        return ep

    def add(self, url: str) -> Endpoint:
        """A new endpoint in rotation (a replica added to the swarm); the list is replaced, not changed
        in place (the /metrics thread iterates it)."""
        ep = Endpoint(url.rstrip("/"))
        self.endpoints = [*self.endpoints, ep]
        return ep

    def _acquire_degraded(self, avoid: Endpoint | None) -> Endpoint | None:
        now = time.monotonic()
        due = [e for e in self.endpoints if e.ejected_until and e.ejected_until <= now and not e.probing]
        if due:
            ep = due[0]
            ep.probing = True
        else:
            live = [e for e in self.endpoints if not e.ejected_until]
            others = [e for e in live if e is not avoid]
            if not live:
                return None
            ep = min(others or live, key=_fullness)
        self._take(ep)
        return ep

    def release(self, ep: Endpoint) -> None:
        """Lower the endpoint's count; a slot freed under its limit wakes one request waiting for room."""
        ep.outstanding -= 1
        self.inflight -= 1
        if ep.outstanding < ep.limit and not ep.ejected_until:
            self.room += 1
            while ep.waiters:  # a row waiting for this very endpoint (prefix affinity) goes first
                fut = ep.waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
                    return
        if self._room_waiters and self.room > 0:
            self._wake(1)

    def answered(self, ep: Endpoint, at: float | None = None) -> None:
        """The endpoint answered (any HTTP status; ``at``: when, if not now): it is alive."""
        ep.fails = 0
        ep.answered_at = time.monotonic() if at is None else max(ep.answered_at, at)
        if ep.ejected_until:
            ep.ejected_until, ep.ejections, ep.probing = 0.0, 0, False
            self.ejected -= 1
            self.all_out_since = None
            self.recount()

    def failed(self, ep: Endpoint) -> bool:
        """A connection error or timeout on ``ep``; return True when ``ep`` is (now) out of rotation."""
        ep.fails += 1
        if ep.ejected_until:
            if ep.probing:  # the half-open probe failed: out again, for longer
                ep.probing = False
                self._eject(ep)
            return True
        if ep.fails < self.eject_after:
            return False
        self.ejected += 1
        self._eject(ep)
        if self.ejected == len(self.endpoints):
            self.all_out_since = time.monotonic()
        return True

    def _eject(self, ep: Endpoint) -> None:
        seconds = min(self.eject_max_s, self.eject_base_s * 2**ep.ejections)
        ep.ejections += 1
        ep.ejected_until = time.monotonic() + seconds
        self.ejection_log.append((ep.url, seconds))
        self.recount()

    @property
    def in_rotation(self) -> int:
        """Endpoints not ejected."""
        return len(self.endpoints) - self.ejected

    def probe_now(self) -> None:
        """End every ejection now (the swarm was restored): the next requests probe each endpoint at once
        instead of after the ejections a long park grew to ``eject_max_s``."""
        now = time.monotonic()
        for ep in self.endpoints:
            if ep.ejected_until and not ep.probing:
                ep.ejected_until = min(ep.ejected_until, now)

    def probing(self) -> bool:
        """A half-open probe is in flight."""
        return any(e.probing for e in self.endpoints)

    def out_for(self) -> float:
        """Seconds every endpoint has been out of rotation (0 while one is in)."""
        return 0.0 if self.all_out_since is None else time.monotonic() - self.all_out_since

    def next_probe_in(self) -> float:
        """Seconds until the next ejection ends (a short poll while probes are in flight)."""
        now = time.monotonic()
        waits = [e.ejected_until - now for e in self.endpoints if e.ejected_until and not e.probing]
        return min(0.25, max(0.005, min(waits))) if waits else 0.05


def _owned(ep: Endpoint) -> tuple[int, float]:
    return ep.keys, ep.outstanding - ep.limit


def _fullness(ep: Endpoint) -> float:
    """Outstanding less the limit: the endpoint with the most room first (without limits: the fewest outstanding)."""
    return ep.outstanding - ep.limit if ep.limit != float("inf") else ep.outstanding


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
        await self.free()

    async def free(self) -> None:
        """Free a slot without judging the endpoint (nothing was answered)."""
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
        on_result: Callable[[RowResult], None],
        *,
        api_key: str | None = None,
        on_tick: Callable[[], None] | None = None,
        tick_s: float = 1.0,
        admission: Admission | None = None,
    ) -> None:
        """``admission``: the swarm's budget, asked before every request (see :meth:`_admit`)."""
        self.job, self.cfg, self.on_result, self.admission = job, cfg, on_result, admission
        self.parse_body = job.parser()
        self.split_samples = job.samples_by == "seeds"
        """Whether each row's answers go one request each (:meth:`SwarmJob.sample_requests`)."""
        self.refusals: dict[int, list[str]] = {}
        """Why the job refused answers of rows still being asked (see :class:`InvalidAnswer`)."""
        self.pool = EndpointPool(
            endpoints, eject_after=cfg.eject_after, eject_base_s=cfg.eject_base_s, eject_max_s=cfg.eject_max_s
        )
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.on_tick, self.tick_s = on_tick, tick_s
        self.stop = asyncio.Event()
        self.stopped = False
        self.stop_reason: str | None = None
        self._parked_seen = -math.inf
        self._parked = False
        """When the swarm was last seen parked (an outage counts from then on, see :meth:`_outage_s`)."""
        """Why the runner stopped before every row was sent, when not by a signal (an outage past
        ``outage_timeout_s``, or what the caller passed to :meth:`request_stop`)."""
        self.requests = 0
        self.rate = RateLimiter.of(cfg.requests_per_minute, cfg.tokens_per_minute, share=cfg.nshards)
        self.limit: AdaptiveLimit | None = None
        self.control: Controller | None = None
        self.cap = 1
        self.source_error: BaseException | None = None
        self._bug: BaseException | None = None
        self._workers: set[asyncio.Task[None]] = set()
        self._all_done = asyncio.Event()
        self._exhausted = False
        self._flights: dict[int, Flight] = {}
        """Rows in flight by row index, while hedging may apply (:meth:`_send_tracked`)."""
        self._copies: set[asyncio.Task[None]] = set()
        self.copies = self.copies_won = 0
        """Copies of rows sent at the tail, and those whose answer came first (:meth:`_steal`)."""
        self._session: aiohttp.ClientSession
        self._items: Iterator[Item | RowResult]

    def request_stop(self, reason: str | None = None) -> None:
        """Stop issuing requests (signal handlers call this); ``reason``: why, when not a signal (the first kept)."""
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
        self.stopped = True
        self.stop.set()

    async def run(self, items: Iterator[Item | RowResult]) -> bool:
        """Send every item; return True when all were sent, False when stopped first. A RowResult among
        the items is a row answered without a request (see :mod:`prefect_swarm.jobs.dispatch.cache`): reported as it is.

        Raises what ``items`` raised, once the requests already in flight have been reported.
        """
        cfg = self.cfg
        cap, clamped = process_cap(cfg.concurrency)
        if clamped:
            log.warning(clamped)
        self.cap = self.pool.cap = cap
        if cfg.adaptive:
            self.cap = min(cap, cfg.concurrency or 64)
            self.limit = AdaptiveLimit(self.cap)
        else:
            self.control = Controller(
                self.pool,
                capacity=cfg.replica_capacity,
                nshards=cfg.nshards,
                cap=cap,
                control_s=cfg.control_s,
                replicas_file=Path(cfg.replicas_file) if cfg.replicas_file else None,
            )
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s, sock_connect=cfg.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers) as session:
            self._session, self._items = session, items
            self._spawn(self.control.total() if self.control is not None else self.cap)
            helpers = [asyncio.create_task(self._tick())]
            if self.control is not None:
                helpers.append(asyncio.create_task(self.control.run(session, self._spawn)))
            stop_wait = asyncio.create_task(self.stop.wait())
            done_wait = asyncio.create_task(self._all_done.wait())
            try:
                await asyncio.wait({done_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if self.stopped and not done_wait.done():
                    self.pool.close()  # workers waiting for room leave; those with a request finish it
                    await asyncio.wait({done_wait}, timeout=cfg.drain_seconds)
            finally:
                for task in (*self._workers, *self._copies, *helpers, stop_wait, done_wait):
                    task.cancel()
                await asyncio.gather(
                    *self._workers, *self._copies, *helpers, stop_wait, done_wait, return_exceptions=True
                )
        if self.source_error is not None:
            raise self.source_error
        if self._bug is not None:
            raise self._bug  # a bug in a worker: never hidden
        return not self.stopped

    def _spawn(self, size: int) -> None:
        """Start workers until there are ``size`` (within the cap), unless the rows are all taken."""
        missing = min(size, self.cap) - len(self._workers)
        if self._exhausted or missing <= 0:
            return
        for _ in range(missing):
            task = asyncio.create_task(self._worker_main())
            self._workers.add(task)
            task.add_done_callback(self._worker_ended)

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        self._workers.discard(task)
        if not task.cancelled() and task.exception() is not None and self._bug is None:
            self._bug = task.exception()
            self.request_stop()
        if not self._workers:
            self._all_done.set()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            if self.on_tick:
                self.on_tick()

    async def _worker_main(self) -> None:
        session, items, on_result, limit, pool = self._session, self._items, self.on_result, self.limit, self.pool
        controlled = self.control is not None
        tracked = controlled and self.cfg.hedge
        while not self.stopped:
            if controlled and not await pool.wait_room():
                return
            try:
                item = next(items, None)
            except Exception as exc:  # the source is dead: no new rows; rows in flight still finish
                self.source_error = exc
                item = None
            if item is None:
                if not self._exhausted and self._hedging():
                    self._exhausted = True
                    await self._steal()  # this worker turns to the tail
                self._exhausted = True
                return
            if isinstance(item, RowResult):  # answered without a request (an identical row's answer, the cache)
                on_result(item)
                await asyncio.sleep(0)  # a run of such rows leaves the loop to signals, ticks and answers
                continue
            if limit is not None:
                await limit.acquire()
            if tracked and len(pool.endpoints) > 1:  # (one endpoint, an LB's: nowhere to copy to)
                result = await self._send_tracked(session, item)
            else:
                result = await self._send(session, item)
            if result is not None:
                on_result(result)

    def _hedging(self) -> bool:
        """Whether the tail is kept full by copies (:meth:`_steal`): the in-flight loop runs, there is
        another endpoint to copy to, and a copy costs only a replica's idle time: a job whose requests are
        rate-limited or counted against a budget (a priced API's) sends none, nor one whose rows go as
        one request per answer."""
        return (
            self.cfg.hedge
            and self.control is not None
            and len(self.pool.endpoints) > 1
            and self.rate is None
            and self.admission is None
            and not self.split_samples
        )

    async def _send_tracked(self, session: aiohttp.ClientSession, item: Item) -> RowResult | None:
        """:meth:`_send`, with the row known as in flight (:class:`Flight`) so that the tail may copy it:
        when a copy's answer comes first, the copy cancels this very worker's request and its answer is
        the row's. Exactly one result either way: the worker reports it, never the copy."""
        flight = self._flights[item.row] = Flight(item, asyncio.current_task())
        try:
            return await self._send(session, item)
        except asyncio.CancelledError:
            task = flight.worker
            if flight.result is None or task is None or task.uncancel() > 0:
                raise  # the runner is stopping: not the copy's cancel
            return flight.result
        finally:
            self._flights.pop(item.row, None)
            if flight.copy is not None:
                flight.copy.cancel()  # this answer came first: the copy is not needed (nor reported)

    async def _steal(self) -> None:
        """The tail kept full. Once every row is sent, replicas run dry one by one while others still hold
        rows: a replica three times slower holds its last batch three times as long, a long answer holds
        its row long after the rest. Every :data:`STEAL_S` until no row is in flight, each endpoint with
        room under its limit takes a copy of the row expected to end latest elsewhere (its endpoint's
        latency less its age), when it is expected to end later there than :data:`HEDGE_GAIN` x this
        endpoint's latency from now (:meth:`_copy_late_rows`). A row already past its endpoint's latency
        is not copied: it is a long answer (a copy would start it over and lose), or a stall that the
        request timeout and retries deal with.
        The first answer wins: a copy that comes first cancels the original's request (vLLM aborts a
        request whose client is gone), an original that comes first cancels its copy. A copy is sent once,
        one attempt: if it fails, the original is still there."""
        while self._flights and not self.stopped and not self.pool.closed:
            self._copy_late_rows()
            await asyncio.sleep(STEAL_S)
        if self.copies:
            log.info("the tail: %d rows copied to replicas with room, %d answered first", self.copies, self.copies_won)

    def _copy_late_rows(self) -> None:
        """One look at the rows in flight (see :meth:`_steal`): copies sent to endpoints with room."""
        pool, now = self.pool, time.monotonic()
        targets = [e for e in pool.endpoints if not e.ejected_until and e.outstanding < e.limit and e.lat_ewma_ms]
        if not targets:
            return
        late: list[tuple[float, Flight]] = []
        for flight in self._flights.values():
            ep = flight.ep
            if flight.copy is not None or ep is None or not ep.lat_ewma_ms or not flight.sent_at:
                continue
            left = ep.lat_ewma_ms / 1000 - (now - flight.sent_at)  # expected time left there
            if left > 0:  # a row past its endpoint's latency is a long answer: a copy would start it over
                late.append((left, flight))
        late.sort(key=lambda x: -x[0])
        for left, flight in late:
            free = [e for e in targets if e is not flight.ep and e.outstanding < e.limit]
            if not free:
                if all(e.outstanding >= e.limit for e in targets):
                    return
                continue
            ep = min(free, key=_fullness)
            if left <= HEDGE_GAIN * ep.lat_ewma_ms / 1000:
                continue
            pool.claim(ep)
            flight.copy = task = asyncio.create_task(self._copy(flight, ep))
            self._copies.add(task)
            task.add_done_callback(self._copy_ended)

    async def _copy(self, flight: Flight, ep: Endpoint) -> None:
        """One copy of ``flight``'s row on ``ep`` (already claimed); its answer becomes the row's if it is a
        good one and the original has not answered yet (then the original's request is cancelled)."""
        item = flight.item
        self.copies += 1
        status, data, _, _, latency, _ = await self._post(self._session, ep, item, (0, 0.0))
        if not status:
            return
        self.pool.answered(ep)
        if status != 200:
            return
        try:
            result = self._parse(item, data, latency, flight.attempts + 1)
        except _SplitSamples:
            return
        if result is None or result.status != STATUS_OK or flight.worker is None:
            return
        if self._flights.get(item.row) is flight and flight.result is None:
            flight.result = result
            self.copies_won += 1
            flight.worker.cancel()

    def _copy_ended(self, task: asyncio.Task[None]) -> None:
        self._copies.discard(task)
        if not task.cancelled() and task.exception() is not None and self._bug is None:
            self._bug = task.exception()
            self.request_stop()

    async def _send(self, session: aiohttp.ClientSession, item: Item) -> RowResult | None:
        """One row: request, retry what is worth retrying, parse. Never raises for a row's fault.
        A row whose answers go one request each (:attr:`SwarmJob.samples_by`) goes to :meth:`_send_samples`."""
        if not self.split_samples:
            try:
                return await self._request(session, item, self._parse)
            except _SplitSamples:  # the engine ignores n: this row and the rest go one request per answer
                if self.limit is not None:
                    await self.limit.acquire()
        return await self._send_samples(session, item)

    async def _send_samples(self, session: aiohttp.ClientSession, item: Item) -> RowResult | None:
        """The row's :meth:`SwarmJob.sample_requests`, one after another on this worker's request
        slot, each retried as a row is; their answers joined (:func:`join_choices`) and parsed as
        one. An error of one makes the row an error row naming it; None when stopped (redone on resume)."""
        subs = self.job.sample_requests(fastjson.loads(item.body))
        answers: list[dict[str, Any]] = []
        attempts, latency = 0, 0.0
        for i, sub in enumerate(subs):
            if i and self.limit is not None:
                await self.limit.acquire()
            result = await self._request(session, item._replace(body=fastjson.dumps(sub)), self._answer_body)
            if result is None:
                return None
            attempts, latency = attempts + result.attempts, latency + result.latency_ms
            if result.outputs is None:
                error = f"answer {i + 1} of {len(subs)}: {result.error}"
                return replace(result, error=error, attempts=attempts, latency_ms=latency)
            answers.append(result.outputs["answer"])
        try:
            joined = fastjson.dumps(join_choices(answers))
        except InvalidAnswer as exc:
            return RowResult(item.row, item.rid, STATUS_ERROR, str(exc), 200, 0, 0, latency, attempts)
        return self._parse(item, joined, latency, attempts)

    def _answer_body(self, item: Item, data: bytes, latency: float, attempts: int) -> RowResult | None:
        """A 200 to one of a row's sample requests: its JSON body in ``outputs["answer"]``."""
        try:
            body = fastjson.loads(data)
        except ValueError as exc:
            return RowResult(item.row, item.rid, STATUS_ERROR, _unparsable(exc, data), 200, 0, 0, latency, attempts)
        return RowResult(item.row, item.rid, STATUS_OK, None, 200, 0, 0, latency, attempts, {"answer": body})

    async def _request(
        self, session: aiohttp.ClientSession, item: Item, parse: Callable[[Item, bytes, float, int], RowResult | None]
    ) -> RowResult | None:
        """One request for ``item`` until ``parse`` accepts a 200 of it or the retries are spent (an
        error row); None when stopped."""
        cfg, pool, error = self.cfg, self.pool, ""
        attempt = spared = 0  # requests sent; those not counted against the retries (sent elsewhere)
        ep: Endpoint | None = None
        if item.key and self.control is not None:
            await pool.wait_for_owner(item.key, AFFINITY_WAIT_S)
        moved = 0  # sent elsewhere at once, its endpoint having just left rotation
        while True:
            ep = pool.acquire(ep, item.key) or await self._wait_for_endpoint()
            admitted = await self._admit(item, ep) if ep is not None else None
            if ep is None or admitted is None:
                return None  # stopped (a signal, an outage past outage_timeout_s, the budget): redone on resume
            attempt += 1
            sent_at = time.monotonic()
            self._sent(item, ep, sent_at, attempt)
            status, data, retry_after, error, latency, head_at = await self._post(session, ep, item, admitted)
            if status:
                pool.answered(ep)
                result = self._answered(item, status, data, latency, attempt, parse)
                if result is not None:
                    return result
                spared += status == 200  # an answer the job refused: asked again, not counted as a retry
                error = f"HTTP {status}: {_snippet(data)}"
            else:
                counted, elsewhere = self._no_answer(ep, sent_at, head_at)
                spared += not counted
                if elsewhere and moved < 2 * len(pool.endpoints):
                    moved += 1  # another endpoint is up: send it there now
                    if self.stopped:
                        return None
                    if self.limit is not None:
                        await self.limit.acquire()
                    continue
            if attempt - spared > cfg.max_retries:
                return self._give_up(item, attempt, error, status, latency, data)
            await asyncio.sleep(self._backoff(attempt - spared if status else max(1, attempt - spared), retry_after))
            if self.stopped:
                return None  # a stopping shard redoes this row on resume
            if self.limit is not None:
                await self.limit.acquire()

    def _sent(self, item: Item, ep: Endpoint, sent_at: float, attempt: int) -> None:
        """Where and when a tracked row's attempt went (the tail judges it by them: :meth:`_steal`)."""
        flight = self._flights.get(item.row) if self._flights else None
        if flight is not None:
            flight.ep, flight.sent_at, flight.attempts = ep, sent_at, attempt

    def _no_answer(self, ep: Endpoint, sent_at: float, head_at: float = 0.0) -> tuple[bool, bool]:
        """A request sent at ``sent_at`` that brought no answer (timeout, connection error): (whether it
        counts against the row's retries, whether to send it to another endpoint now).

        ``head_at``: when its answer's status line and headers came, before its body broke (cut by a
        dropped connection, or the timeout while reading it); 0 when none came. Then ``ep`` answered this
        very request: it is alive (back in rotation if it was out), and the failure is the row's own
        (it counts), whatever else the endpoint answers. Otherwise it counts only when ``ep`` answered
        another request since and stays in rotation; else it is the swarm's (an outage pauses rows,
        never fails them)."""
        if head_at:
            self.pool.answered(ep, head_at)
            return True, False
        out = self.pool.failed(ep)
        if out or ep.answered_at <= sent_at:
            return False, out and self.pool.in_rotation > 0
        return True, False

    def _answered(
        self,
        item: Item,
        status: int,
        data: bytes,
        latency: float,
        attempt: int,
        parse: Callable[[Item, bytes, float, int], RowResult | None],
    ) -> RowResult | None:
        """The row's result from an HTTP answer (a 200 through ``parse``); None when it is worth asking
        again (a retryable status, or an answer the job refused with tries left)."""
        if status == 200:
            return parse(item, data, latency, attempt)
        if status in RETRY_STATUSES:
            return None
        raw = _snippet(data, RAW_ERROR_CHARS) if self.cfg.keep_raw else None
        error = f"HTTP {status}: {_snippet(data)}"
        return RowResult(item.row, item.rid, STATUS_ERROR, error, status, 0, 0, latency, attempt, None, raw)

    async def _admit(self, item: Item, ep: Endpoint) -> tuple[int, float] | None:
        """Before every attempt on ``ep``: wait for the rate limits (:mod:`prefect_swarm.jobs.dispatch.ratelimit`),
        then reserve the request's worst-case cost on the swarm's budget (:mod:`prefect_swarm.budget`).
        Returns (token estimate, reservation); None, with ``ep`` and the request's slot given back, when
        the runner is stopping (a stop while waiting sends nothing queued) or the budget refused it (the
        runner then stops issuing: at the cap, at once)."""
        estimate = await self.rate.acquire(item.body, self.stop) if self.rate is not None else 0
        reserved = None
        if estimate is not None and not self.stopped:
            reserved = await self.admission.reserve(item.body) if self.admission is not None else 0.0
            if reserved is None and self.admission is not None:
                self.request_stop(self.admission.reached)
            elif self.stopped and self.admission is not None:  # stopped while it waited for room
                self.admission.release(reserved or 0.0)
                reserved = None
        if estimate is None or reserved is None:
            self.pool.release(ep)
            if self.limit is not None:
                await self.limit.free()
            return None
        return estimate, reserved

    async def _post(
        self, session: aiohttp.ClientSession, ep: Endpoint, item: Item, admitted: tuple[int, float]
    ) -> tuple[int, bytes, str | None, str, float, float]:
        """One admitted request (:meth:`_admit`): (status, body, Retry-After, error, latency ms, when its
        headers came); status 0 when nothing was answered, the last 0.0 when not even the status line and
        headers came (a body cut short or stalled has them: see :meth:`_no_answer`). Its answer settles its
        reservation (cancelled mid-way, it stays spent)."""
        estimate, reserved = admitted
        started = time.monotonic()
        status, error, retry_after, data, head_at = 0, "", None, b"", 0.0
        head: aiohttp.ClientResponse | None = None
        self.requests += 1
        ep.sent += 1
        try:
            async with session.post(request_url(ep.url, item.path), data=item.body) as resp:
                head, head_at = resp, time.monotonic()
                data = await resp.read()  # a body cut short raises here: not an answer
                status = resp.status
                if status != 200:
                    retry_after = resp.headers.get("Retry-After")
                    ep.statuses[status] = ep.statuses.get(status, 0) + 1
                    ep.overloads += status in OVERLOAD_STATUSES
        except TimeoutError:
            error = f"timeout after {self.cfg.request_timeout_s:g}s"
            if head is not None:
                error = f"{_cut(head, 'stalled mid-body')}: {error}"
            ep.timeouts += 1
            ep.overloads += 1
        except aiohttp.ClientError as exc:
            error = f"connection error: {type(exc).__name__}: {exc}"
            if head is not None:
                error = f"{_cut(head, 'cut short')}: {error}"
            ep.conn_errors += 1
        finally:
            self.pool.release(ep)
        if self.admission is not None:
            self.admission.settle(reserved, status, data)
        latency = (time.monotonic() - started) * 1000
        if status == 200:
            if self.rate is not None:
                self.rate.settle(estimate, data)
            ep.lat_ewma_ms = latency if not ep.lat_ewma_ms else 0.9 * ep.lat_ewma_ms + 0.1 * latency
            ep.lat_floor_ms = min(ep.lat_floor_ms, latency)
        if self.limit is not None:
            await self.limit.release(latency, overloaded=status in (429, 503) or bool(error))
        return status, data, retry_after, error, latency, head_at

    async def _wait_for_endpoint(self) -> Endpoint | None:
        """Every endpoint is ejected (an outage): wait for a probe to bring one back. Past
        ``outage_timeout_s`` with no probe in flight, stop the runner (see :attr:`stop_reason`);
        None once stopped (the row is not recorded: a rerun sends it)."""
        pool, deadline = self.pool, self.cfg.outage_timeout_s
        while not self.stopped:
            if self._outage_s() > deadline and not pool.probing():
                self.request_stop(
                    f"no endpoint of the swarm answered for {pool.out_for():.0f}s (outage_timeout_s={deadline:g}): "
                    f"{', '.join(e.url for e in pool.endpoints)}"
                )
                break
            await asyncio.sleep(pool.next_probe_in())
            ep = pool.acquire()
            if ep is not None:
                return ep
        if self.limit is not None:
            await self.limit.free()
        return None

    def _outage_s(self) -> float:
        """Seconds of the outage that count against ``outage_timeout_s``: since every endpoint went out,
        or since the swarm was last seen parked (its snapshot file there), whichever is later; so a
        parked swarm pauses rows however long it stays parked, and its restore gets the whole timeout."""
        if self.cfg.parked_file is not None and os.path.exists(self.cfg.parked_file):
            self._parked_seen, self._parked = time.monotonic(), True
        elif self._parked:
            self._parked = False  # parked, now restored: its endpoints are back, probe them now
            self.pool.probe_now()
        return min(self.pool.out_for(), time.monotonic() - self._parked_seen)

    def _give_up(
        self, item: Item, attempt: int, error: str, status: int = 0, latency: float = 0.0, data: bytes = b""
    ) -> RowResult:
        error = f"gave up after {attempt} attempts; last: {error}"
        raw = _snippet(data, RAW_ERROR_CHARS) if status and self.cfg.keep_raw else None
        return RowResult(item.row, item.rid, STATUS_ERROR, error, status, 0, 0, latency, attempt, None, raw)

    def _refused_answer(self, item: Item, reason: str, latency: float, attempts: int) -> RowResult | None:
        """Remember why the job refused the row's answer; an error row once ``answer_retries`` are spent."""
        reasons = self.refusals.setdefault(item.row, [])
        reasons.append(reason)
        if len(reasons) <= self.job.answer_retries:
            return None
        del self.refusals[item.row]
        error = f"answer still invalid after {len(reasons)} tries: {reason}"
        return RowResult(item.row, item.rid, STATUS_ERROR, error, 200, 0, 0, latency, attempts)

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        cfg = self.cfg
        if attempt < 1:  # only refused answers so far: ask again at once
            return 0.0
        delay = random.uniform(0, min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempt - 1)))
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP date: the jittered backoff will do
                delay = max(delay, min(cfg.backoff_max_s, float(retry_after)))
        return delay

    def _parse(self, item: Item, data: bytes, latency: float, attempts: int) -> RowResult | None:
        """A 200's row result; None when the job refused the answer and may ask again."""
        try:
            body = fastjson.loads(data)
            outputs = self.parse_body(body)
            pt, ct = self.job.usage(body)
        except TooFewChoices as exc:
            if self.job.samples_by == "auto":  # (rows asked with n before the switch come here after it too)
                if not self.split_samples:
                    log.warning(
                        "the engine answered a row with fewer choices than asked with n: it does not serve OpenAI's n. "
                        "This shard now sends each row's answers as one request each, each with its own seed "
                        "(samples_by='auto'; 'seeds' skips the first try)."
                    )
                    self.split_samples = True
                raise _SplitSamples from exc
            return self._refused_answer(item, str(exc), latency, attempts)
        except InvalidAnswer as exc:
            return self._refused_answer(item, str(exc), latency, attempts)
        except Exception as exc:  # a bad answer fails this row, not the shard
            return RowResult(
                item.row,
                item.rid,
                STATUS_ERROR,
                _unparsable(exc, data),
                200,
                0,
                0,
                latency,
                attempts,
            )
        if self.refusals and item.row in self.refusals:
            outputs = self.job.after_invalid(outputs, self.refusals.pop(item.row)[-1])
        raw = data.decode() if self.cfg.keep_raw else None
        return RowResult(item.row, item.rid, STATUS_OK, None, 200, pt, ct, latency, attempts, outputs, raw)


ERROR_CHARS = 2000
"""Longest error text of a row (an engine's error body, shortened as valid JSON when it is JSON)."""
RAW_ERROR_CHARS = 65536
"""Longest error body kept for the OpenAI Batch output (``response.body`` of a failed request)."""


@functools.lru_cache(maxsize=256)
def request_url(base: str, path: str) -> URL:
    """The URL of a request to ``path`` on the endpoint ``base``: ``path`` only ever replaces the path
    (appended to the base's own), so no route a job returns (``@host:port/...``, ``//host/...``, an
    absolute URL) can name another host; the scheme, host and port are the endpoint's."""
    url = URL(base)
    return url.with_path(url.path.rstrip("/") + "/" + path.lstrip("/"))


def _cut(resp: aiohttp.ClientResponse, how: str) -> str:
    """An answer whose status line and headers came, but not its whole body (``how``: what stopped it)."""
    length = resp.headers.get("Content-Length")
    return f"HTTP {resp.status} answer {how}" + (f" (Content-Length {length})" if length else "")


def _unparsable(exc: Exception, data: bytes) -> str:
    """A row's error for a 200 whose body the job could not read: what was wrong with the body (empty,
    not JSON, JSON but not an object), what the job's parser raised, and the start of the body."""
    if not data.strip():
        return f"unparsable response: empty body ({type(exc).__name__}: {exc})"
    try:
        value = fastjson.loads(data)
    except ValueError:
        what = "not JSON"
    else:
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
        what = "" if isinstance(value, dict) else f"a JSON {kind}, not an object"
    what = f"{what}: " if what else ""
    return f"unparsable response: {what}{type(exc).__name__}: {exc}: {_snippet(data)}"


def _snippet(data: bytes, n: int = ERROR_CHARS) -> str:
    """``data`` as text of at most about ``n`` characters; a JSON body stays valid JSON.

    A JSON body longer than ``n`` has its long strings shortened (``...`` marks the cut), never
    cut in the middle of a value; plain text is cut at ``n`` characters.
    """
    text = data.decode("utf-8", "replace").strip()
    if text[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            return shorten_json(fastjson.loads(data), n)
    return text if len(text) <= n else text[:n] + "..."


def shorten_json(value: Any, n: int) -> str:
    """Compact JSON text of ``value`` in about ``n`` characters: long strings shortened, lists cut (valid JSON)."""
    text = fastjson.dumps(value).decode()
    limit = max(16, n // 2)
    while len(text) > n and limit >= 16:
        text = fastjson.dumps(_shorten(value, limit)).decode()
        limit //= 2
    if len(text) > n:  # too many keys or items: keep the start, as a JSON string
        text = fastjson.dumps({"truncated": text[:n]}).decode()
    return text


def _shorten(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, dict):
        return {k: _shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        items = [_shorten(v, limit) for v in value[:limit]]
        return [*items, "..."] if len(value) > limit else items
    return value
