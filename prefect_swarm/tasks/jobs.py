"""Job tasks: plan (from the ledger), run one shard, map the shards, commit.

The work is :mod:`prefect_swarm.launch`'s; these tasks add what Prefect adds: retries, the run
logger, the progress artifact, the flow run's stop event, and the cache. ``run_shard``'s cache key
is (output, job fingerprint, shard, nshards) with results persisted under ``$PREFECT_SWARM_HOME``,
so a rerun shows finished shards as Cached; the ledger stays the truth (a shard the ledger calls
pending is always rerun, with ``refresh_cache``), and a retry resumes from the ledger.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.states import Cancelled

from prefect_swarm import launch
from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.cost import duration, job_cost, job_projection, projection_text, usd_text
from prefect_swarm.exceptions import ConfigError, JobError, JobFailed
from prefect_swarm.jobs.checkpoint.failures import failure_lines, manifest_failures, reasons_line
from prefect_swarm.jobs.checkpoint.plan import job_progress, recovered_text, shard_done, shard_progress
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.commit import manifest_verdict
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import JobPlan, ShardStopped, ShardWatch
from prefect_swarm.paths import read_json
from prefect_swarm.settings import get_settings
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.tasks._common import (
    current_flow_run_id,
    current_task_run_id,
    repeating,
    results_dir,
    retry_on_type,
    stop_event,
)
from prefect_swarm.tasks.artifacts import (
    failed_message,
    publish_all_cached,
    publish_failed_rows,
    publish_summary,
    secret_values_of,
    shown_failures,
    summary_row,
)
from prefect_swarm.tasks.events import job_event

SHARD_STOP_WAIT_S = 10.0
"""Most seconds an ending run waits for its shard tasks to stop and report Cancelled."""

ARTIFACT_EVERY_S = 3.0
"""Least seconds between two progress-artifact updates (each is an API call)."""


def progress_every_s() -> float:
    """Seconds between two updates of the job's own progress artifact (each reads every shard's small
    progress file, never the input): the setting ``PREFECT_SWARM_PROGRESS_EVERY_S``."""
    return get_settings().progress_every_s


@task(name="plan-shards", task_run_name="plan-shards-{swarm_name}", cache_policy=NO_CACHE)
def plan_shards(spec: JobSpec, swarm_name: str, run_dir: str | None = None) -> JobPlan:
    """Validate the input (before any GPU is asked for), record the job, read which shards are pending
    (``run_dir``: the swarm's, where its job folders live). With ``retry_failed``, the job retried is
    the one earlier job of the same input, output and swarm (:func:`the_job_meant`)."""
    spec = the_job_meant(spec, swarm_name, run_dir)
    plan = launch.plan_job(spec, swarm_name, flow_run_id=current_flow_run_id(), run_dir=run_dir)
    get_run_logger().info(
        "Job %s: %d/%d shards pending (fingerprint %s, ledger %s).",
        plan.spec.job_id,
        len(plan.pending),
        plan.spec.shards,
        plan.fingerprint,
        plan.spec.job_dir,
    )
    done, total = rows_already_done(plan)
    if plan.pending and done:
        get_run_logger().info(
            "Job %s resumes from its checkpoints (their progress files say %d of %d rows done); the rows not "
            "in its ledger (and, retrying, its error rows) are sent.",
            plan.spec.job_id,
            done,
            total,
        )
    return plan


def the_job_meant(spec: JobSpec, swarm_name: str, run_dir: str | None) -> JobSpec:
    """The job a run means. Its own parameters name a job (its id: output, settings, shards); when that
    job is new but the swarm has run other jobs of the same input and output:

    - with ``retry_failed``, one such job is the one retried (with its own settings; the run says which
      and what differs); several: refused (ConfigError) naming each, none: the new job runs;
    - without, the run says so in its first lines: it sends every row again (a new job), and how to
      resume or retry the earlier one instead.
    """
    located = launch.locate_job(spec, swarm_name, run_dir=run_dir)
    store = StateStore()
    if store.get_job(str(located.job_id)) is not None:
        return spec  # this very job again: resumed (or its error rows retried) from its ledger
    earlier = launch.same_data_jobs(located, store)
    if not earlier:
        return spec
    log = get_run_logger()
    described = "; ".join(_described(rec, located) for rec in earlier)
    if not spec.retry_failed:
        log.warning(
            "Job %s is new: this run sends every row of %s again. The same input and output were run on swarm "
            "'%s' as %s. To go on with that job instead, run it with its own parameters (Copy to new run on its "
            "flow run) or set retry_failed to rerun its failed rows.",
            located.job_id,
            located.input,
            swarm_name,
            described,
        )
        return spec
    if len(earlier) > 1:
        raise ConfigError(
            f"retry_failed: {len(earlier)} earlier jobs of input {located.input} and output {located.output} on "
            f"swarm '{swarm_name}' could be meant: {described}. Run the one you mean with its own parameters "
            "(Copy to new run on its flow run, then set retry_failed), or `prefect-swarm job retry JOB_ID`."
        )
    rec = earlier[0]
    log.info(
        "retry_failed: retrying job %s, the earlier job of this input and output on swarm '%s', with its own "
        "settings (this run's parameters name another job: %s).",
        rec.id,
        swarm_name,
        ", ".join(launch.spec_differences(located, rec.spec)) or "no difference",
    )
    return JobSpec.model_validate(rec.spec).model_copy(update={"retry_failed": True})


def _described(rec: Any, spec: JobSpec) -> str:
    """An earlier job in one phrase: id, when, rows done and failed, what differs from ``spec``."""
    p = rec.progress or {}
    differs = ", ".join(launch.spec_differences(spec, rec.spec)) or "nothing"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(rec.created_at))
    return (
        f"job {rec.id} (created {when}; {p.get('done', 0)} of {p.get('total', '?')} rows done, "
        f"{p.get('failed', 0)} failed; differs in {differs})"
    )


def rows_already_done(plan: JobPlan) -> tuple[int, int]:
    """(about how many rows the job's checkpoints hold done, rows of the job) as a run starts, from the
    shards' progress files only (written with each checkpoint). With ``retry_failed`` the error rows
    are not done (they are sent again). The exact figure comes after: :func:`resumed_rows`."""
    progress = job_progress(plan.spec)
    # a shard's "checkpointed": the rows in its ledger ("done" also counts rows answered since its last
    # checkpoint, which a stopped shard did not keep)
    held = sum(int(s.get("checkpointed", s.get("done")) or 0) for s in progress["shards"])
    done = held - (int(progress.get("failed") or 0) if plan.spec.retry_failed else 0)
    return max(done, 0), int(progress.get("total") or 0)


def resumed_rows(results: list[dict[str, Any]]) -> int:
    """Rows a run found already done: every row of the shards it skipped (finished before), and in each
    shard it ran, the rows its process found in the ledger (done less ``rows_this_run``)."""
    found = 0
    for r in results:
        if r.get("how") == "skipped":
            found += int(r.get("total") or 0)
        else:
            found += max(int(r.get("done") or 0) - int(r.get("rows_this_run") or 0), 0)
    return found


def shard_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a shard task: output, job fingerprint, shard, shard count (not the endpoint):
    two jobs over one input with different outputs never share an entry."""
    import hashlib

    spec = parameters["spec"]
    fp, shard, nshards = parameters["fingerprint"], parameters["shard"], spec.shards
    out = hashlib.sha256(storage.parse(spec.output, "output").uri.encode()).hexdigest()[:12]
    return f"prefect-swarm-{fp}-out-{out}-shard-{shard}-of-{nshards}"


@task(
    name="run-shard",
    task_run_name="shard-{shard}",
    cache_key_fn=shard_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=3,
    retry_condition_fn=retry_on_type,
)
def run_shard(spec: JobSpec, shard: int, fingerprint: str, swarm: Swarm | None = None) -> Any:
    """Run shard ``shard`` of ``spec`` to the end (resuming its ledger); return its progress, or a
    Cancelled state when the flow run ends first."""
    if shard_done(spec, shard, fingerprint):
        return launch.shard_summary(spec, shard, "skipped")
    if swarm is None:
        raise ConfigError(f"shard {shard} of job {spec.job_id} is pending but no swarm was given.")
    log = get_run_logger()
    # a park of the swarm is a pause: the shard waits for the restore and goes on, spending no retry
    watch = ShardWatch(swarm, spec, shard, say=log.warning)
    try:
        handle = watch.submit(task_run_id=current_task_run_id(), stop=stop_event())
    except ShardStopped:
        return Cancelled(message=f"shard {shard} of job {spec.job_id} not started: the flow run is ending.")
    log.info(
        "Shard %d/%d of job %s submitted on %s (job %s).", shard, spec.shards, spec.job_id, handle.backend, handle.id
    )
    progress, began = _ProgressArtifact(spec, shard), time.monotonic()
    try:
        # the shard's artifact is set at its start and end; while it runs, the job's one artifact moves
        # (API calls flat in shards: see _JobProgressArtifact)
        probe = watch.watch(stop_event())
    except ShardStopped:
        log.warning(
            "Shard %d: the flow run is ending; job %s was cancelled (it flushes its checkpoint).",
            shard,
            watch.handle.id if watch.handle else handle.id,
        )
        # Cancelled, not Failed: nothing went wrong with the shard; a rerun resumes it from the ledger
        return Cancelled(message=f"shard {shard} of job {spec.job_id} stopped: the flow run is ending.")
    progress.update(force=True)
    try:
        result = watch.outcome(probe)
    except Exception as exc:
        job_event("shard.failed", str(spec.job_id), swarm.cfg.name, shard=shard, error=str(exc).splitlines()[0])
        raise
    done, failed = int(result.get("done") or 0), int(result.get("failed") or 0)
    log.info(
        "Shard %d done: %d ok, %d failed of %s rows in %.1f s.",
        shard,
        done - failed,
        failed,
        result.get("total"),
        time.monotonic() - began,
    )
    if done and failed / done > spec.max_failed_fraction:
        log.warning(
            "Shard %d: %d of %d rows failed (%.1f%%), above max_failed_fraction %g; failed rows: %s.",
            shard,
            failed,
            done,
            100.0 * failed / done,
            spec.max_failed_fraction,
            spec.paths.failed_rows,
        )
    counts = {k: result.get(k) for k in ("done", "failed", "total", "prompt_tokens", "completion_tokens")}
    job_event("shard.completed", str(spec.job_id), swarm.cfg.name, shard=shard, **counts)
    return result


def _tokens(progress: dict[str, Any]) -> int:
    return int(progress.get("prompt_tokens") or 0) + int(progress.get("completion_tokens") or 0)


class _ProgressArtifact:
    """A shard's progress artifact: created as it starts, updated as it ends (``force``), at most every
    ARTIFACT_EVERY_S otherwise."""

    def __init__(self, spec: JobSpec, shard: int) -> None:
        self.spec, self.shard, self.last = spec, shard, 0.0
        self.id: Any = create_progress_artifact(
            progress=self._read()[0], description=f"job {spec.job_id} shard {shard}: rows done"
        )

    def _read(self) -> tuple[float, str]:
        """The shard's percent done and description, from one read of its ledger progress."""
        p = shard_progress(self.spec, self.shard)
        done, failed, total = int(p.get("done") or 0), int(p.get("failed") or 0), int(p.get("total") or 0)
        percent = 100.0 if total == 0 else round(100.0 * done / total, 1)
        return (
            percent,
            f"job {self.spec.job_id} shard {self.shard}: {done - failed} ok, {failed} failed of {total} rows",
        )

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= ARTIFACT_EVERY_S:
            self.last = now
            percent, description = self._read()
            update_progress_artifact(artifact_id=self.id, progress=percent, description=description)


class _JobProgressArtifact:
    """The job's progress artifact: the share of its rows done and, while it runs, the projected wall
    time, GPU-hours and USD of the whole input (:func:`~prefect_swarm.config.cost.job_projection`);
    once every row is done it keeps the last projection beside the time the job took."""

    def __init__(self, spec: JobSpec, cfg: SwarmConfig) -> None:
        self.spec, self.config = spec, cfg.redacted()
        self.started, self.projected, self.logged = time.monotonic(), "", time.monotonic()
        percent, description = self._read(job_progress(spec))
        self.id: Any = create_progress_artifact(progress=percent, description=description)

    def _read(self, progress: dict[str, Any]) -> tuple[float, str]:
        done, failed, total = (int(progress.get(k) or 0) for k in ("done", "failed", "total"))
        head = f"job {self.spec.job_id}: {done - failed} ok, {failed} failed of {total} rows"
        percent = 100.0 if total == 0 else round(100.0 * done / total, 1)
        if done >= total:
            took = f" in {duration(time.monotonic() - self.started)}"
            return percent, head + took + (f"; last {self.projected}" if self.projected else "")
        p = job_projection(progress, self.config)
        if p["ready"]:
            self.projected = str(projection_text(p))
        return percent, f"{head}; {projection_text(p)}"

    def update(self) -> None:
        progress = job_progress(self.spec)
        percent, description = self._read(progress)
        update_progress_artifact(artifact_id=self.id, progress=percent, description=description)
        if time.monotonic() - self.logged >= get_settings().progress_log_every_s:
            self.logged = time.monotonic()
            get_run_logger().info("Job %s: %s", self.spec.job_id, progress_line(progress, self.config))

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """Update every :func:`progress_every_s` from a thread (in the flow run's context) while the
        block runs, and once more at its end; a failed update is logged, never the run's failure."""
        try:
            with repeating(progress_every_s(), self._safe_update):
                yield
        finally:
            self._safe_update()

    def _safe_update(self) -> None:
        try:
            self.update()
        except Exception as exc:  # a view of the job: never what fails it
            get_run_logger().warning("Job %s: progress artifact not updated: %s", self.spec.job_id, exc)


def progress_line(progress: dict[str, Any], config: dict[str, Any]) -> str:
    """A running job in one line: ``512/1,000 rows (3 failed), 85.2 rows/s, 6s left, $0.0211 so far``."""
    done, failed, total = (int(progress.get(k) or 0) for k in ("done", "failed", "total"))
    p = job_projection(progress, config)
    left = duration(p["remaining_s"]) + " left" if p.get("ready") else "time left not known yet"
    if done >= total:
        left = "every row answered"
    usd = job_cost(progress, config).get("usd")
    so_far = f", {usd_text(usd)} so far" if usd is not None else ""
    rate = float(progress.get("rate_rows_s") or 0.0)
    return f"{done:,}/{total:,} rows ({failed:,} failed), {rate:,.1f} rows/s, {left}{so_far}"


def run_shards(plan: JobPlan, live: Swarm | None) -> list[dict[str, Any]]:
    """Map shards: pending ones always run (refresh the cache), finished ones may come from the cache."""
    spec = plan.spec
    if live is not None:
        spec = launch.for_swarm(spec, live, retry_failed=spec.retry_failed)
        spec.save()
    task = run_shard.with_options(result_storage=results_dir())
    futures = [
        task.with_options(refresh_cache=i in plan.pending).submit(spec, i, plan.fingerprint, live)
        for i in range(spec.shards)
    ]
    if live is not None and plan.pending:
        done, total = rows_already_done(plan)
        get_run_logger().info(
            "Shards: %d of %d started on swarm '%s' (%d finished before%s).",
            len(plan.pending),
            spec.shards,
            live.cfg.name,
            spec.shards - len(plan.pending),
            f"; their checkpoints hold {done} of {total} rows, not sent again" if done else "",
        )
    artifact = _JobProgressArtifact(spec, live.cfg) if live is not None and plan.pending else None
    try:
        with artifact.updating() if artifact else contextlib.nullcontext():
            wait(futures)
    except BaseException:
        # the run is ending (cancel: a termination signal here): stop the shards and let them
        # report Cancelled before the process goes, rather than be left Running or Crashed
        stop_event().set()
        wait(futures, timeout=SHARD_STOP_WAIT_S)
        raise
    failed = [i for i, f in enumerate(futures) if not f.state.is_completed()]
    if failed:
        futures[failed[0]].result()  # raises the first shard's error
        raise JobError(f"shards {failed} of job {spec.job_id} did not complete.")
    return [{**f.result(), "how": "skipped"} if i in plan.done else f.result() for i, f in enumerate(futures)]


@task(
    name="commit-output",
    task_run_name="commit-output-{spec.job_id}",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=2,
)
def commit_output(spec: JobSpec) -> dict[str, Any]:
    """Merge the shard ledgers into the output (cheap when already committed); return the manifest."""
    assert spec.job_id is not None
    get_run_logger().info("Commit: merging the shards' ledgers of job %s into %s.", spec.job_id, spec.output)
    before = read_json(spec.paths.manifest)
    manifest = launch.commit_job(spec.job_id)
    counts = {k: manifest.get(k) for k in ("rows", "ok", "failed", "output", "failed_rows")}
    counts["why"] = reasons_line(manifest_failures(manifest))  # the reasons' kinds and counts, no row text
    if before is None or before.get("committed_at") != manifest.get("committed_at"):
        job_event("committed", spec.job_id, spec.swarm, **counts)  # once per commit, not per cached rerun
    else:
        get_run_logger().info("Output %s was already committed from these ledgers: nothing to redo.", spec.output)
    get_run_logger().info(
        "Output %s: %s rows (%s ok, %s failed).",
        manifest.get("output"),
        manifest.get("rows"),
        manifest.get("ok"),
        manifest.get("failed"),
    )
    return manifest


def run_and_commit(
    plan: JobPlan,
    live: Swarm | None,
    cfg: SwarmConfig,
    started: float,
    up_at: float | None,
    max_failed_fraction: float | None = None,
    release: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the shards, ``release`` the swarm (once the last row is answered: the GPUs are not held
    for the bookkeeping), commit, publish the summary; return the run's numbers and paths.

    Raise JobFailed (the run ends Failed, with the counts and the failed-rows file) when more
    rows failed than ``max_failed_fraction`` (default: the job's own) allows.
    """
    before = sum(_tokens(shard_progress(plan.spec, i)) for i in plan.pending)
    results = run_shards(plan, live)
    resumed = resumed_rows(results) if plan.pending else 0
    if resumed:
        get_run_logger().info(
            "Job %s resumed: %d of %d rows already done; this run sent the others.",
            plan.spec.job_id,
            resumed,
            sum(int(r.get("total") or 0) for r in results),
        )
    swarm_s = time.monotonic() - up_at if up_at is not None else 0.0
    if release is not None:
        release()
    manifest = commit_output(plan.spec)
    used = live.cfg if live else cfg
    row = summary_row(
        manifest,
        results,
        used,
        time.monotonic() - started,
        swarm_s,
        tokens_before=before,
        flow_run=current_flow_run_id(),
        block=live.source if live else None,
        resumed=resumed,
    )
    log = get_run_logger()
    if plan.pending:
        publish_summary(plan.spec, row, results, manifest)
        log.info("Job %s: %s", plan.spec.job_id, row)
        if recovered := recovered_text(results):
            log.info("Job %s: %s.", plan.spec.job_id, recovered)
    else:
        publish_all_cached(plan.spec, manifest)
        log.info(
            "Job %s: 0 rows sent, all cached (%s rows committed in %s).",
            plan.spec.job_id,
            row["rows"],
            manifest.get("output"),
        )
    limit = plan.spec.max_failed_fraction if max_failed_fraction is None else max_failed_fraction
    verdict = manifest_verdict(manifest, limit)
    failures, secrets = manifest_failures(manifest), secret_values_of(used)
    why = failure_lines(failures, secrets)
    if failures:  # why rows failed, where the user looks: the artifact, the log, the event, the state
        publish_failed_rows(plan.spec, failures, secrets)
        log.log(logging.INFO if verdict.succeeded else logging.WARNING, "Job %s: %s", plan.spec.job_id, "\n".join(why))
    job_event(
        "succeeded" if verdict.succeeded else "failed",
        str(plan.spec.job_id),
        used.name,
        rows=manifest.get("rows"),
        ok=manifest.get("ok"),
        failed=manifest.get("failed"),
        max_failed_fraction=limit,
        message=verdict.message(),
        failure_reasons=shown_failures(failures, secrets),
    )
    if not verdict.succeeded:
        raise JobFailed(failed_message(str(plan.spec.job_id), verdict.message(), why))
    log.info("Job %s %s", plan.spec.job_id, verdict.message())
    return {
        **row,
        "job_id": plan.spec.job_id,
        "output": manifest.get("output"),
        "failed_rows": manifest.get("failed_rows"),
        "failure_reasons": shown_failures(failures, secrets),
        "job_dir": plan.spec.job_dir,
    }
