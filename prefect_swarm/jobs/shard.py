"""One shard from start to end: validate the input, open the ledger, run what is left, flush.

Everything that can be refused is refused before the first request: the job class, the
dataset (file, columns, types, unique ids), the fingerprint of an existing checkpoint, and
the endpoint/model. Exit codes are those of :mod:`prefect_swarm.jobs.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs import fastjson
from prefect_swarm.jobs.api import SwarmJob, load_job
from prefect_swarm.jobs.dataset import InputDataset, shard_range
from prefect_swarm.jobs.fingerprint import fingerprint_details, hash_details
from prefect_swarm.jobs.ledger import STATUS_ERROR, ShardLedger
from prefect_swarm.jobs.runner import Item, Result, Runner, RunnerConfig
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, atomic_write_json, read_json

log = logging.getLogger("prefect_swarm.jobs")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REQUEUE = 0, 1, 2, 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@dataclass(frozen=True)
class Target:
    """Where requests go: endpoint URLs, model name, API key (from the spec, else the environment)."""

    endpoints: list[str]
    model: str | None
    api_key: str | None

    @classmethod
    def resolve(cls, spec: JobSpec) -> Target:
        """Spec first; then env PREFECT_SWARM_ENDPOINTS (comma-separated), ENDPOINT, MODEL, API key."""
        endpoints = list(spec.endpoints)
        if not endpoints:
            raw = os.environ.get("PREFECT_SWARM_ENDPOINTS") or os.environ.get("ENDPOINT") or ""
            endpoints = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]
        if not endpoints:
            raise ConfigError(
                "no endpoint: the spec has none and neither PREFECT_SWARM_ENDPOINTS nor ENDPOINT is set."
            )
        endpoints = [u[:-3] if u.endswith("/v1") else u for u in endpoints]
        return cls(endpoints, spec.model or os.environ.get("MODEL"), os.environ.get("PREFECT_SWARM_API_KEY"))


def validate_input(spec: JobSpec, job: SwarmJob | None = None) -> InputDataset:
    """Open and check the dataset for ``spec`` (columns, types, unique ids) before any request.

    The unique-id scan is stamped in ``<job_dir>/validated.json`` so later shards and reruns skip it.
    """
    job = job or load_job(spec.job, spec.job_kwargs)
    ds = InputDataset(spec.input)
    ds.check_columns(job.all_columns(), spec.id_column, spec.input_columns)
    for name in job.outputs:
        if name in (spec.input_columns if spec.input_columns is not None else ds.schema.names):
            raise ConfigError(
                f"input {ds.path}: column '{name}' would collide with the job's output '{name}'. "
                "Rename it, or list the input columns to keep with input_columns."
            )
    stamp = {"input": ds.identity(), "id_column": spec.id_column}
    paths = spec.paths if spec.job_dir else None
    if paths is None or read_json(paths.validated) != stamp:
        ds.check_unique_ids(spec.id_column)
        if paths is not None:
            atomic_write_json(paths.ensure().validated, stamp)
    return ds


class ShardRun:
    """Shard ``shard_id`` of ``nshards`` of ``spec``: owns the ledger, the runner and the signal handlers."""

    def __init__(self, spec: JobSpec, shard_id: int, nshards: int) -> None:
        self.spec, self.shard_id, self.nshards = spec, shard_id, nshards
        self.job = load_job(spec.job, spec.job_kwargs)
        self.ds = validate_input(spec, self.job)
        self.start, self.end = shard_range(self.ds.num_rows, shard_id, nshards)
        details = fingerprint_details(spec, self.ds)
        self.ledger = ShardLedger(
            JobPaths(spec.paths.root).shard(shard_id),
            shard=shard_id,
            nshards=nshards,
            start=self.start,
            end=self.end,
            fingerprint=hash_details(details),
            details=details,
            outputs=self.job.outputs,
            keep_raw=spec.output_format == "openai-batch",
        )
        self.runner: Runner | None = None

    def run(self, *, overwrite: bool = False) -> int:
        """Run the shard; return the exit code (0 done, 75 stopped by a signal)."""
        self.ledger.open(overwrite=overwrite, retry_failed=self.spec.retry_failed)
        if self.ledger.complete:
            log.info(
                "shard %d: all %d rows already in the ledger; nothing to send",
                self.shard_id,
                self.ledger.total,
            )
            return self._finish()
        target = Target.resolve(self.spec)
        log.info(
            "shard %d/%d: rows %d..%d, %d left, endpoints %s, model %s",
            self.shard_id,
            self.nshards,
            self.start,
            self.end,
            int((~self.ledger.done).sum()),
            ",".join(target.endpoints),
            target.model,
        )
        self.ledger.write_progress("running")
        try:
            finished = asyncio.run(self._run_async(target))
        except BaseException:
            with contextlib.suppress(Exception):
                self.ledger.join()  # parts already queued still reach the disk before the error propagates
            raise
        self.ledger.requests = self.runner.requests if self.runner else 0
        if not finished:
            self.ledger.flush("requeue")
            log.warning(
                "shard %d: stopped by a signal; flushed %d/%d rows; exit %d (requeue)",
                self.shard_id,
                self.ledger.n_done,
                self.ledger.total,
                EXIT_REQUEUE,
            )
            return EXIT_REQUEUE
        return self._finish()

    def _finish(self) -> int:
        self.ledger.flush("done" if self.ledger.complete else "incomplete")
        if not self.ledger.complete:
            log.error("shard %d ended with rows missing from the ledger", self.shard_id)
            return EXIT_FAILED
        self.ledger.mark_done()
        log.info("shard %d done: %d rows, %d failed", self.shard_id, self.ledger.n_done, self.ledger.n_failed)
        return self._auto_commit()

    def _auto_commit(self) -> int:
        from prefect_swarm.jobs.commit import commit_output
        from prefect_swarm.jobs.plan import pending_shards

        spec = self.spec.model_copy(update={"retry_failed": False})
        if not spec.auto_commit or self.nshards != spec.shards or pending_shards(spec):
            return EXIT_OK
        manifest = commit_output(spec)
        log.info(
            "committed %s: %s rows (%s failed)", manifest["output"], manifest["rows"], manifest["failed"]
        )
        return EXIT_OK

    async def _run_async(self, target: Target) -> bool:
        spec = self.spec
        cfg = RunnerConfig(
            concurrency=spec.concurrency,
            max_retries=spec.max_retries,
            backoff_base_s=spec.backoff_base_s,
            backoff_max_s=spec.backoff_max_s,
            request_timeout_s=spec.request_timeout_s,
            connect_timeout_s=spec.connect_timeout_s,
            adaptive=spec.adaptive_concurrency,
            drain_seconds=spec.drain_seconds,
            keep_raw=self.ledger.keep_raw,
        )
        self.runner = runner = Runner(
            self.job,
            target.endpoints,
            cfg,
            self._on_result,
            api_key=target.api_key,
            on_tick=self._on_tick,
            tick_s=min(1.0, spec.checkpoint_seconds),
        )
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        if _EARLY_SIGNALS:
            self._on_signal(signal.Signals(_EARLY_SIGNALS[0]))
        try:
            return await runner.run(self._items(target.model))
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.warning("shard %d: %s received: no new requests; flushing finished rows", self.shard_id, sig.name)
        if self.runner:
            self.runner.request_stop()

    def _on_result(self, r: Result) -> None:
        it = r.item
        self.ledger.add(
            it.row,
            it.rid,
            r.status,
            r.error,
            r.http_status,
            r.prompt_tokens,
            r.completion_tokens,
            r.latency_ms,
            r.attempts,
            r.outputs,
            r.raw,
        )
        if self.ledger.buffered >= self.spec.checkpoint_every:
            self._flush()

    def _on_tick(self) -> None:
        if time.monotonic() - self.ledger.last_flush >= self.spec.checkpoint_seconds:
            self._flush()

    def _flush(self) -> None:
        """A checkpoint while requests run: written on the ledger's writer thread, off the event loop."""
        if self.runner:
            self.ledger.requests = self.runner.requests
        self.ledger.flush_in_background()

    def _items(self, model: str | None) -> Iterator[Item]:
        """Rows of this shard not in the ledger, as prepared requests, in input order."""
        job, spec, ledger = self.job, self.spec, self.ledger
        cols = list(job.all_columns())
        if spec.id_column and spec.id_column not in cols:
            cols.append(spec.id_column)
        for first, batch in self.ds.iter_range(self.start, self.end, cols, spec.read_batch_rows):
            rel0 = first - self.start
            pending = np.flatnonzero(~ledger.done[rel0 : rel0 + batch.num_rows]).tolist()
            if not pending:
                continue
            if len(pending) < batch.num_rows:
                batch = batch.take(pending)
            ids = batch.column(spec.id_column).to_pylist() if spec.id_column else None
            prepare = self._prepare
            for j, row in enumerate(batch.to_pylist()):
                idx = first + pending[j]
                item = prepare(job, row, idx, str(ids[j]) if ids is not None else str(idx), model)
                if item is not None:
                    yield item

    def _prepare(self, job: SwarmJob, row: dict, idx: int, rid: str, model: str | None) -> Item | None:
        try:
            body = job.body(row)
            if model and "model" not in body:
                body["model"] = model
            return Item(idx, rid, job.route(row), fastjson.dumps(body))
        except Exception as exc:  # one bad row is an error row, not a dead shard
            self.ledger.add(
                idx,
                rid,
                STATUS_ERROR,
                f"could not build the request: {type(exc).__name__}: {exc}",
                0,
                0,
                0,
                0.0,
                0,
                None,
                None,
            )
            return None


_EARLY_SIGNALS: list[int] = []


def _remember_signal(signum: int, _frame: object) -> None:
    _EARLY_SIGNALS.append(signum)


def run_shard(spec: JobSpec, shard_id: int, nshards: int, *, overwrite: bool = False) -> int:
    """Run one shard of ``spec``; return the process exit code (see :mod:`prefect_swarm.jobs.run`).

    A stop signal that arrives while the input is still being validated is remembered and
    honoured as soon as the runner starts (no request is sent; exit 75).
    """
    with contextlib.suppress(ValueError):  # not the main thread: signals are the caller's business
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, _remember_signal)
    return ShardRun(spec, shard_id, nshards).run(overwrite=overwrite)
