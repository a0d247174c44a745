"""The batch service's runner: each accepted batch becomes a job on its model's swarm, through the
one control-plane path (:mod:`prefect_swarm.launch`), and its results become the batch's files.

A thread wakes every ``poll_s`` (or at once when a batch is created or cancelled) and moves each
batch in flight one step; every step reads the state it needs from the service's database and the
job's ledger, so a service killed at any point and started again continues where it was:

- ``validating`` (the file passed the checks): the model's swarm is held (:class:`SwarmPool`:
  brought up on demand, shared by that model's batches); the job is submitted with id = the batch
  id, so a resubmit after a crash attaches to the running job or resumes its checkpoint, never runs
  a line twice; then ``in_progress``.
- ``in_progress``: ``request_counts`` follow the job's progress; when every line is answered (the
  job committed its output) the batch is ``finalizing``: the output is split into the output and
  error files (:mod:`prefect_swarm.batchserver.output`), recorded with the ``completed`` object
  in one transaction.
- cancel, or the ``completion_window`` passing: the job's processes are stopped (they flush their
  checkpoints); once none runs, what was answered goes to the files and every other line becomes an
  error line (``batch_cancelled``/``batch_expired``); ``cancelled``/``expired``.
- a job whose processes ended without finishing (a replica lost, preempted) is resumed from its
  checkpoint up to ``max_resubmits`` times; past that the batch ends ``failed`` with what was
  answered in its files.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect_swarm.batchserver.config import LoadedService
from prefect_swarm.batchserver.output import Split, committed_lines, split_lines, stopped_lines
from prefect_swarm.batchserver.store import BatchRow, FileRow, ServiceStore, derived_id
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import JobStatus, jobenv
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import home_dir
from prefect_swarm.state import StateStore

log = logging.getLogger("prefect_swarm.batchserver")

TERMINAL_JOB = frozenset({JobStatus.FAILED, JobStatus.PREEMPTED, JobStatus.CANCELLED})
"""Job states in which no process runs but the lines may not all be answered."""


class SwarmPool:
    """One swarm per model: held by this service (a lease of its process) from the first batch that
    needs it, shared by every batch of that model, let go ``idle_release_s`` after the last one ended.
    Bring-ups run in the background; :meth:`ready` answers at once."""

    def __init__(self, svc: LoadedService, store: StateStore) -> None:
        from prefect_swarm.state import process_lease

        self.svc = svc
        self.holding = default_holding(store)
        self.lease = process_lease(owner=f"batch-service:{os.uname().nodename}:{os.getpid()}")
        self._pending: dict[str, Future[Any]] = {}
        self._swarms: dict[str, Any] = {}
        self._last_used: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="swarm-up")

    def touch(self, model: str) -> None:
        """A batch of ``model`` is in flight: its swarm is not idle."""
        self._last_used[model] = time.monotonic()

    def ready(self, model: str) -> Any:
        """The model's swarm when it is up and held; None while it is being brought up. A failed
        bring-up raises its error once (the next call tries again)."""
        self.touch(model)
        if model in self._swarms:
            return self._swarms[model]
        fut = self._pending.get(model)
        if fut is None:
            self._pending[model] = self._pool.submit(self._bring_up, model)
            return None
        if not fut.done():
            return None
        del self._pending[model]
        self._swarms[model] = fut.result()  # raises the bring-up's error
        return self._swarms[model]

    def _bring_up(self, model: str) -> Any:
        from prefect_swarm.swarm import Swarm

        swarm = Swarm(self.svc.swarms[model], store=self.holding.store, delete_on_exit=False)
        return self.holding.bring_up(swarm, self.lease, wait=True).swarm

    def release_idle(self, busy: set[str]) -> None:
        """Let go of the swarms no batch has needed for ``idle_release_s``."""
        now = time.monotonic()
        for model in list(self._swarms):
            if model in busy or now - self._last_used.get(model, now) < self.svc.cfg.idle_release_s:
                continue
            swarm = self._swarms.pop(model)
            log.info(
                "model %s: no batch for %.0f s; letting go of swarm '%s'",
                model,
                now - self._last_used[model],
                swarm.cfg.name,
            )
            self.holding.release(swarm.cfg.name, self.lease.owner)

    def close(self) -> None:
        """Let go of every swarm this service holds (a swarm others hold stays up)."""
        for model in list(self._swarms):
            swarm = self._swarms.pop(model)
            try:
                self.holding.release(swarm.cfg.name, self.lease.owner)
            except Exception as exc:  # the other swarms are still let go
                log.warning("could not let go of swarm '%s': %s", swarm.cfg.name, exc)
        self._pool.shutdown(wait=False, cancel_futures=True)


class BatchRunner:
    """Drives every batch in flight (see the module doc); one per service."""

    def __init__(self, store: ServiceStore, svc: LoadedService, *, now: Callable[[], float] = time.time) -> None:
        self.store = store
        self.svc = svc
        self.now = now
        self.jobs = StateStore()
        self.swarms = SwarmPool(svc, self.jobs)
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probed: dict[str, float] = {}
        self._last_start: dict[tuple[str | None, str], float] = {}

    def start(self) -> BatchRunner:
        """Start the runner's thread."""
        self._thread = threading.Thread(target=self._loop, name="batch-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and let go of the swarms (the jobs keep their own holds while they run)."""
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.swarms.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self.wake.wait(self.svc.cfg.poll_s)
            self.wake.clear()

    def tick(self) -> None:
        """One step of every batch in flight, the queued ones in fair order (:func:`fair_order`); then
        let go of idle swarms."""
        batches = self.store.active_batches()
        now, waiting = fair_order(batches, self.svc.cfg.max_running_batches, self._last_start)
        for row in now + [b for b in waiting if self._stop_reason(b) is not None]:  # a queued batch may expire
            try:
                self.step(row)
            except Exception as exc:  # one batch's trouble does not stop the others
                log.exception("batch %s: step failed: %s", row.id, type(exc).__name__)
        try:
            self.swarms.release_idle({b.model for b in batches if b.model})
        except Exception as exc:
            log.warning("letting go of an idle swarm failed: %s", exc)

    def step(self, row: BatchRow) -> None:
        """Move batch ``row`` one step (see the module doc)."""
        stop = self._stop_reason(row)
        if stop is not None and row.status != "finalizing":
            self._stopping(row, *stop)
        elif row.status == "validating":
            self._start(row)
        elif row.status == "in_progress":
            self._follow(row)
        elif row.status == "finalizing":
            self._finish(row, "completed")

    def _stop_reason(self, row: BatchRow) -> tuple[str, str] | None:
        if row.cancel_requested:
            return "cancelled", "batch_cancelled"
        expires = row.doc.get("expires_at")
        if expires is not None and self.now() >= expires:
            return "expired", "batch_expired"
        return None

    # ------------------------------------------------------------------ steps
    def _spec(self, row: BatchRow) -> JobSpec:
        paths = self.store.paths
        paths.work(row.id).mkdir(mode=0o700, parents=True, exist_ok=True)
        return JobSpec(
            **self.svc.cfg.job,
            input=str(paths.file(row.doc["input_file_id"])),
            output=str(paths.committed(row.id)),
            job="openai-batch",
            job_id=row.id,
            max_failed_fraction=1.0,  # every line comes back; a failed request is an error line, not a failed batch
        )

    def _start(self, row: BatchRow) -> None:
        from prefect_swarm.launch import submit_job

        assert row.model is not None
        if self.svc.cfg.prefect_deployment:
            self._start_run(row)
            return
        try:
            swarm = self.swarms.ready(row.model)
        except Exception as exc:
            self._fail(row, "swarm_unavailable", f"The model's swarm could not be brought up: {exc}")
            return
        if swarm is None:
            return
        submit_job(swarm, self._spec(row), detach=True, store=self.jobs)
        self._last_start[(row.model, row.tenant)] = time.monotonic()
        self.store.update_batch(row.id, {"status": "in_progress", "in_progress_at": int(self.now())}, job_id=row.id)

    def _start_run(self, row: BatchRow) -> None:
        """The batch as a run of the configured deployment (see :mod:`.prefect_runs`)."""
        from prefect_swarm.batchserver import prefect_runs

        assert row.model is not None and self.svc.cfg.prefect_deployment is not None
        spec = self._spec(row)
        params = {
            "swarm": self.svc.swarms[row.model].redacted(),  # no secret in a parameter: the worker has its own
            "job": "openai-batch",
            "input": spec.input,
            "output": spec.output,
            "max_failed_fraction": 1.0,
        }
        variables = dict(self.svc.cfg.prefect_job_variables)  # the run records its job where the service reads it
        variables["env"] = {jobenv.HOME: str(home_dir()), **variables.get("env", {})}
        run_id = prefect_runs.start_run(self.svc.cfg.prefect_deployment, row.id, params, variables)
        self._last_start[(row.model, row.tenant)] = time.monotonic()
        self.store.update_batch(
            row.id, {"status": "in_progress", "in_progress_at": int(self.now())}, flow_run_id=run_id
        )

    def _run_job(self, row: BatchRow) -> str | None:
        """The job of the batch's deployment run once the run recorded it (None before); a run that
        ended without one stops the batch."""
        from prefect_swarm.batchserver import prefect_runs

        assert row.flow_run_id is not None
        job_id = self._run_job_id(row)
        if job_id is not None:
            self.store.update_batch(row.id, {}, job_id=job_id)
            return job_id
        if prefect_runs.run_state(row.flow_run_id) in prefect_runs.FINAL_FAILED:
            self._stop_now(row, "failed", "batch_failed")
        return None

    def _follow(self, row: BatchRow) -> None:
        from prefect_swarm.launch import commit_job, job_status

        if row.job_id is None and row.flow_run_id is not None:
            job_id = self._run_job(row)
            if job_id is None:
                return
            row = self.store.update_batch(row.id, {})
        assert row.job_id is not None
        if row.model:
            self.swarms.touch(row.model)
        # the ledger every step (files); the compute backend (a scheduler call) every probe_s
        refresh = time.monotonic() - self._probed.get(row.id, 0.0) >= self.svc.cfg.probe_s
        if refresh:
            self._probed[row.id] = time.monotonic()
        doc = job_status(row.job_id, refresh=refresh, store=self.jobs)
        progress = doc.get("progress") or {}
        counts = {
            "total": int(progress.get("total") or row.doc["request_counts"]["total"]),
            "completed": int(progress.get("done") or 0) - int(progress.get("failed") or 0),
            "failed": int(progress.get("failed") or 0),
        }
        status = JobStatus(doc["status"])
        if status is JobStatus.SUCCEEDED:
            if not doc.get("committed"):
                commit_job(row.job_id, store=self.jobs)
            row = self.store.update_batch(row.id, {"status": "finalizing", "finalizing_at": int(self.now())})
            self._finish(row, "completed")
            return
        if counts != row.doc.get("request_counts"):
            self.store.update_batch(row.id, {"request_counts": counts})
        if status in TERMINAL_JOB:
            self._resume(row, status)

    def _resume(self, row: BatchRow, status: JobStatus) -> None:
        """The job's processes ended with lines unanswered: resume it from its checkpoint, or give up."""
        from prefect_swarm.launch import submit_job

        if row.flow_run_id is not None:  # the run's own retries resume its job; the service does not
            from prefect_swarm.batchserver import prefect_runs

            if prefect_runs.run_state(row.flow_run_id) in (*prefect_runs.FINAL_FAILED, "COMPLETED"):
                self._stop_now(row, "failed", "batch_failed")
            return
        if row.resubmits >= self.svc.cfg.max_resubmits:
            self._stop_now(row, "failed", "batch_failed")
            return
        assert row.model is not None
        swarm = self.swarms.ready(row.model)
        if swarm is None:
            return
        log.warning("batch %s: its job ended %s unfinished; resuming it from its checkpoint", row.id, status.value)
        self.store.update_batch(row.id, {}, resubmits=row.resubmits + 1)
        submit_job(swarm, self._spec(row), detach=True, store=self.jobs)

    def _stopping(self, row: BatchRow, final: str, code: str) -> None:
        """Stop the job (once), then, when none of its processes runs, write what was answered."""
        from prefect_swarm.launch import cancel_job, running_submissions

        if final == "cancelled" and row.status != "cancelling":
            row = self.store.update_batch(row.id, {"status": "cancelling", "cancelling_at": int(self.now())})
        if row.flow_run_id and not row.stop_sent:
            from prefect_swarm.batchserver import prefect_runs

            prefect_runs.cancel_run(row.flow_run_id)
            if row.job_id is None:
                row = self.store.update_batch(row.id, {}, job_id=self._run_job_id(row))
        if row.job_id and not row.stop_sent:
            cancel_job(row.job_id, store=self.jobs)
        if not row.stop_sent:
            row = self.store.update_batch(row.id, {}, stop_sent=1)
        if row.job_id and running_submissions(row.job_id, store=self.jobs):
            return  # the shards are flushing their checkpoints
        self._stop_now(row, final, code)

    def _run_job_id(self, row: BatchRow) -> str | None:
        return next((j.id for j in self.jobs.list_jobs() if j.flow_run_id == row.flow_run_id), None)

    def _stop_now(self, row: BatchRow, final: str, code: str) -> None:
        job_id = row.job_id or (self._run_job_id(row) if row.flow_run_id else None)
        spec = JobSpec.model_validate(self.jobs.require_job(job_id).spec) if job_id else None
        message = {
            "batch_cancelled": "The batch was cancelled before this request was answered.",
            "batch_expired": "The batch's completion window passed before this request was answered.",
            "batch_failed": "The batch's job stopped repeatedly before this request was answered.",
        }[code]
        input_path = self.store.paths.file(row.doc["input_file_id"])
        self._write_files(row, final, stopped_lines(spec, input_path, code, message))

    def _finish(self, row: BatchRow, final: str) -> None:
        self._write_files(row, final, committed_lines(self.store.paths.committed(row.id)))

    def _write_files(self, row: BatchRow, final: str, lines: Any) -> None:
        paths = self.store.paths
        out_id, err_id = derived_id("file-", row.id, "output"), derived_id("file-", row.id, "error")
        split = split_lines(lines, paths.file(out_id), paths.file(err_id))
        now = int(self.now())
        files = [
            FileRow(fid, row.tenant, f"{row.id}_{kind}.jsonl", "batch_output", path.stat().st_size, n, now)
            for fid, kind, n in ((out_id, "output", split.completed), (err_id, "error", split.failed))
            if n and (path := paths.file(fid)).exists()
        ]
        changes = _final_changes(final, now, split, row)
        changes["output_file_id"] = out_id if split.completed else None
        changes["error_file_id"] = err_id if split.failed else None
        self.store.finish_batch(row.id, files, changes)
        self._probed.pop(row.id, None)
        _drop(paths.committed(row.id))
        log.info("batch %s: %s (%d completed, %d failed)", row.id, final, split.completed, split.failed)

    def _fail(self, row: BatchRow, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}
        self.store.update_batch(row.id, {"status": "failed", "failed_at": int(self.now()), "errors": errors})


def fair_order(
    batches: list[BatchRow], cap: int | None, last_start: Mapping[tuple[str | None, str], float] | None = None
) -> tuple[list[BatchRow], list[BatchRow]]:
    """``(now, waiting)``: the batches to step now, in order (every batch already started or being
    cancelled, then the queued ones, ``validating``, that fit under ``cap`` batches running per
    model), and the queued ones that must wait. Fair: each time the tenant with the fewest batches
    running on that model goes next (of those, the one whose last batch on it started longest ago,
    ``last_start``), its oldest batch first; so a second tenant's first batch starts before the first
    tenant's second, and one tenant's hundred batches queue behind nobody else's."""
    last = last_start or {}
    started = [b for b in batches if b.status != "validating" or b.cancel_requested]
    queued = [b for b in batches if b.status == "validating" and not b.cancel_requested]
    per_model = Counter(b.model for b in started)
    per_tenant = Counter((b.model, b.tenant) for b in started)
    order, waiting = [], []
    while queued:
        row = min(  # min keeps the oldest of a tie
            queued, key=lambda b: (per_tenant[(b.model, b.tenant)], last.get((b.model, b.tenant), float("-inf")))
        )
        queued.remove(row)
        if cap is not None and per_model[row.model] >= cap:
            waiting.append(row)
            continue
        per_model[row.model] += 1
        per_tenant[(row.model, row.tenant)] += 1
        order.append(row)
    return started + order, waiting


def _final_changes(final: str, now: int, split: Split, row: BatchRow) -> dict[str, Any]:
    stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at", "failed": "failed_at"}
    changes: dict[str, Any] = {
        "status": final,
        stamp[final]: now,
        "request_counts": {
            "total": split.completed + split.failed,
            "completed": split.completed,
            "failed": split.failed,
        },
        "usage": split.usage_object(),
    }
    if final == "completed" and not row.doc.get("finalizing_at"):
        changes["finalizing_at"] = now
    return changes


def _drop(path: Path) -> None:
    path.unlink(missing_ok=True)
