"""Rate limits a job process holds against its endpoints: requests and tokens per minute.

An external swarm (a hosted provider, a shared gateway) sells or allows so many requests and tokens
a minute; past them it answers 429, and some providers suspend a key that keeps trying. So the
limit is held on our side, in the request loop (:meth:`prefect_swarm.jobs.dispatch.runner.Runner._post`,
before every attempt, retries included), not learnt from 429s.

Each limit is a token bucket refilled continuously at ``rate / 60`` a second that holds at most one
second's worth (at least one request; a request larger than that waits for a full bucket): over any
window of T seconds a process sends at most ``rate x T / 60`` plus one second's worth. A job's
limit is split evenly over its shards (each process holds ``rate / nshards``), so the job as a whole
holds it without the processes talking to each other.

Tokens are counted before a request at an estimate (its body's bytes / 4 for the prompt, plus its
``max_tokens`` or ``max_completion_tokens``, else :data:`DEFAULT_COMPLETION_TOKENS`) and corrected
once its answer reports its usage; the bucket may go below zero after a correction, and later
requests then wait for it to refill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

DEFAULT_COMPLETION_TOKENS = 256
"""Completion tokens a request is estimated at when its body sets no ``max_tokens``."""
BYTES_PER_TOKEN = 4
"""Prompt tokens a request is estimated at: its body's bytes / this (English text, JSON included)."""


class Bucket:
    """A token bucket of ``per_minute`` a minute holding at most one second's worth (at least one unit)."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute <= 0:
            raise ValueError(f"a rate limit must be above 0 a minute, not {per_minute}")
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.clock = clock
        self.level = self.capacity
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken (0: now); a request above the capacity waits for a full bucket."""
        self._refill()
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        """Take ``amount`` (the level may go below zero: later takes wait longer)."""
        self._refill()
        self.level -= amount


def estimate_tokens(body: bytes) -> int:
    """A request's tokens before it is sent: prompt from its size, completion from its ``max_tokens``."""
    prompt = len(body) // BYTES_PER_TOKEN
    try:
        req = json.loads(body)
    except ValueError:
        return prompt + DEFAULT_COMPLETION_TOKENS
    limit = req.get("max_completion_tokens") or req.get("max_tokens") if isinstance(req, dict) else None
    return prompt + (int(limit) if isinstance(limit, int | float) and limit > 0 else DEFAULT_COMPLETION_TOKENS)


class RateLimiter:
    """Requests and tokens per minute for one process (its share of the job's limits); see the module doc."""

    def __init__(
        self,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        *,
        share: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        share = max(1, share)
        self.requests = Bucket(requests_per_minute / share, clock) if requests_per_minute else None
        self.tokens = Bucket(tokens_per_minute / share, clock) if tokens_per_minute else None
        self.lock = asyncio.Lock()
        self.waited_s = 0.0
        """Seconds requests spent waiting for the limits (one at a time: the queue's wait)."""

    @classmethod
    def of(
        cls, requests_per_minute: float | None, tokens_per_minute: float | None, share: int = 1
    ) -> RateLimiter | None:
        """A limiter, or None when neither limit is set (nothing to hold)."""
        if not requests_per_minute and not tokens_per_minute:
            return None
        return cls(requests_per_minute, tokens_per_minute, share=share)

    async def acquire(self, body: bytes, stop: asyncio.Event | None = None) -> int | None:
        """Wait until one more request of ``body`` fits both limits, then count it; return its token
        estimate. None when ``stop`` is set first (before or while waiting): nothing is counted, and a
        stopping job sends nothing of what was queued behind the limits."""
        estimate = estimate_tokens(body) if self.tokens is not None else 0
        async with self.lock:  # first come, first served: one waiter at a time
            while True:
                if stop is not None and stop.is_set():
                    return None
                wait = max(
                    self.requests.wait_s(1) if self.requests is not None else 0.0,
                    self.tokens.wait_s(estimate) if self.tokens is not None else 0.0,
                )
                if wait <= 0:
                    break
                self.waited_s += wait
                if stop is None:
                    await asyncio.sleep(wait)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
            if self.requests is not None:
                self.requests.take(1)
            if self.tokens is not None:
                self.tokens.take(estimate)
        return estimate

    def settle(self, estimate: int, answer: bytes) -> None:
        """Correct a request's token count by the usage its 200 answer reports (``usage.total_tokens``)."""
        if self.tokens is None:
            return
        try:
            usage = json.loads(answer).get("usage") or {}
            used = int(usage.get("total_tokens") or 0) or int(usage.get("prompt_tokens") or 0) + int(
                usage.get("completion_tokens") or 0
            )
        except (ValueError, AttributeError, TypeError):
            return
        if used:
            self.tokens.take(used - estimate)


__all__ = ["Bucket", "RateLimiter", "estimate_tokens"]
