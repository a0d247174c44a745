"""The idle timeout of a Slurm swarm (``backend.idle_timeout_s``, off by default).

The LB job's reconciler (:mod:`.lb`, ``--idle-timeout S``) scrapes each live replica's ``/metrics``
every ``CHECK_S`` seconds. A swarm is idle while no replica answers or holds a request: the sum of
``vllm:request_success_total`` does not move and ``vllm:num_requests_running`` +
``vllm:num_requests_waiting`` stay 0 (health checks are not requests). A replica that cannot be
scraped, or a change in the set of replicas, counts as activity (never stop on a doubt). After
``S`` idle seconds the reconciler stops the swarm (:func:`members.stop_swarm`, the reason recorded
for ``status``) and exits, which ends the LB job: a forgotten swarm gives its GPUs back. With
``--idle-park`` (``backend.idle_action: park``, the default) it first keeps the swarm's snapshot
(:func:`idle_snapshot`): the swarm is then PARKED, and the next run or job that needs it restores it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prefect_swarm.interfaces.metrics import scrape, total
from prefect_swarm.interfaces.parking import Snapshot
from prefect_swarm.paths import SwarmPaths, read_json, read_text

log = logging.getLogger("prefect_swarm.lb.idle")

CHECK_S = 5.0
"""How often the replicas' counters are read."""
DONE = "vllm:request_success_total"
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass
class IdleWatch:
    """How long the swarm has been idle (see the module docstring)."""

    timeout_s: float
    api_key: str | None = None
    park: bool = False
    """Park the idle swarm (keep its snapshot) rather than stop it."""
    since: float = field(default_factory=time.monotonic)
    last: tuple[tuple[int, str, float], ...] | None = None
    next_check: float = 0.0

    def sample(self, engines: Mapping[int, str]) -> tuple[tuple[int, str, float], ...] | None:
        """(replica, address, requests done) of each replica; None when one is busy or cannot be read."""
        out = []
        for index, addr in sorted(engines.items()):
            try:
                samples = scrape(f"http://{addr}/metrics", api_key=self.api_key)
            except OSError:
                return None
            if any((total(samples, name) or 0) > 0 for name in BUSY):
                return None
            out.append((index, addr, total(samples, DONE) or 0.0))
        return tuple(out)

    def expired(self, engines: Mapping[int, str], now: float | None = None) -> bool:
        """Check (at most every ``CHECK_S``); True once idle for ``timeout_s``."""
        now = time.monotonic() if now is None else now
        if now < self.next_check:
            return now - self.since >= self.timeout_s
        self.next_check = now + CHECK_S
        got = self.sample(engines)
        if got is None or got != self.last:
            self.since, self.last = now, got
        return now - self.since >= self.timeout_s

    def reason(self) -> str:
        """What ``status`` shows once the swarm was stopped for it."""
        done = "parked (the next run or job that needs it restores it)" if self.park else "stopped"
        return f"no request for {self.timeout_s:g}s (backend.idle_timeout_s): the idle swarm was {done}"


def idle_snapshot(paths: SwarmPaths, reason: str) -> Snapshot:
    """The snapshot the LB keeps when it parks its idle swarm: what it knows from the swarm's folder (the
    kept config and key file, the LB's address, the submitted jobs). Its engine fingerprint is left empty:
    a restore judges it by the kept config (see :meth:`~prefect_swarm.swarm.Swarm.up`)."""
    record = read_json(paths.slurm_record, {}) or {}
    lb = read_text(paths.lb_head)
    return Snapshot(
        name=paths.root.name,
        backend="slurm",
        fingerprint="",
        replicas=int(record.get("replicas") or 0),
        reason=reason,
        config_file=str(paths.config),
        key_file=str(paths.api_key_file) if paths.api_key_file.exists() else None,
        serving={"lb_head": lb.strip() if lb else None, "replicas_job": record.get("replicas_job")},
    )
