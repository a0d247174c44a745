"""What is left to do, read from the ledger: pending shards and each shard's progress.

Cheap (reads small per-shard JSON files and the input's metadata kept in the job folder, never
the input's footers), so the Prefect layer, ``job status`` and ``wait`` can call it on every poll.
"""

from __future__ import annotations

from typing import Any

from prefect_swarm.jobs.checkpoint.fingerprint import fingerprint_details, hash_details, job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import check_resumable, shard_store
from prefect_swarm.jobs.rows.input import InputDataset, input_rows, open_input, shard_range
from prefect_swarm.jobs.spec import JobSpec


def shard_done(spec: JobSpec, i: int, fingerprint: str | None = None) -> bool:
    """Shard ``i`` has every row in its ledger, under the job's current fingerprint.

    With ``retry_failed`` a shard holding error rows is not done.
    """
    store = shard_store(spec, i)
    marker = store.read_text(store.paths.done_marker.name)
    if marker is None or marker.strip() != (fingerprint or job_fingerprint(spec)):
        return False
    if spec.retry_failed:
        return int((store.read_json(store.paths.progress.name) or {}).get("failed", 1)) == 0
    return True


def pending_shards(spec: JobSpec) -> list[int]:
    """Shards of ``spec`` that still have rows to run (all of them for a fresh job)."""
    fp = job_fingerprint(spec)
    return [i for i in range(spec.shards) if not shard_done(spec, i, fp)]


def recorded_progress(spec: JobSpec, i: int) -> dict[str, Any]:
    """Shard ``i``'s progress as its job process last wrote it, wherever the ledger lives ({} before it ran)."""
    store = shard_store(spec, i)
    return dict(store.read_json(store.paths.progress.name) or {})


def shard_marked_done(spec: JobSpec, i: int) -> bool:
    """Shard ``i``'s ledger carries its DONE marker (under whichever fingerprint)."""
    store = shard_store(spec, i)
    return store.read_text(store.paths.done_marker.name) is not None


def shard_progress(spec: JobSpec, i: int, rows: int | InputDataset | None = None) -> dict[str, Any]:
    """Progress of shard ``i``: state, done, failed, total, tokens, rate (``state`` pending if never run).

    ``rows``: the input's rows, or the input opened (default: as kept with the job, :func:`input_rows`)."""
    data = recorded_progress(spec, i)
    if data:
        return data
    if rows is None:
        rows = input_rows(spec)
    start, end = shard_range(rows if isinstance(rows, int) else rows.num_rows, i, spec.shards)
    return {
        "shard": i,
        "nshards": spec.shards,
        "state": "pending",
        "total": end - start,
        "done": 0,
        "failed": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "rate_rows_s": 0.0,
    }


REUSE_COUNTS = ("requests", "cache_hits", "deduplicated")
"""Counts of the shards' last runs summed in :func:`job_progress`: requests sent, rows answered from the
response cache, rows answered by an identical row's request."""


def job_progress(spec: JobSpec) -> dict[str, Any]:
    """Every shard's progress and the sums (done, failed, total, tokens, rate, and :data:`REUSE_COUNTS`)."""
    progress = [recorded_progress(spec, i) for i in range(spec.shards)]
    rows = input_rows(spec) if not all(progress) else None  # a shard never run: its row range
    shards = [p or shard_progress(spec, i, rows) for i, p in enumerate(progress)]
    total: dict[str, Any] = {
        k: sum(int(s.get(k) or 0) for s in shards)
        for k in ("done", "failed", "total", "prompt_tokens", "completion_tokens", "recovered")
    }
    for k in REUSE_COUNTS:  # this run's: the requests sent, the rows answered without one (jobs.cache)
        total[k] = sum(int(s.get(k) or 0) for s in shards)
    total["rate_rows_s"] = round(
        sum(float(s.get("rate_rows_s") or 0) for s in shards if s.get("state") == "running"), 2
    )
    return {**total, "shards": shards}


def recovered_text(shard_results: list[dict[str, Any]]) -> str:
    """Rows answered on a retry after failing before, with the reasons they had failed with (the shards'
    ledgers count them: an answered row's output has no error), e.g. ``3 rows answered on a retry after
    failing before (earlier reasons: HTTP 503: overloaded x3)``; '' when none."""
    reasons: dict[str, int] = {}
    for r in shard_results:
        for reason, n in (r.get("recovered_reasons") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + int(n)
    if not reasons:
        return ""
    shown = "; ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return f"{sum(reasons.values())} rows answered on a retry after failing before (earlier reasons: {shown})"


def check_resume(spec: JobSpec) -> None:
    """Refuse (FingerprintMismatch, with what changed and the --overwrite hint) a job whose existing
    checkpoints were written with other settings, before anything is submitted or rewritten."""
    if not spec.job_dir or (not spec.ledger and not spec.paths.shards_root().exists()):
        return
    ds = open_input(spec)
    details = fingerprint_details(spec, ds)
    fingerprint = hash_details(details)
    for i in range(spec.shards):
        start, end = shard_range(ds.num_rows, i, spec.shards)
        stamp = {"fingerprint": fingerprint, "details": details, "shard": i, "start": start, "end": end}
        check_resumable(shard_store(spec, i), stamp)
