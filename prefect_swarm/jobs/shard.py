"""One shard from start to end: validate the input, open the ledger, run what is left, flush.

Everything that can be refused is refused before the first request: the job class, the
dataset (file, columns, types, unique ids), the fingerprint of an existing checkpoint, and
the endpoint/model. Exit codes are those of :mod:`prefect_swarm.jobs.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from prefect_swarm.budget import final_word, holder_name
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import jobenv
from prefect_swarm.interfaces.jobenv import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, JobEnv
from prefect_swarm.interfaces.readiness import key_refused
from prefect_swarm.jobs.api import SwarmJob, check_reserved, load_job
from prefect_swarm.jobs.checkpoint.fingerprint import fingerprint_details, hash_details, job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import (
    PROGRESS_EVERY_S,
    STATUS_OK,
    RowResult,
    ShardLedger,
    ShardLock,
    pyarrow_without_pandas,
    shard_store,
)
from prefect_swarm.jobs.dispatch import fastjson
from prefect_swarm.jobs.dispatch.cache import Reuse
from prefect_swarm.jobs.dispatch.metrics import ShardMetrics, metrics_address
from prefect_swarm.jobs.dispatch.runner import Item, Runner, RunnerConfig, prefix_key
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.input import InputDataset, open_input, shard_range
from prefect_swarm.jobs.rows.output import check_output_location
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, atomic_write_json, read_json

log = logging.getLogger("prefect_swarm.jobs")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@dataclass(frozen=True)
class Target:
    """Where requests go: endpoint URLs, model name, API key (from the spec, else the environment)."""

    endpoints: list[str]
    model: str | None
    api_key: str | None

    @classmethod
    def resolve(cls, spec: JobSpec, env: JobEnv | None = None, shard: int = 0) -> Target:
        """Spec first; then the job environment (:class:`JobEnv`: endpoints, model, API key).

        The endpoints are rotated by ``shard``: every process of the job picks the least busy
        endpoint, first in its order on a tie, so shard i starts at replica i and the job's
        processes together spread over every replica (not all of them on the first one)."""
        env = env or JobEnv.from_env()
        endpoints = list(spec.endpoints) or list(env.endpoints)
        if not endpoints:
            raise ConfigError(
                f"no endpoint: the spec has none and neither {jobenv.ENDPOINTS} nor {jobenv.ENDPOINT} is set."
            )
        endpoints = [u[:-3] if u.endswith("/v1") else u for u in endpoints]
        k = shard % len(endpoints)
        return cls(endpoints[k:] + endpoints[:k], spec.model or env.model, env.api_key)


def check_key(target: Target) -> None:
    """One request before the rows: ConfigError (exit 2, no row sent) when the swarm refuses the key."""
    refused = key_refused(target.endpoints[0], target.api_key)
    if refused:
        why = "the job has no API key" if not target.api_key else "the job's API key is not the swarm's"
        raise ConfigError(
            f"the swarm at {target.endpoints[0]} refused the job's request ({refused}): {why}. A job started by "
            f"`prefect-swarm job submit` gets the swarm's key itself; a job started otherwise needs "
            f"{jobenv.API_KEY} set to the swarm's api_key. No row was sent."
        )


def resume_command(spec: JobSpec, shard: int, nshards: int) -> str:
    """How to resume a shard that stopped resumable (exit 75): the job process's own command, and
    for a job on a swarm the CLI's resubmission."""
    own = f"`python -m prefect_swarm.jobs.run --spec {spec.paths.spec} --shard-id {shard} --nshards {nshards}`"
    if spec.swarm and spec.job_id:
        return (
            f"`prefect-swarm job submit -n {spec.swarm} --id {spec.job_id}` with the same arguments resumes the job "
            f"(or {own} this shard)"
        )
    return f"{own} resumes it"


def validate_input(spec: JobSpec, job: SwarmJob | None = None) -> InputDataset:
    """Open and check the dataset and the output location for ``spec`` before any request.

    Checks the job class, the input (readable, columns and their types, no column the job needs
    entirely null, unique ids), the output (:func:`check_output_location`: not the input, not
    inside it, writable) and an object-store ledger (writable: a probe object in it).
    Raises ConfigError/DatasetError naming the file. The scans (ids, nulls)
    are stamped in ``<job_dir>/validated.json`` so later shards and reruns skip them.
    """
    job = job or load_job(spec.job, spec.job_kwargs)
    ds = open_input(spec)  # the input's metadata: read once per job, kept in the job folder
    kept = spec.input_columns if spec.input_columns is not None else ds.schema.names
    fingerprint, columns = job_fingerprint(spec, ds), [*kept, *job.outputs]  # another job's dataset there
    check_output_location(spec.output, ds, spec.job_dir, fingerprint=fingerprint, columns=columns)
    if spec.ledger:  # the checkpoints on an object store: proven writable like the output
        storage.check_writable(storage.parse(spec.ledger, "ledger"), "ledger", folder=True)
    ds.check_columns(job.all_columns(), spec.id_column, spec.input_columns)
    check_reserved(f"job {spec.job}: output", job.outputs, "Rename the job's output(s).")
    check_reserved(
        f"input {ds.where}: column", kept, "Rename the column(s), or list the input columns to keep with input_columns."
    )
    for name in job.outputs:
        if name in kept:
            raise ConfigError(
                f"input {ds.path}: column '{name}' would collide with the job's output '{name}'. "
                "Rename it, or list the input columns to keep with input_columns."
            )
    needed = sorted(job.columns())
    stamp = {"input": ds.identity(), "id_column": spec.id_column, "needed": needed}
    paths = spec.paths if spec.job_dir else None
    if paths is None or read_json(paths.validated) != stamp:
        ds.check_has_values(needed)
        ds.check_unique_ids(spec.id_column)
        if paths is not None:
            atomic_write_json(paths.ensure().validated, stamp)
    return ds


class ShardRun:
    """Shard ``shard_id`` of ``nshards`` of ``spec``: owns the ledger, the runner and the signal handlers."""

    def __init__(self, spec: JobSpec, shard_id: int, nshards: int, *, metrics: ShardMetrics | None = None) -> None:
        """``metrics``: counters already serving (a caller that scrapes them after the run); by default
        the run serves its own ``/metrics`` on a free port for as long as it runs."""
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
            store=shard_store(spec, shard_id),
        )
        self.runner: Runner | None = None
        self._progress_at = 0.0  # when the last progress file between checkpoints was queued
        self.answers = [0, 0.0, 0, 0]
        """Answers this run: count, latency sum (s), completion tokens sum, longest (tokens): a running
        projection's tail (see :func:`~prefect_swarm.config.cost.job_projection`)."""
        self.admission = (
            spec.budget.admission(holder_name(spec.job_id or spec.paths.root.name, shard_id)) if spec.budget else None
        )
        """The swarm's budget, asked by the runner before every request (:mod:`prefect_swarm.budget`): held
        here, in the job process, so a detached job stops at the cap with nobody waiting on it."""
        self.metrics = metrics or ShardMetrics(spec.job_id or spec.paths.root.name, shard_id)
        self.metrics.ledger = self.ledger
        self._own_metrics = metrics is None
        self.reuse: Reuse | None = None
        """Identical requests sent once, and the response cache (:mod:`prefect_swarm.jobs.dispatch.cache`);
        None: off."""

    def run(self, *, overwrite: bool = False) -> int:
        """Run the shard; return the exit code (0 done, 75 stopped resumable: see :meth:`_stop_resumable`).

        Holds the shard's lock for the whole run: a second process for the same shard raises
        :class:`~prefect_swarm.jobs.checkpoint.ledger.ShardBusy` (exit 2) before touching the ledger.
        """
        lock = ShardLock(self.ledger.paths)
        lock.acquire(f"shard {self.shard_id} of job {self.spec.job_id or self.spec.paths.root.name}")
        try:
            self._serve_metrics()
            return self._run(overwrite)
        finally:
            if self._own_metrics:
                self.metrics.close()
            lock.release()

    def _serve_metrics(self) -> None:
        """Serve ``/metrics`` (unless the caller does) and publish its URL in the progress file."""
        addr = metrics_address(self.spec.metrics_host, self.spec.endpoints or JobEnv.from_env().endpoints)
        if self._own_metrics and addr is not None:
            try:
                self.metrics.serve(addr)
            except OSError as exc:  # metrics are a view: a shard runs without them
                log.warning("shard %d: could not serve /metrics (%s); running without", self.shard_id, exc)
        if self.metrics.url:
            self.ledger.progress_extra["metrics_url"] = self.metrics.url

    def _run(self, overwrite: bool) -> int:
        self.ledger.open(overwrite=overwrite, retry_failed=self.spec.retry_failed)
        if not self.spec.id_column:
            log.info("shard %d: no id_column: each row's id is its position in the input (0-based)", self.shard_id)
        if self.ledger.complete:
            log.info(
                "shard %d: all %d rows already in the ledger; nothing to send",
                self.shard_id,
                self.ledger.total,
            )
            return self._finish()
        target = Target.resolve(self.spec, shard=self.shard_id)
        check_key(target)
        log.info(
            "shard %d/%d: rows %d..%d, %d left, endpoints %s, model %s",
            self.shard_id,
            self.nshards,
            self.start,
            self.end,
            self.ledger.n_left,
            ",".join(target.endpoints),
            target.model,
        )
        self.ledger.write_progress("running")
        self.reuse = Reuse.of(self.spec, self.job, self.ledger.keep_raw)
        try:
            with fewer_gc_pauses():
                finished = asyncio.run(self._run_async(target))
        except BaseException:
            self._count_requests()
            with contextlib.suppress(Exception):  # what was answered reaches the disk before the error propagates
                self.ledger.flush("failed")
            raise
        finally:
            if self.reuse is not None:
                self.reuse.close()  # the answers not yet in the response cache
            if self.admission is not None:
                self.admission.close()  # what was reserved and not answered counts as spent
        self._count_requests()
        if not finished:
            return self._stop_resumable()
        return self._finish()

    def _stop_resumable(self) -> int:
        """Stopped before every row was sent (a signal, an outage past ``outage_timeout_s``, the
        swarm's budget): flush, record why in the progress file (``stopped``: what `job status`
        shows), say how to resume; exit 75."""
        runner = self.runner
        cause = runner.stop_reason if runner and runner.stop_reason else None
        at_cap = self.admission is not None and self.admission.reached is not None
        kind = "budget" if at_cap else "outage" if cause else "signal"
        message = self._spent_at_exit() if at_cap else cause or "stopped by a signal"
        self.ledger.progress_extra["stopped"] = {"cause": kind, "message": message}
        self.ledger.flush("requeue")
        log.warning(
            "shard %d: %s; flushed %d/%d rows; exit %d (resumable: %s)",
            self.shard_id,
            message,
            self.ledger.n_done,
            self.ledger.total,
            EXIT_REQUEUE,
            resume_command(self.spec, self.shard_id, self.nshards),
        )
        return EXIT_REQUEUE

    def _finish(self) -> int:
        self.ledger.flush("done" if self.ledger.complete else "incomplete")
        if not self.ledger.complete:
            log.error("shard %d ended with rows missing from the ledger", self.shard_id)
            return EXIT_FAILED
        self.ledger.mark_done()
        log.info("shard %d done: %d rows, %d failed", self.shard_id, self.ledger.n_done, self.ledger.n_failed)
        self._write_output()
        return self._auto_commit()

    def _write_output(self) -> None:
        """A dataset output: write this shard's part files now, in parallel with the other shards, so
        the commit only publishes (a failure is left to the commit, which writes what is missing)."""
        from prefect_swarm.jobs.rows.commit import write_shard_output

        if self.nshards != self.spec.shards:
            return
        try:
            record = write_shard_output(self.spec, self.shard_id)
        except Exception as exc:
            log.warning(
                "shard %d: its part of the output was not written (the commit writes it): %s", self.shard_id, exc
            )
            return
        if record is not None:
            log.info("shard %d: %d output file(s) written for the commit", self.shard_id, len(record["files"]))

    def _auto_commit(self) -> int:
        from prefect_swarm.jobs.checkpoint.plan import pending_shards
        from prefect_swarm.jobs.rows.commit import commit_output, manifest_verdict

        spec = self.spec.model_copy(update={"retry_failed": False})
        if not spec.auto_commit or self.nshards != spec.shards or pending_shards(spec):
            return EXIT_OK
        manifest = commit_output(spec)
        verdict = manifest_verdict(manifest, spec.max_failed_fraction)
        (log.info if verdict.succeeded else log.error)("committed %s: %s", manifest["output"], verdict.message())
        return EXIT_OK

    async def _run_async(self, target: Target) -> bool:
        spec = self.spec
        cfg = RunnerConfig(
            concurrency=spec.concurrency,
            replica_capacity=spec.replica_capacity,
            nshards=self.nshards,
            replicas_file=spec.replicas_file,
            parked_file=spec.parked_file,
            max_retries=spec.max_retries,
            backoff_base_s=spec.backoff_base_s,
            backoff_max_s=spec.backoff_max_s,
            request_timeout_s=spec.request_timeout_s,
            connect_timeout_s=spec.connect_timeout_s,
            adaptive=spec.adaptive_concurrency,
            drain_seconds=spec.drain_seconds,
            keep_raw=self.ledger.keep_raw or (self.reuse is not None and self.reuse.wants_raw),
            outage_timeout_s=spec.outage_timeout_s,
            requests_per_minute=spec.requests_per_minute,
            tokens_per_minute=spec.tokens_per_minute,
        )
        self.runner = runner = Runner(
            self.job,
            target.endpoints,
            cfg,
            self._on_result,
            api_key=target.api_key,
            on_tick=self._on_tick,
            tick_s=min(0.25, spec.checkpoint_seconds / 4),  # a due checkpoint is at most a quarter late
            admission=self.admission,
        )
        self.metrics.runner = runner
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

    def _on_result(self, r: RowResult) -> None:
        if r.status == "ok" and r.latency_ms:
            n, seconds, tokens, longest = self.answers
            self.answers = [
                n + 1,
                seconds + r.latency_ms / 1000,
                tokens + r.completion_tokens,
                max(longest, r.completion_tokens),
            ]
        self.ledger.add(r)
        self.metrics.observe(r)
        if self.reuse is not None:
            for copy in self.reuse.settle(r):  # rows that asked the same while r's request was in flight
                self.ledger.add(copy)
                self.metrics.observe(copy)
        if self.ledger.buffered >= self.spec.checkpoint_every:
            self._flush()

    def _on_tick(self) -> None:
        now = time.monotonic()
        if now - self.ledger.last_flush >= self.spec.checkpoint_seconds:
            self._flush()
        elif now - max(self.ledger.last_flush, self._progress_at) >= PROGRESS_EVERY_S and self.ledger.buffered:
            self._progress_at = now  # progress is not a checkpoint: the rows answered so far, every few seconds
            self._count_requests()
            self.ledger.progress_in_background()

    def _spent_at_exit(self) -> str:
        """This process's word on the budget as it exits: the swarm's spend now, the cap, its rows left."""
        budget = self.spec.budget
        assert budget is not None
        spent = budget.token_account().spent() if budget.account else None
        hours = None if budget.account else budget.used()
        cost, left = budget.cost, self.ledger.n_left
        return final_word(budget.swarm, cost, spent_usd=spent, gpu_hours=hours, shape=budget.shape, rows_left=left)

    def _flush(self) -> None:
        """A checkpoint while requests run: written on the ledger's writer thread, off the event loop."""
        self._count_requests()
        self.ledger.flush_in_background()
        if self.reuse is not None:
            self.reuse.flush()

    def _count_requests(self) -> None:
        """The progress file's counts of this run: requests sent (and in flight now: what a running
        projection adds to the rows answered, see :func:`~prefect_swarm.config.cost.job_projection`),
        the answers' mean latency and mean and longest length (the projection's tail), rows answered
        without one."""
        if self.runner:
            self.ledger.requests = self.runner.requests
            self.ledger.progress_extra["in_flight"] = self.runner.pool.inflight
        n, seconds, tokens, longest = self.answers
        if n:
            self.ledger.progress_extra["answers"] = {
                "latency_mean_s": round(seconds / n, 3),
                "tokens_mean": round(tokens / n, 1),
                "tokens_longest": longest,
            }
        if self.reuse is not None:
            self.ledger.progress_extra.update(self.reuse.counts())

    def _items(self, model: str | None) -> Iterator[Item | RowResult]:
        """Rows of this shard not in the ledger, as prepared requests, in input order.

        A row with a null in a column the job needs becomes an error row; no request is sent for it.
        With :attr:`reuse`, a read batch's requests go through it: identical ones are sent once, and a
        row may come answered (a RowResult: an identical row's answer, the response cache's).
        """
        job, spec, ledger = self.job, self.spec, self.ledger
        cols = list(job.all_columns())
        needed = list(job.columns())
        if spec.id_column and spec.id_column not in cols:
            cols.append(spec.id_column)
        begin = self.start + ledger.first_pending()  # the rows before it are done: not even decoded
        for first, batch in self.ds.iter_range(begin, self.end, cols, spec.read_batch_rows):
            rel0 = first - self.start
            pending = ledger.pending(rel0, rel0 + batch.num_rows).tolist()
            if not pending:
                continue
            if len(pending) < batch.num_rows:
                batch = batch.take(pending)
            ids = batch.column(spec.id_column).to_pylist() if spec.id_column else None
            nulls = _null_rows(batch, needed)
            prepare, reuse = self._prepare, self.reuse
            keyed: list[tuple[Item, bytes]] = []
            for j, row in enumerate(self._job_rows(batch, first, first + pending[-1])):
                idx = first + pending[j]
                rid = str(ids[j]) if ids is not None else str(idx)
                if nulls and j in nulls:
                    self._refuse(idx, rid, f"column '{nulls[j]}' is null in this row; no request sent")
                    continue
                if row is None:  # dropped by the job before any request (DataFrameJob.prepare): not a failure
                    dropped = RowResult(idx, rid, STATUS_OK)
                    ledger.add(dropped)
                    self.metrics.observe(dropped)  # an ok row of the output: counted, so ok + failed == rows
                    continue
                prepared = prepare(job, row, idx, rid, model)
                if prepared is None:
                    continue
                if reuse is None:
                    yield prepared[0]
                else:
                    keyed.append((prepared[0], reuse.key(prepared[0].path, prepared[1])))
            if reuse is not None and keyed:
                yield from reuse.resolve(keyed)

    def _job_rows(self, batch: pa.RecordBatch, first: int, last: int) -> list[dict | None]:
        """``job.rows(batch)`` (a DataFrameJob's ``prepare``); what it raises is the job's refusal of these
        rows: ConfigError (exit 2) naming the job, the rows and the cause (the traceback goes to the log)."""
        try:
            return self.job.rows(batch)
        except Exception as exc:
            log.error("the job's rows()/prepare raised on input rows %d..%d:", first, last, exc_info=True)
            raise ConfigError(
                f"{type(self.job).__name__} refused input rows {first}..{last} (its rows()/"
                f"prepare raised {type(exc).__name__}: {exc}). Rows answered before these are kept in the "
                "ledger: fix the job class and submit the job again to resume."
            ) from exc

    def _prepare(
        self, job: SwarmJob, row: dict, idx: int, rid: str, model: str | None
    ) -> tuple[Item, dict[str, Any]] | None:
        """The row's request and its body; None when it could not be built (an error row)."""
        try:
            body = job.body(row)
            if model and "model" not in body:
                body["model"] = model
            data = fastjson.dumps(body)
            return Item(idx, rid, job.route(row), data, prefix_key(data) if self.spec.prefix_affinity else 0), body
        except Exception as exc:  # one bad row is an error row, not a dead shard
            self._refuse(idx, rid, f"could not build the request: {type(exc).__name__}: {exc}")
            return None

    def _refuse(self, idx: int, rid: str, error: str) -> None:
        """An error row for which no request is sent."""
        self.ledger.add(RowResult.refused(idx, rid, error))
        self.metrics.refused()


@contextlib.contextmanager
def fewer_gc_pauses(gen0: int = 10_000) -> Iterator[None]:
    """While requests run: the objects of the start-up (imports, dataset, job) frozen out of the cyclic
    GC, and young collections every ``gen0`` allocations instead of 700.

    Each answer allocates a few dozen objects that live until the next checkpoint, so with the
    defaults the collector ran ~450 times per 30,000 rows and took ~10% of the loop's time at 256 in
    flight (measured in BENCHMARKS.md); every collection delays every answer waiting in the loop.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def _null_rows(batch: pa.RecordBatch, columns: list[str]) -> dict[int, str]:
    """Rows of ``batch`` (by position) with a null in one of ``columns``, and that column."""
    found: dict[int, str] = {}
    for name in columns:
        col = batch.column(name)
        if col.null_count:
            for j in np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False)).tolist():
                found.setdefault(j, name)
    return found


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
    shard = ShardRun(spec, shard_id, nshards)  # the job's module first: one that imports pandas keeps it
    pyarrow_without_pandas()
    return shard.run(overwrite=overwrite)
