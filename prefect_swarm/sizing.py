"""A job's size from its swarm: what each replica can batch, the swarm's replica list, how many shards.

Called where a spec is aimed at a swarm (the CLI's submit, the flow's plan), before the job id is
made (the shard count is part of it). Explicit choices win: a ``concurrency`` or ``shards`` given by
the user is kept (``shards`` counts as given once set on the spec); only what is left unset is sized.

How many job processes: one asyncio process drives ~7,000 rows/s of short answers on one core
(BENCHMARKS.md, "Job runner" (a): ~140 µs of client CPU a row) and holds a few thousand requests in
flight without cost, while a replica running 256 sequences of 32 tokens answers ~290 rows/s (a GPU
with longer answers, far fewer). So one process is never the limit for the replicas' speed until
many replicas; the in-flight count is what grows with the swarm: one process per
:data:`PROCESS_INFLIGHT` requests in flight (8 replicas of 256 + 16: 1 process; 64 such replicas: 5),
never more than one per :data:`MIN_ROWS_PER_SHARD` rows.
"""

from __future__ import annotations

import math

from prefect_swarm.backends.registry import entry_of
from prefect_swarm.config import ExternalConfig, SwarmConfig
from prefect_swarm.jobs.dispatch.control import queue_margin
from prefect_swarm.jobs.dispatch.metrics import AUTO_HOST
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import SwarmPaths

PROCESS_INFLIGHT = 4096
"""Requests in flight one job process is given before the job gets another process."""
MIN_ROWS_PER_SHARD = 1000
"""A shard is not worth a process below this many rows."""


def swarm_inflight(cfg: SwarmConfig) -> int:
    """Requests in flight that keep every replica of ``cfg`` full with a short queue."""
    capacity = cfg.engine.batch_capacity()
    return cfg.replicas * (capacity + queue_margin(capacity))


def auto_shards(cfg: SwarmConfig, rows: int | None = None) -> int:
    """Job processes for a job on ``cfg``'s swarm (see the module doc)."""
    shards = max(1, math.ceil(swarm_inflight(cfg) / PROCESS_INFLIGHT))
    if rows is not None:
        shards = min(shards, max(1, rows // MIN_ROWS_PER_SHARD))
    return shards


def size_for_swarm(spec: JobSpec, cfg: SwarmConfig) -> JobSpec:
    """``spec`` with what the swarm decides filled in: the replicas' capacity (None when the config does
    not declare it: each job process then finds it from the replicas' /metrics), the swarm's replica list,
    and the shard count unless it was set (the input's row count is read only when more than one
    process is in question, through :func:`~prefect_swarm.jobs.rows.input.open_input`: from the metadata
    kept with the job when it has a job folder, no footer read)."""
    update: dict[str, object] = {
        "replica_capacity": cfg.engine.declared_capacity(),
        "replicas_file": str(SwarmPaths.of(cfg.name, cfg.run_dir).metrics_targets),
        "parked_file": str(SwarmPaths.of(cfg.name, cfg.run_dir).parked),
    }
    if "shards" not in spec.model_fields_set:
        shards = auto_shards(cfg)
        if shards > 1:
            from prefect_swarm.jobs.rows.input import open_input

            shards = auto_shards(cfg, open_input(spec).num_rows)
        update["shards"] = shards
    if entry_of(cfg.backend).client_limits:
        update.update(external_limits(spec, cfg.backend, int(update.get("shards", spec.shards))))  # type: ignore[call-overload, arg-type]
    return spec.model_copy(update=update)


def external_limits(spec: JobSpec, ext: ExternalConfig, shards: int) -> dict[str, object]:
    """What an external swarm's limits make of a job: the in-flight cap split over the shards, the rate
    limits (the lower of the job's and the swarm's wins), and the job's /metrics on loopback (its
    processes run on this machine; the endpoint is not)."""
    update: dict[str, object] = {
        "requests_per_minute": _lower(spec.requests_per_minute, ext.requests_per_minute),
        "tokens_per_minute": _lower(spec.tokens_per_minute, ext.tokens_per_minute),
    }
    if ext.max_concurrency is not None:
        share = max(1, ext.max_concurrency // max(1, shards))
        update["concurrency"] = min(spec.concurrency or share, share)
        update["replica_capacity"] = ext.max_concurrency
    if spec.metrics_host == AUTO_HOST:
        update["metrics_host"] = "127.0.0.1"
    return update


def _lower(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)
