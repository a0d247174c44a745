"""How many requests a job process keeps in flight, per replica: sized from the swarm, then a closed loop.

The target of each replica is what it can batch (its *capacity*: vLLM's ``max_num_seqs``, SGLang's
``max_running_requests``, a ``command`` engine's declared ``capacity``; see
:func:`prefect_swarm.sizing.replica_capacity`) plus a short queue (:func:`queue_margin`), so
the engine never waits for the client and the client never piles rows up in a queue. The job's
processes (shards) share every replica: each starts at its share (``(capacity + margin) / shards``).

Then, every ``control_s``, :class:`Controller` reads each replica's ``/metrics``
(``vllm:num_requests_running`` R, ``vllm:num_requests_waiting`` W: what every client of the
replica has there) and judges its last :data:`HISTORY` samples together (answers leave a batch in
bursts; one sample is not a trend):

- a standing queue (W above the margin in every sample): the replica runs all it can, so this
  process scales what it has there by (R + margin) / (R + W) (at most halving it a step): every
  process sharing the replica cuts its own part, so together they trim the queue to the margin;
- room (W below the margin in most samples, while this process uses its limit): the replica could
  run more than it gets, so the limit grows a step (:data:`GROWTH` while the engine's batch is not
  known) as long as growing raises the running batch. Once the batch is known, by what the replica
  misses of it times this process's part of what the replica holds (its requests there over R + W):
  the processes sharing a replica together add what it misses, and one left alone at the end of a
  job (the others done) fills the replica at once instead of a share a step.

Capacity found, not assumed: where the swarm's config declares what a replica batches
(``engine.capacity``, vLLM's ``--max-num-seqs``...) that is the target and the limit never passes it
plus the margin. Where it does not (``capacity`` None), the loop starts from
:data:`DEFAULT_CAPACITY` and finds each replica's batch from its own
samples: it grows while the queue stays short and the running batch keeps rising; the batch it
finds is the running batch under a standing queue (the engine queues only what it cannot run), or
the batch two growths in a row did not raise (one flat sample is noise: answers leave a batch in
bursts). The margin follows the largest batch seen (1/16 of it), so a replica of 1024 keeps a queue
of 64, not the 16 of 256 that its one step's arrivals would pass every time. vLLM does not report
its ``max_num_seqs`` outside its development mode (its ``vllm:cache_config_info`` tells the KV cache,
not the batch), so the samples are what the loop has.

A 429, a 5xx or a timeout from a replica cuts its limit by 30 % (at most once a period). A replica
whose ``/metrics`` does not answer (or lacks those series) is controlled by latency instead: its
limit is cut by 15 % while the latency is above twice its floor (requests queueing), and grows by
5 % back toward its share once it is below 1.5 times the floor (the floor is the lowest latency seen,
drifting up 2 % a second). A slow replica's queue grows first, so its limit falls and the rows go
to the others (a request waits for room under some replica's limit, never behind a slow one); a
replica a ``scale`` adds shows up in the swarm's replica list (``replicas_file``, re-read every few
seconds) and is added once its ``/health`` answers.

Explicit caps: ``concurrency`` bounds the process's total (the sum of the limits), and the file
descriptors the process may open bound it too (:func:`fd_budget`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefect_swarm.interfaces.metrics import RUNNING, WAITING, parse, read_file_sd, total

if TYPE_CHECKING:
    from pathlib import Path

    import aiohttp

    from prefect_swarm.jobs.dispatch.runner import Endpoint, EndpointPool

log = logging.getLogger("prefect_swarm.jobs")

DEFAULT_CAPACITY = 256
"""A replica's capacity when the spec does not say (vLLM's max_num_seqs default on most GPUs)."""
FD_RESERVE = 64
"""Descriptors kept for everything but requests (input files, the ledger, logs, the /metrics server)."""
DISCOVER_S = 3.0
"""How often the swarm's replica list is re-read."""
HISTORY = 3
"""Samples of a replica's queue the loop judges together (a burst of answers is not a trend)."""
FLOOR_DRIFT = 1.02
"""The latency floor (the lowest latency seen) rises this much a second: the fallback's reference
follows a replica that became slower for good (longer prompts) within a minute."""
GROWTH, MAX_CUT = 0.5, 0.5
"""Room grows a limit by GROWTH a step (while the replica's batch is not known); a standing queue cuts
it to at most MAX_CUT of it a step."""
FLAT = 1.02
"""A growth that leaves the running batch below FLAT x what it was did not raise it."""


def queue_margin(capacity: int) -> int:
    """The short queue kept at a replica beyond its capacity: 1/16 of it, at least 8 (16 for 256): more
    than the requests that arrive during one engine step, which wait for the next step even on an idle engine."""
    return max(8, capacity // 16)


def fd_budget() -> int:
    """Requests this process can hold open: its file descriptor limit (the soft one raised to the hard
    one first, as far as the system allows) less :data:`FD_RESERVE`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(1, soft - FD_RESERVE)


def process_cap(concurrency: int | None) -> tuple[int, str | None]:
    """The most requests this process may hold: ``concurrency`` (when given) within :func:`fd_budget`;
    and a warning when the explicit cap had to be clamped."""
    budget = fd_budget()
    if concurrency is None:
        return budget, None
    if concurrency > budget:
        return budget, (
            f"concurrency {concurrency} is more than this process can open (RLIMIT_NOFILE allows "
            f"{budget + FD_RESERVE} file descriptors, {FD_RESERVE} kept for files): clamped to {budget}. "
            "Raise the limit (ulimit -n) or ask for less."
        )
    return concurrency, None


class Controller:
    """The closed loop of one job process over its endpoints (see the module doc)."""

    def __init__(
        self,
        pool: EndpointPool,
        *,
        capacity: int | None,
        nshards: int,
        cap: int,
        control_s: float = 1.0,
        replicas_file: Path | None = None,
        health_path: str = "/health",
    ) -> None:
        self.declared = capacity is not None
        """The swarm declares what a replica batches: the loop never sends one more (plus the margin)."""
        self.pool, self.nshards, self.cap = pool, max(1, nshards), max(1, cap)
        self.capacity = max(1, capacity or DEFAULT_CAPACITY)
        self.margin = queue_margin(self.capacity)
        self.control_s, self.replicas_file, self.health_path = control_s, replicas_file, health_path
        self.share = (self.capacity + self.margin) / self.nshards
        """One replica's starting limit in this process."""
        self.ep_cap = float(self.capacity + self.margin) if self.declared else float(self.cap)
        """Most in flight to one replica from this process: the declared batch plus the margin (all of
        it, for a process left alone at the end of a job), else only the process's own cap."""
        for ep in pool.endpoints:
            ep.limit = self.share
        pool.recount()
        self.follows = self._follows_replicas()
        self.last_discover = time.monotonic()
        self.log: list[dict[str, Any]] = []
        """One entry per control step (time, per endpoint: limit, running, waiting): for tests and logs."""

    def total(self) -> int:
        """This process's in-flight window: the limits of the endpoints in rotation, within the cap."""
        live = sum(math.ceil(ep.limit) for ep in self.pool.endpoints if not ep.ejected_until)
        return max(1, min(self.cap, live or math.ceil(self.share)))

    def _follows_replicas(self) -> bool:
        """The job talks to the replicas themselves (every endpoint is one of the swarm's replicas):
        then a replica added to the list is one more endpoint. Behind a load balancer it is not."""
        if self.replicas_file is None:
            return False
        urls = self._listed()
        return bool(urls) and all(ep.url in urls for ep in self.pool.endpoints)

    def _listed(self) -> list[str]:
        assert self.replicas_file is not None
        scheme = self.pool.endpoints[0].url.split("://", 1)[0] if self.pool.endpoints else "http"
        return [f"{scheme}://{t.address}" for t in read_file_sd(self.replicas_file).targets]

    async def run(self, session: aiohttp.ClientSession, on_resize: Callable[[int], None]) -> None:
        """Control until cancelled: scrape, adjust the limits (``on_resize`` hears the new total)."""
        while True:
            await asyncio.sleep(self.control_s)
            await self.step(session)
            if self.follows and time.monotonic() - self.last_discover >= DISCOVER_S:
                self.last_discover = time.monotonic()
                await self.discover(session)
            self.pool.recount()
            on_resize(self.total())

    async def step(self, session: aiohttp.ClientSession) -> None:
        """One control step over every endpoint."""
        eps = list(self.pool.endpoints)
        seen = await asyncio.gather(*(self._scrape(session, ep) for ep in eps))
        entry: dict[str, Any] = {"t": time.monotonic()}
        for ep, rw in zip(eps, seen, strict=True):
            if rw is None:
                self._by_latency(ep)
            else:
                self._by_metrics(ep, *rw)
            ep.overloads = 0
            entry[ep.url] = (round(ep.limit, 1), *(rw or (None, None)))
        self.log.append(entry)
        del self.log[:-600]

    async def _scrape(self, session: aiohttp.ClientSession, ep: Endpoint) -> tuple[float, float] | None:
        """(running, waiting) from the endpoint's ``/metrics``; None when it does not tell."""
        import aiohttp  # here, not at the top: sizing a job (the CLI) imports this module's margins

        if ep.metrics_dead_until > time.monotonic():
            return None
        try:
            timeout = aiohttp.ClientTimeout(total=max(0.5, self.control_s))
            async with session.get(ep.url + "/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                samples = parse(await resp.text())
            running, waiting = total(samples, RUNNING), total(samples, WAITING)
            if running is None or waiting is None:
                raise ValueError("no vllm:num_requests_running/waiting")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if ep.metrics_ok is not False:
                log.info("endpoint %s: no engine /metrics (%s); its in-flight limit follows latency", ep.url, exc)
            ep.metrics_ok = False
            ep.metrics_dead_until = time.monotonic() + 10 * self.control_s  # ask again later, not every step
            return None
        ep.metrics_ok = True
        return running, waiting

    def margin_of(self, ep: Endpoint) -> int:
        """The queue kept at ``ep``: :func:`queue_margin` of its batch (the largest of the declared or
        assumed one and the largest seen running there)."""
        return queue_margin(int(max(self.capacity, ep.found, ep.peak)))

    def _by_metrics(self, ep: Endpoint, running: float, waiting: float) -> None:
        ep.seen = [*ep.seen[-(HISTORY - 1) :], (running, waiting)]
        queues = sorted(w for _, w in ep.seen)
        batch = sorted(r for r, _ in ep.seen)[len(ep.seen) // 2]
        full = len(ep.seen) >= HISTORY
        if full:
            ep.peak = max(ep.peak, batch)
        margin = self.margin_of(ep)
        limit = ep.limit
        if queues[0] > margin:
            # a standing queue: scale what this process has there by wanted / actual load, so every
            # process sharing the replica cuts its own part and together they trim the queue to the margin
            if full:
                ep.found = batch  # the engine queues only what it cannot run: this is its batch
            ratio = (running + margin) / (running + waiting)
            limit = min(limit, max(ep.outstanding * ratio, limit * MAX_CUT))
            ep.grew_from = None
        elif self._room(ep, queues, batch, margin):
            ep.grew_from = batch
            if ep.found:  # grow by what the replica misses of its batch, this process's part of it
                missing = ep.found + margin - running - waiting
                part = min(1.0, ep.outstanding / max(1.0, running + waiting))
                limit += max(margin / self.nshards, missing * part)
            else:
                limit += max(margin / self.nshards, limit * GROWTH)
        if ep.overloads:
            limit = min(limit, ep.limit * 0.7)
        ep.limit = min(self.ep_cap, max(1.0, limit))
        if ep.limit != ep.last_limit:
            ep.seen = ep.seen[-1:]  # judge the next move on what follows this one
        ep.last_limit = ep.limit

    def _room(self, ep: Endpoint, queues: list[float], batch: float, margin: int) -> bool:
        """Whether the replica would run more than it gets: a short queue (median of the window), this
        process using its limit, and the running batch below the one found (while none is found, the
        last growth raised the running batch, or only one growth in a row did not: one flat window is
        noise, two are the engine's most)."""
        if len(queues) < HISTORY or queues[len(queues) // 2] >= margin or ep.outstanding < 0.8 * ep.limit:
            return False
        if ep.found:
            return batch < 0.97 * ep.found
        if ep.grew_from is not None:
            ep.flat = ep.flat + 1 if batch < FLAT * ep.grew_from else 0
            if ep.flat >= 2:
                ep.found, ep.flat = max(batch, ep.peak), 0  # growing did not raise the batch: it is full
                log.info("endpoint %s: batches %d (found from its /metrics)", ep.url, ep.found)
                return False
        return True

    def _by_latency(self, ep: Endpoint) -> None:
        floor, ewma = ep.lat_floor_ms, ep.lat_ewma_ms
        if ep.overloads:
            ep.limit = max(1.0, ep.limit * 0.7)
        elif ewma and floor < float("inf") and ewma > 2 * floor + 5:  # requests queue there
            ep.limit = max(1.0, ep.limit * 0.85)
        elif ep.limit < self.share and (not ewma or ewma < 1.5 * floor + 5):
            ep.limit = min(self.share, ep.limit * 1.05 + 1)
        if floor < float("inf"):
            ep.lat_floor_ms = floor * FLOOR_DRIFT**self.control_s  # a replica slower for good is not punished forever

    async def discover(self, session: aiohttp.ClientSession) -> None:
        """Add the replicas the swarm's list has gained, once their ``/health`` answers 200."""
        import aiohttp

        known = {ep.url for ep in self.pool.endpoints}
        for url in self._listed():
            if url in known:
                continue
            try:
                async with session.get(url + self.health_path, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status != 200:
                        continue
            except (aiohttp.ClientError, TimeoutError):
                continue
            ep = self.pool.add(url)
            ep.limit = self.share
            log.info("endpoint %s joined the swarm: sending it requests (limit %.0f)", url, ep.limit)
