"""The one control-plane path for a job on a swarm: prepare, plan, submit, poll, record, commit.

The CLI (``prefect-swarm job ...``) and the Prefect tasks (``prefect_swarm.tasks.jobs``) both call
this module; the tasks add only what Prefect adds (retries, run logger, artifacts, the stop event,
the cache). Nothing here imports prefect.

A job is ONE row in the state store (:class:`~prefect_swarm.state.JobRecord`: id, swarm, spec,
status, progress sums, ``handle = {"submissions": [...]}``) plus its ledger folder
(``spec.job_dir``), whoever submitted it. A submission is one call to the compute backend (a
fan-out over every shard, or one shard) started with the backend's job runtime
(:meth:`~prefect_swarm.interfaces.ComputeBackend.job_runtime`): the interpreter that exists where
the job runs, not this process's. The ledger is the truth for what is done; the compute backend's
probe only says whether processes still run and how they ended.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.budget import Account, BudgetGuard, SwarmBudget, final_word, job_view, stopped_by_budget
from prefect_swarm.config.cost import job_cost, job_projection, recorded_cost
from prefect_swarm.exceptions import BudgetReached, CapacityError, ConfigError, DatasetError, JobError, ShardStopped
from prefect_swarm.interfaces import ComputeBackend, JobEnv, JobHandle, JobProbe, JobRequest, JobStatus
from prefect_swarm.interfaces.jobenv import EXIT_BAD_INPUT, EXIT_OK, EXIT_REQUEUE
from prefect_swarm.interfaces.types import ServingPhase
from prefect_swarm.jobs.checkpoint.failures import manifest_failures
from prefect_swarm.jobs.checkpoint.fingerprint import fingerprint_details, hash_details, job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import discard_ledger, shard_store
from prefect_swarm.jobs.checkpoint.plan import check_resume, job_progress, pending_shards, shard_progress
from prefect_swarm.jobs.dispatch.cache import cache_fields
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.commit import Verdict, commit_output, manifest_current, manifest_verdict
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, SwarmPaths, read_json, read_tail
from prefect_swarm.sizing import size_for_swarm
from prefect_swarm.state import JobRecord, StateStore, Submission

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm

JOB_MODULE = "prefect_swarm.jobs.run"
"""The job process every shard runs (``python -m prefect_swarm.jobs.run``)."""
log = logging.getLogger("prefect_swarm.cost")
ACTIVE = frozenset(s for s in JobStatus if s.active)
POLL_MIN_S, POLL_MAX_S = 0.1, 2.0
"""Polling steps grow from POLL_MIN_S to POLL_MAX_S: short jobs end fast, a stop is seen in <= 2 s."""
MARK_CHECK_MIN_S, MARK_CHECK_MAX_S = 0.1, 0.25
"""Between two polls a job's end mark (a local file, see PollSchedule) is looked at every eighth of
a step, within these bounds: every 0.1 s while the steps are short, every 0.25 s once they are long
(64 shard watches on a shared filesystem: 256 ``stat`` calls a second, not 640)."""
WATCH_MIN_S, WATCH_MAX_S = 0.5, 10.0
"""Steps of a job's watcher (:class:`JobWatcher`: one batched probe of every shard it watches),
growing from WATCH_MIN_S to WATCH_MAX_S. The scheduler calls of a job do not grow with its shards:
one batch a step, plus at most one per NUDGE_GAP_S when shards write their end marks."""
NUDGE_GAP_S = 2.0
"""A shard's end mark brings the next probe forward, to no sooner than this after the last one
(shards ending one after another are not a fast poll; an end is seen within about this)."""
MARK_STATS_PER_S = 256.0
"""Shards of one job look at their end marks at most this often together (a shared filesystem)."""


# ---------------------------------------------------------------------------------------- prepare
def job_id_for(swarm_name: str | None, spec: JobSpec, fingerprint: str) -> str:
    """The job id for these parameters: the same output, fingerprint and shard count give the same id,
    so a rerun (from the CLI or a flow) finds its ledger and its record."""
    key = f"{storage.parse(spec.output, 'output').uri}|{fingerprint}|{spec.shards}"
    return f"{swarm_name or 'job'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def for_swarm(spec: JobSpec, swarm: Swarm, *, retry_failed: bool = False) -> JobSpec:
    """``spec`` aimed at ``swarm`` as it is NOW: its name, endpoints, model and engine fingerprint.

    Always the live swarm's, never what a stored spec remembers: a swarm brought up again listens
    elsewhere, and an engine swapped behind the same name changes the fingerprint, which the
    resume check of :func:`prepare_job` then refuses (a checkpoint never mixes two engines' answers).
    The replicas' capacity, their list and (unless set) the shard count come from the swarm too
    (:func:`~prefect_swarm.sizing.size_for_swarm`), and its budget with the GPU-hours it has
    used so far (:func:`swarm_budget`: the job processes hold the cap themselves).
    """
    spec = spec.model_copy(
        update={
            "swarm": swarm.cfg.name,
            "endpoints": swarm.endpoints,
            "model": swarm.cfg.model_name,
            "swarm_fingerprint": swarm.fingerprint,
            "retry_failed": retry_failed,
            "budget": swarm_budget(swarm),
        }
    )
    return size_for_swarm(spec, swarm.cfg)


def pilot_job(spec: JobSpec, swarm: Swarm, k: int, *, target: SwarmConfig | None = None) -> dict[str, Any]:
    """Run the first ``k`` rows of ``spec``'s input on the running ``swarm`` in a throwaway folder (no
    state row, no commit; see :mod:`prefect_swarm.pilot`) and project the whole input for
    ``target`` (another replica count or price; default the swarm's own config)."""
    import tempfile

    from prefect_swarm import pilot as pilots
    from prefect_swarm.jobs.shard import validate_input

    with tempfile.TemporaryDirectory(prefix="prefect-swarm-pilot-") as tmp:
        aimed, total = pilots.pilot_spec(spec, k, Path(tmp))
        aimed = for_swarm(aimed, swarm)
        aimed.paths.ensure()
        aimed.save()
        validate_input(aimed)
        secret = JobEnv(api_key=swarm.backends.serving.client_key()).secret_env()
        launched_at, line = pilots.run_processes(aimed, JOB_MODULE, secret)
        progress = job_progress(aimed)
        taken = pilots.latencies(aimed)
    target = target or swarm.cfg
    return pilots.estimate(progress, total, swarm.cfg, target, aimed.shards, line, launched_at, taken)


def locate_job(spec: JobSpec, swarm_name: str | None = None, *, run_dir: str | None = None) -> JobSpec:
    """``spec`` with its job id, job dir and swarm filled (nothing is written). A job on a swarm lives
    in the swarm's folder (``run_dir``: the swarm's :attr:`SwarmConfig.run_dir`, see SwarmPaths.of)."""
    spec = spec.resolved()  # relative paths mean this host's working folder, not the shard's
    swarm_name = swarm_name or spec.swarm
    fingerprint = job_fingerprint(spec)  # opens the dataset: an unreadable input fails here
    job_id = spec.job_id or job_id_for(swarm_name, spec, fingerprint)
    job_dir = spec.job_dir or str(
        SwarmPaths.of(swarm_name, run_dir).job_dir(job_id) if swarm_name else JobPaths.standalone(job_id).root
    )
    update = {"job_id": job_id, "job_dir": job_dir, "swarm": swarm_name, **cache_fields(spec)}
    return spec.model_copy(update=update)


RUN_FIELDS = frozenset(
    {"job_id", "job_dir", "swarm", "endpoints", "replicas_file", "parked_file", "retry_failed", "auto_commit"}
    | {"budget"}
    | {"metrics_host"}
)
"""JobSpec fields a run fills in for where and how it runs, not what the job is (left out of
:func:`spec_differences`)."""


def same_data_jobs(spec: JobSpec, store: StateStore | None = None) -> list[JobRecord]:
    """The recorded batch jobs other than located ``spec``'s own on its swarm with its input and output,
    newest first: what a run of the same data with other settings (shards, job options) could mean."""
    store = store or StateStore()

    def where(s: dict[str, Any]) -> tuple[str, str]:
        return storage.parse(s["input"], "input").uri, storage.parse(s["output"], "output").uri

    mine = where(spec.model_dump(mode="json"))
    found = [
        rec
        for rec in store.list_jobs(spec.swarm)
        if rec.id != spec.job_id and "input" in rec.spec and "output" in rec.spec and where(rec.spec) == mine
    ]
    if found:  # only jobs that answered rows of the input as it is now (a rewritten input is new data)
        identity = fingerprint_details(spec)["input"]
        found = [rec for rec in found if hash_details({"i": _answered_input(rec)}) == hash_details({"i": identity})]
    return sorted(found, key=lambda rec: rec.created_at, reverse=True)


def _answered_input(rec: JobRecord) -> Any:
    """The input identity job ``rec``'s first shard checkpointed rows of (None: it never checkpointed)."""
    try:
        store = shard_store(JobSpec.model_validate(rec.spec), 0)
        return (store.read_json(store.paths.fingerprint.name) or {}).get("details", {}).get("input")
    except Exception:  # an unreadable old record is no candidate
        return None


def spec_differences(spec: JobSpec, other: dict[str, Any]) -> list[str]:
    """The fields where ``spec`` differs from the recorded spec ``other`` (names; the shard counts
    with their values): why a run of the same data is another job."""
    mine = spec.model_dump(mode="json")
    names = [k for k in mine if k not in RUN_FIELDS and k in other and mine[k] != other[k]]
    return [f"shards {other['shards']} -> {mine['shards']}" if k == "shards" else k for k in names]


def prepare_job(
    spec: JobSpec, swarm_name: str | None = None, *, overwrite: bool = False, run_dir: str | None = None
) -> JobSpec:
    """Validate the job class and the dataset, fill the job id and job dir, write ``spec.json``.

    Every refusal (bad job class or kwargs, missing column, duplicate ids, unreadable file) happens
    here, before anything is submitted and before anything is written. ``overwrite`` discards an
    existing ledger.
    """
    from prefect_swarm.jobs.shard import validate_input  # the job process's module: aiohttp, the runner

    spec = locate_job(spec, swarm_name, run_dir=run_dir)
    validate_input(spec)
    if not overwrite:
        check_resume(spec)  # a refused resubmit changes nothing: no spec.json, no record
    paths = JobPaths(spec.paths.root).ensure()
    if overwrite:
        shutil.rmtree(paths.shards_root(), ignore_errors=True)
        discard_ledger(spec)  # the checkpoints on an object store (spec.ledger), if any
        for f in (paths.manifest, paths.failed_rows):
            f.unlink(missing_ok=True)
    spec.save()
    return spec


@dataclass(frozen=True)
class JobPlan:
    """What the ledger says before anything starts."""

    spec: JobSpec
    fingerprint: str
    pending: list[int]
    done: list[int] = field(default_factory=list)

    @property
    def nothing_to_run(self) -> bool:
        """Every shard is done: no swarm is needed (commit at most)."""
        return not self.pending


def plan_job(
    spec: JobSpec,
    swarm_name: str | None,
    *,
    overwrite: bool = False,
    flow_run_id: str | None = None,
    store: StateStore | None = None,
    run_dir: str | None = None,
) -> JobPlan:
    """Prepare ``spec``, record the job, and read which shards are pending (before any GPU is asked for);
    ``run_dir``: the swarm's (its job folder lives there, see :func:`locate_job`)."""
    spec = prepare_job(spec, swarm_name, overwrite=overwrite, run_dir=run_dir)
    fingerprint = job_fingerprint(spec)
    pending = pending_shards(spec)
    record_job(spec, store=store, flow_run_id=flow_run_id)
    return JobPlan(spec, fingerprint, pending, [i for i in range(spec.shards) if i not in pending])


def record_job(spec: JobSpec, *, store: StateStore | None = None, flow_run_id: str | None = None) -> JobRecord:
    """Insert or refresh job ``spec.job_id``'s row, keeping its submissions and creation time."""
    assert spec.job_id is not None
    store = store or StateStore()
    old = store.get_job(spec.job_id)
    return store.put_job(
        JobRecord(
            id=spec.job_id,
            spec=spec.model_dump(mode="json"),
            status=JobStatus.PENDING,
            swarm=spec.swarm,
            handle={"submissions": old.submissions if old else []},
            nshards=spec.shards,
            job_dir=spec.job_dir,
            flow_run_id=flow_run_id or (old.flow_run_id if old else None),
            progress=old.progress if old else None,
            created_at=old.created_at if old else time.time(),
        )
    )


# ----------------------------------------------------------------------------------------- submit
def submit_shards(
    swarm: Swarm,
    spec: JobSpec,
    shards: list[int],
    *,
    store: StateStore | None = None,
    task_run_id: str | None = None,
) -> list[JobHandle]:
    """Start ``shards`` of prepared job ``spec`` on ``swarm``'s compute backend and record each submission.

    Every shard at once is one fan-out submission; a subset is one submission per shard. The
    command uses the backend's job runtime; the swarm's API key reaches the process environment
    only (never a command, a log or a state row).
    """
    assert spec.job_id is not None
    bad = [i for i in shards if not 0 <= i < spec.shards]
    if bad:
        raise ConfigError(f"shard ids {bad} are out of range for a job of {spec.shards} shards.")
    store = store or StateStore()
    compute = swarm.compute
    command = compute.job_runtime().module_argv(JOB_MODULE, "--spec", str(spec.paths.spec))
    secret = JobEnv(api_key=swarm.backends.serving.client_key()).secret_env()
    n = spec.shards
    if sorted(shards) == list(range(n)) and task_run_id is None:
        fan_out = JobRequest(
            name=spec.job_id, command=command, secret_env=secret, nshards=n, shard_id=0 if n == 1 else None
        )
        batches = [(list(range(n)), compute.submit(fan_out))]
    else:
        batches = [
            (
                [i],
                compute.submit(
                    JobRequest(name=f"{spec.job_id}-s{i}", command=command, secret_env=secret, nshards=n, shard_id=i)
                ),
            )
            for i in shards
        ]
    for ids, handle in batches:
        entry = {**handle.to_dict(), "shards": ids, "task_run_id": task_run_id}
        store.add_job_submission(spec.job_id, entry, JobStatus.RUNNING)
    return [h for _, h in batches]


def submit_job(
    swarm: Swarm,
    spec: JobSpec,
    detach: bool = True,
    shard_ids: list[int] | None = None,
    *,
    overwrite: bool = False,
    retry_failed: bool = False,
    commit: bool | None = None,
    store: StateStore | None = None,
    on_attach: Callable[[JobRecord, list[dict[str, Any]]], None] | None = None,
) -> JobRecord:
    """Submit the pending shards of ``spec`` (or just ``shard_ids``) to ``swarm``; the CLI's path.

    Fills endpoints, model and engine fingerprint from the swarm, prepares and records the job,
    and starts the shards not yet done. With ``detach=False`` it waits, then commits (unless
    ``commit=False``) when every shard is done. Returns the job's record.

    A job whose processes still run is attached to, not started again (one process per shard):
    nothing is written or submitted, ``on_attach(record, running submissions)`` is called, and
    with ``detach=False`` it waits for those processes. ``overwrite`` on a running job is refused.
    """
    store = store or StateStore()
    spec = locate_job(for_swarm(spec, swarm, retry_failed=retry_failed), swarm.cfg.name, run_dir=swarm.cfg.run_dir)
    assert spec.job_id is not None
    running = running_submissions(spec.job_id, store=store)
    if running:
        if overwrite:
            raise ConfigError(
                f"job {spec.job_id} is still running ({_describe(running)}); --overwrite would discard the "
                f"checkpoint under it. Stop it first: `prefect-swarm job cancel {spec.job_id}`."
            )
        check_resume(spec)  # other settings for a running job: refused, as for a finished one
        rec = store.require_job(spec.job_id)
        if on_attach is not None:
            on_attach(rec, running)
        if not detach:
            wait_job(spec.job_id, commit=commit is not False and shard_ids is None, store=store)
        return store.require_job(spec.job_id)
    plan = plan_job(spec, swarm.cfg.name, overwrite=overwrite, store=store, run_dir=swarm.cfg.run_dir)
    spec = plan.spec
    assert spec.job_id is not None
    todo = sorted(set(shard_ids)) if shard_ids is not None else plan.pending
    if todo:
        from prefect_swarm.holding import default_holding

        swarm.check_key()  # a wrong or missing key is found by one request, not by every row
        job_id = spec.job_id

        def still_running() -> bool:
            return bool(running_submissions(job_id, store=store))

        # the swarm stays up while the job is active; refused or interrupted with nothing running, it holds nothing
        with default_holding(store).job_hold(swarm.cfg.name, job_id, still_running):
            submit_shards(swarm, spec, todo, store=store)
    if detach:
        return store.require_job(spec.job_id)
    wait_job(spec.job_id, commit=commit is not False and shard_ids is None, store=store)
    return store.require_job(spec.job_id)


def running_submissions(job_id: str, *, store: StateStore | None = None) -> list[dict[str, Any]]:
    """The submissions of job ``job_id`` whose processes still run, by the compute backend's probe."""
    rec = (store or StateStore()).get_job(job_id)
    if rec is None:
        return []
    return [p for p in _probe_all(rec) if p.get("status") in ACTIVE]


def _describe(subs: list[dict[str, Any]]) -> str:
    return ", ".join(f"process {p.get('id')} for shards {p.get('shards')}" for p in subs)


def submit_script(
    swarm: Swarm, script: str, args: list[str], *, detach: bool = True, store: StateStore | None = None
) -> JobRecord:
    """Run an arbitrary Python script next to the swarm, with ENDPOINT, MODEL and the API key in its environment."""
    store = store or StateStore()
    compute = swarm.compute
    job_id = f"script-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    key = swarm.cfg.api_key.get_secret_value() if swarm.cfg.api_key else None
    env = JobEnv(endpoints=tuple(swarm.endpoints), model=swarm.cfg.model_name, api_key=key)
    store.put_job(
        JobRecord(
            id=job_id,
            spec={"script": script, "args": list(args)},
            status=JobStatus.PENDING,
            swarm=swarm.cfg.name,
            handle={"submissions": []},
        )
    )
    env_vars = {**env.to_env(), "ENDPOINT": swarm.endpoint}
    handle = compute.submit(
        JobRequest(
            name=job_id,
            command=[compute.job_runtime().python, script, *args],
            env=env_vars,
            secret_env=env.secret_env(),
            detach=detach,
        )
    )
    status = JobStatus.RUNNING
    if not detach:
        probe = compute.probe(handle)
        status = probe.status or status
    return store.add_job_submission(job_id, {**handle.to_dict(), "shards": [], "task_run_id": None}, status)


# --------------------------------------------------------------------------------- watch one shard
class ShardWatch:
    """One shard of a prepared job on a swarm: submit it, poll it until it ends (or ``stop`` is set),
    turn its exit code into a result or an exception. The Prefect ``run-shard`` task drives it.

    A park of the swarm is a pause, not a failure: a shard the park stopped (Slurm: a step of the
    parked allocation, which flushes and exits 75) waits for the restore and is submitted again on
    the restored swarm (:meth:`watch`); a shard about to be submitted to a parked swarm waits first.
    ``say`` hears of each pause and resume."""

    def __init__(
        self,
        swarm: Swarm,
        spec: JobSpec,
        shard: int,
        *,
        store: StateStore | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.swarm, self.spec, self.shard = swarm, spec, shard
        self.store = store or StateStore()
        self.compute = swarm.compute
        self.handle: JobHandle | None = None
        self.say = say
        self.task_run_id: str | None = None
        self.pauses = 0
        """Parks this shard waited through (each resumed without a retry)."""
        self.since: float | None = None
        """When the swarm the shard was last submitted to came up (its record's ``created_at``: a
        restore from a park records a new one, a reconcile or a scale keeps it)."""

    def submit(self, task_run_id: str | None = None, stop: threading.Event | None = None) -> JobHandle:
        """Start the shard's process (once its swarm is not parked: a parked swarm is waited for)."""
        self.task_run_id = task_run_id
        self._wait_if_parked(stop)
        rec = self.store.get_swarm(self.swarm.cfg.name)
        self.since = rec.created_at if rec is not None else None
        (self.handle,) = submit_shards(self.swarm, self.spec, [self.shard], store=self.store, task_run_id=task_run_id)
        return self.handle

    def watch(self, stop: threading.Event | None = None, on_step: Callable[[], None] | None = None) -> JobProbe:
        """Wait until the process ends; return its last probe. Raises :class:`ShardStopped` (after
        cancelling the process) when ``stop`` is set first, BudgetReached past the swarm's budget.
        A process the park of its swarm stopped is submitted again once the swarm is restored, and
        watched on.

        The shard is watched by its job's one :class:`JobWatcher` on this swarm in this process (one
        batched probe for all of the job's shards, one budget check), not by a poll of its own."""
        while True:
            probe = self._watch_once(self.handle or self.submit(self.task_run_id, stop), stop, on_step)
            if not self.parked_stop(probe):
                return probe
            self.pauses += 1
            self.handle = None  # submitted again once the swarm is restored (the next turn)

    def _watch_once(
        self, handle: JobHandle, stop: threading.Event | None, on_step: Callable[[], None] | None
    ) -> JobProbe:
        assert self.spec.job_id is not None
        key = watcher_key(self.spec.job_id, self.swarm)
        watcher = JobWatcher.of(key, self.compute, lambda: budget_guard(self.swarm))
        try:
            return watcher.wait(
                handle,
                stop=stop,
                on_step=on_step,
                what=f"shard {self.shard}",
                mark=self.spec.paths.shard(self.shard).done_marker,
            )
        except BaseException:
            self.compute.cancel(handle)
            raise

    def parked_stop(self, probe: JobProbe) -> bool:
        """Whether the shard ended resumable (exit 75) because its swarm was parked: the swarm is parked
        (or being parked or restored) now, or was restored since this shard was submitted (its record
        came up anew). A stop at the swarm's budget is not one."""
        if not (probe.status is JobStatus.PREEMPTED or probe.exit_code == EXIT_REQUEUE):
            return False
        if stopped_by_budget(shard_progress(self.spec, self.shard)) is not None:
            return False
        from prefect_swarm.holding import default_holding

        rec = self.store.get_swarm(self.swarm.cfg.name)
        restored = rec is not None and self.since is not None and rec.created_at != self.since
        return default_holding(self.store).parked(self.swarm.cfg.name) or restored

    def _moved(self) -> bool:
        """The swarm's recorded handle is not the one this shard is aimed at (a task retry's swarm object
        from before a restore)."""
        rec = self.store.get_swarm(self.swarm.cfg.name)
        now = rec.handle if rec is not None else None
        return bool(now) and self.swarm.handle is not None and now != self.swarm.handle.to_dict()

    def _wait_if_parked(self, stop: threading.Event | None) -> None:
        """Before a submission: while the swarm is parked, wait for its restore (``stop`` ends the wait:
        ShardStopped); then aim the shard at the swarm as it is now (its handle, compute backend and
        endpoints; this run's config of it, budget and secrets, kept)."""
        from prefect_swarm.holding import default_holding

        holding, name = default_holding(self.store), self.swarm.cfg.name
        waited = self.pauses > 0
        if holding.parked(name):
            holding.wait_restored(name, say=self.say, stop=stop)
            waited = True
        if not (waited or self._moved()):
            return
        self.swarm = self.swarm.as_recorded()
        self.compute = self.swarm.compute
        self.spec = for_swarm(self.spec, self.swarm, retry_failed=self.spec.retry_failed)
        self.spec.save()
        if waited and self.say is not None:
            self.say(
                f"shard {self.shard} of job {self.spec.job_id}: swarm '{name}' is back; "
                "the shard resumes from its checkpoint (no retry spent)."
            )

    def outcome(self, probe: JobProbe) -> dict[str, Any]:
        """The shard's progress when it succeeded; else the exception its exit code means."""
        spec, i, code, status = self.spec, self.shard, probe.exit_code, probe.status
        if status is JobStatus.SUCCEEDED and code in (None, EXIT_OK):
            return shard_summary(spec, i, "ran")
        tail = shard_log_tail(spec, i)
        if code == EXIT_BAD_INPUT:
            raise DatasetError(f"shard {i} of job {spec.job_id} refused its input (exit 2).\n{tail}")
        if status is JobStatus.PREEMPTED or code == EXIT_REQUEUE:
            progress = shard_progress(spec, i)
            if stopped_by_budget(progress) is not None:  # the shard held the swarm's budget: not worth a retry
                raise budget_reached(self.swarm, spec)
            why = (progress.get("stopped") or {}).get("message") or "preempted"
            raise CapacityError(f"shard {i} of job {spec.job_id} stopped (exit 75: {why}); a retry resumes it.")
        state = status.value if status else "UNKNOWN"
        raise JobError(f"shard {i} of job {spec.job_id} ended {state} (exit {code}).\n{tail}")


def watcher_key(job_id: str, swarm: Swarm) -> str:
    """The key of a job's :class:`JobWatcher`: the job on the swarm as it runs now. A swarm restored
    from a park runs elsewhere (Slurm: another allocation), so the shards resumed on it get a watcher
    with its compute backend and budget, not the one of the parked swarm."""
    handle = swarm.handle.to_dict() if swarm.handle is not None else {}
    digest = hashlib.sha256(json.dumps(handle, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{job_id}@{digest}"


class JobWatcher:
    """The one watcher of a job in this process: every shard task of a flow run waits on it.

    A thread probes every handle it watches with ONE :meth:`ComputeBackend.probe_many` call a step
    (Slurm: one ``squeue`` and at most one ``sacct`` per allocation, whatever the number of shards),
    checks the swarm's budget once, and wakes the waiters; steps grow from WATCH_MIN_S to
    WATCH_MAX_S; a shard writing its end mark brings the next one forward (NUDGE_GAP_S). When
    nothing is watched any more the thread ends and the watcher is forgotten (a later run of the
    job gets a new one, with its own budget). Progress is never asked of the scheduler: it is in
    the shards' own files.
    """

    _all: dict[str, JobWatcher] = {}
    _lock = threading.Lock()

    def __init__(self, compute: ComputeBackend, guard: BudgetGuard | None, key: str | None = None) -> None:
        self.compute, self.guard, self.key = compute, guard, key
        self.cond = threading.Condition()
        self.handles: dict[int, JobHandle] = {}
        self.probes: dict[int, JobProbe] = {}
        self.generation = 0
        self.error: BaseException | None = None
        self.nudge = threading.Event()
        self.thread: threading.Thread | None = None
        self.rounds = 0
        """Batched probes made (read by tests)."""
        self._next = 0

    @classmethod
    def of(cls, job_id: str, compute: ComputeBackend, guard: Callable[[], BudgetGuard] | None = None) -> JobWatcher:
        """The watcher of job ``job_id`` in this process (made with ``compute`` and ``guard()`` the first time)."""
        with cls._lock:
            watcher = cls._all.get(job_id)
            if watcher is None:
                watcher = cls._all[job_id] = cls(compute, guard() if guard is not None else None, job_id)
            return watcher

    def add(self, handle: JobHandle) -> int:
        """Watch ``handle``; returns its token."""
        with self.cond:
            self._next += 1
            self.handles[self._next] = handle
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="prefect-swarm-job-watcher", daemon=True)
                self.thread.start()
            return self._next

    def remove(self, token: int) -> None:
        """Stop watching one handle."""
        with self.cond:
            self.handles.pop(token, None)
            self.probes.pop(token, None)
            last = not self.handles
        if last:
            with JobWatcher._lock:
                if self.key is not None and JobWatcher._all.get(self.key) is self:
                    del JobWatcher._all[self.key]
            self.nudge.set()  # the thread ends now, not a long step later

    def _run(self) -> None:
        step, last = WATCH_MIN_S, time.monotonic()
        while True:
            if self.nudge.wait(step):
                self.nudge.clear()
                time.sleep(max(0.0, last + NUDGE_GAP_S - time.monotonic()))
            else:
                step = min(step * 1.5, WATCH_MAX_S)
            with self.cond:
                if not self.handles:
                    self.thread = None
                    return
                tokens, handles = list(self.handles), list(self.handles.values())
            probes = self.compute.probe_many(handles)
            last = time.monotonic()
            error = self._check_budget()
            with self.cond:
                self.rounds += 1
                self.probes.update((t, p) for t, p in zip(tokens, probes, strict=True) if t in self.handles)
                self.error = self.error or error
                self.generation += 1
                self.cond.notify_all()

    def _check_budget(self) -> BaseException | None:
        try:
            if self.guard is not None:
                self.guard.check()
        except BudgetReached as exc:
            return exc
        return None

    def wait(
        self,
        handle: JobHandle,
        *,
        stop: threading.Event | None = None,
        on_step: Callable[[], None] | None = None,
        what: str = "job",
        mark: Path | None = None,
    ) -> JobProbe:
        """Until ``handle`` has finished: its last probe. ``on_step`` runs in the caller's thread after
        each batched probe; ``stop`` set raises ShardStopped; past the budget raises BudgetReached.
        ``mark`` (the shard's end mark) changing wakes the watcher at once."""
        token, seen, seen_mark = self.add(handle), -1, _mtime(mark)
        stop = stop or threading.Event()
        try:
            while True:
                look = max(MARK_CHECK_MAX_S, len(self.handles) / MARK_STATS_PER_S)
                with self.cond:
                    if self.generation == seen and self.error is None:
                        self.cond.wait(timeout=look)
                    generation, probe, error = self.generation, self.probes.get(token), self.error
                if error is not None:
                    raise error
                if stop.is_set():
                    raise ShardStopped(f"{what}: the run is ending")
                if generation != seen and probe is not None:
                    seen = generation
                    if probe.status is not None and probe.status.finished:
                        return probe
                    if on_step is not None:
                        on_step()
                if (now := _mtime(mark)) != seen_mark:
                    seen_mark = now
                    self.nudge.set()
        finally:
            self.remove(token)


def budget_guard(swarm: Swarm) -> BudgetGuard:
    """The budget guard of whoever waits on a job of ``swarm`` (its GPU time; a token cap is held by the
    job processes on the swarm's account, see :mod:`prefect_swarm.budget`)."""
    serving, handle = swarm.backends.serving, swarm.handle

    def usage() -> tuple[float | None, str | None]:
        used = serving.gpu_usage(handle) if handle else None
        return (used.gpu_hours, used.shape) if used else (None, None)

    return BudgetGuard(swarm.cfg.name, swarm.cfg.backend.cost, usage)


def swarm_budget(swarm: Swarm) -> SwarmBudget | None:
    """The swarm's budget for its job processes to hold (``JobSpec.budget``): its caps and price, and its
    spend: its token account (a priced provider), else its GPU-hours now, read as :func:`budget_guard`
    reads them; None without a cap or a figure."""
    cost, handle = swarm.cfg.backend.cost, swarm.handle
    if not cost.capped or handle is None:
        return None
    _refuse_if_stopped_at_budget(swarm)
    if cost.token_priced:  # a priced provider: the bill is tokens, reserved request by request on one account
        account = str(swarm.paths.budget_account)
        return SwarmBudget(swarm=swarm.cfg.name, cost=cost, at=time.time(), account=account, epoch=_epoch(swarm))
    try:
        used = swarm.backends.serving.gpu_usage(handle)
    except Exception as exc:  # as the guard does: a flaky accounting call is not a reason to refuse a job
        log.warning("swarm %s: could not read its GPU usage for the jobs' budget: %s", swarm.cfg.name, exc)
        return None
    if used.gpu_hours is None:
        log.warning("swarm %s: its jobs cannot hold its budget (%s)", swarm.cfg.name, used.reason)
        return None
    return SwarmBudget(
        swarm=swarm.cfg.name, cost=cost, gpu_hours=used.gpu_hours, at=time.time(), gpus=used.gpus, shape=used.shape
    )


def _epoch(swarm: Swarm) -> float:
    """When the swarm was brought up (its record's ``created_at``): its token account counts from there."""
    rec = swarm.store.get_swarm(swarm.cfg.name)
    return rec.created_at if rec is not None else 0.0


def budget_reached(swarm: Swarm, spec: JobSpec) -> BudgetReached:
    """The final word of a job stopped at the swarm's budget: the spend now (its processes have exited or
    been stopped: a token account's grants not yet settled count as spent), the cap, the job's rows left."""
    progress = job_progress(spec)
    left = max(int(progress.get("total") or 0) - int(progress.get("done") or 0), 0)
    cost, spent, hours, shape = swarm.cfg.backend.cost, None, None, None
    if cost.token_priced:  # the job's processes are stopping: their drain ends within drain_seconds
        account = Account(swarm.paths.budget_account, _epoch(swarm))
        spent = account.settled(f"{spec.job_id}/", spec.drain_seconds + 10.0).total
    elif swarm.handle is not None:
        try:
            used = swarm.backends.serving.gpu_usage(swarm.handle)
            hours, shape = used.gpu_hours, used.shape
        except Exception as exc:  # the message then says the spend is unknown; the stop still happens
            log.warning("swarm %s: could not read its GPU usage for the final word: %s", swarm.cfg.name, exc)
    word = final_word(swarm.cfg.name, cost, spent_usd=spent, gpu_hours=hours, shape=shape, rows_left=left)
    return BudgetReached(word)


def _refuse_if_stopped_at_budget(swarm: Swarm) -> None:
    """BudgetReached (nothing is submitted) when the swarm's sidecar stopped it at its budget: its
    ``status`` is STOPPED with the reason (a swarm brought up again has its budget counted afresh)."""
    assert swarm.handle is not None
    try:
        seen = swarm.backends.serving.status(swarm.handle)
    except Exception:  # a status that cannot be read: the job's own budget still holds
        return
    if seen.phase is ServingPhase.STOPPED and seen.stopped_at_budget:
        raise BudgetReached(
            f"{seen.detail}. Nothing was submitted: bring it up again with a larger budget "
            f"(`prefect-swarm up -c {swarm.paths.config}` after raising backend.cost), then submit again: it resumes."
        )


class PollSchedule:
    """The waits between two looks at a running job: steps growing from POLL_MIN_S to ``most``
    seconds, cut short, and started over, when ``mark`` changes. The mark is a file the job writes
    as it ends (the manifest, which the last shard writes as it commits; a shard's DONE marker), so
    an end is seen at once instead of up to a whole step late. It is one file in the local job
    folder, looked at every MARK_CHECK_MIN_S to MARK_CHECK_MAX_S; None (or a ledger kept in object
    storage, where the marker is not a local file) means no early wake-up.
    """

    def __init__(self, mark: Path | None = None, *, most: float = POLL_MAX_S, stop: threading.Event | None = None):
        self.mark, self.most, self.stop = mark, most, stop or threading.Event()
        self.step = min(POLL_MIN_S, most)
        self.seen = _mtime(mark)

    def wait(self) -> bool:
        """Wait one step (or less, when the mark changes); False when ``stop`` was set."""
        end = time.monotonic() + self.step
        look = min(max(MARK_CHECK_MIN_S, self.step / 8), MARK_CHECK_MAX_S) if self.mark is not None else self.step
        self.step = min(self.step * 1.5, self.most)
        while (left := end - time.monotonic()) > 0:
            if self.stop.wait(min(look, left)):
                return False
            if (now := _mtime(self.mark)) != self.seen:
                self.seen, self.step = now, min(POLL_MIN_S, self.most)
                break
        return not self.stop.is_set()


def _mtime(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except OSError:
        return None


def shard_summary(spec: JobSpec, shard: int, how: str) -> dict[str, Any]:
    """A shard's progress plus how this run got it (``ran``, ``skipped``)."""
    return {**shard_progress(spec, shard), "shard": shard, "how": how}


def shard_log(spec: JobSpec, shard: int, lines: int = 20, subs: Sequence[Submission] = ()) -> tuple[Path, str]:
    """Shard ``shard``'s process log and its last ``lines`` lines: the job log in its ledger, else
    the process's stdout+stderr (where a process that died before its ledger opened wrote): in the
    job folder, or where the backend's submission (one of ``subs``) recorded it."""
    candidates = (spec.paths.shard(shard).log, *_recorded_logs(subs, shard), spec.paths.log(shard))
    for path in candidates:
        tail = read_tail(path, lines)
        if tail:
            return path, tail
    return candidates[-1], ""


def _recorded_logs(subs: Sequence[Submission], shard: int) -> list[Path]:
    """The process log of ``shard`` a submission recorded (a JobHandle's ``meta``: ``shards`` and
    ``logs`` side by side; Slurm keeps each step's under the swarm's ``steps/``), latest first."""
    found = []
    for sub in reversed(subs):
        meta = sub.get("meta") or {}
        shards = [s["shard_id"] if isinstance(s, dict) else s for s in meta.get("shards") or sub.get("shards") or []]
        logs = list(meta.get("logs") or [])  # local: one process record (a dict) per shard, its log beside it
        if shard in shards and len(logs) == len(shards):
            found.append(Path(logs[shards.index(shard)]))
    return found


def shard_log_tail(spec: JobSpec, shard: int, lines: int = 20) -> str:
    """The end of shard ``shard``'s process log, for error messages ('' when there is none)."""
    path, tail = shard_log(spec, shard, lines)
    return f"log tail ({path}):\n{tail}" if tail else ""


def shard_failures(
    spec: JobSpec, probes: list[dict[str, Any]], subs: Sequence[Submission] = (), lines: int = 5
) -> list[dict[str, Any]]:
    """Why each unfinished shard of an ended job stopped: how its process ended (the backend's
    probe of the submission that ran it), its log's path and last ``lines`` lines (``subs``: the
    job's submissions, where a backend records each shard's log)."""
    out = []
    for shard in pending_shards(spec.model_copy(update={"retry_failed": False})):
        probe: dict[str, Any] = next((p for p in reversed(probes) if shard in (p.get("shards") or [])), {})
        code = probe.get("exit_code")
        ended = f"{probe.get('status') or 'ended'}" + (f" (exit {code})" if code is not None else "")
        if code == EXIT_BAD_INPUT:
            ended += ": it refused its input"
        path, tail = shard_log(spec, shard, lines, subs)
        out.append({"shard": shard, "reason": ended, "detail": probe.get("detail"), "log": str(path), "tail": tail})
    return out


# ------------------------------------------------------------------------------ status of a job
def latest_submissions(subs: list[Submission]) -> list[Submission]:
    """The submissions that may still matter: for each shard the latest one that ran it (a retry
    supersedes the attempts before it); a script job's latest one. Oldest first."""
    latest: dict[int | None, int] = {}
    for k, sub in enumerate(subs):
        shards: list[int | None] = [*sub.get("shards", [])] or [None]
        for shard in shards:
            latest[shard] = k
    return [subs[k] for k in sorted(set(latest.values()))]


def _probe_all(rec: JobRecord, compute: ComputeBackend | None = None) -> list[dict[str, Any]]:
    """The compute backend's view of the job's latest submissions (:func:`latest_submissions`), in
    one batched :meth:`~ComputeBackend.probe_many` (never raises: errors are 'could not tell')."""
    subs = latest_submissions(rec.submissions)
    if not subs or not rec.swarm:
        return []
    try:
        if compute is None:
            from prefect_swarm.holding import default_holding

            compute = default_holding().attach(rec.swarm).compute
        probes = compute.probe_many([JobHandle.from_dict(sub) for sub in subs])
    except Exception as exc:
        return [
            {
                "id": s.get("id"),
                "shards": s.get("shards"),
                "status": None,
                "error": f"cannot ask swarm '{rec.swarm}': {exc}",
            }
            for s in subs
        ]
    return [
        {
            "id": sub.get("id"),
            "shards": sub.get("shards"),
            "status": p.status.value if p.status else None,
            "exit_code": p.exit_code,
            "error": p.error,
            "detail": p.detail,
        }
        for sub, p in zip(subs, probes, strict=True)
    ]


def _overall(
    spec: JobSpec, probes: list[dict[str, Any]], old: JobStatus
) -> tuple[JobStatus, bool, dict[str, Any] | None]:
    """(status, committed, manifest) from the ledger, the manifest and the processes.

    A committed job whose failed fraction exceeds ``max_failed_fraction`` is FAILED (its output is
    written; ``job retry`` reruns the failed rows)."""
    manifest = read_json(spec.paths.manifest)
    pending = pending_shards(spec.model_copy(update={"retry_failed": False}))
    committed = not pending and manifest_current(spec, manifest)
    current = manifest if committed else None
    running = any(p.get("status") in ACTIVE for p in probes)
    # a backend that could not tell (p["status"] None: a scheduler or API hiccup, sacct lagging or
    # absent) has not said the processes ended: while shards still have rows, keep waiting
    untold = pending and any(p.get("status") is None for p in probes)
    if running or untold or (not probes and old in ACTIVE and pending):
        return JobStatus.RUNNING, committed, current
    if not pending:
        failed = current is not None and not verdict_of(spec, current).succeeded
        return (JobStatus.FAILED if failed else JobStatus.SUCCEEDED), committed, current
    if old is JobStatus.CANCELLED or any(p.get("status") == JobStatus.CANCELLED for p in probes):
        return JobStatus.CANCELLED, committed, current
    if probes and all(p.get("status") in (JobStatus.PREEMPTED, JobStatus.SUCCEEDED) for p in probes):
        return JobStatus.PREEMPTED, committed, current  # stopped after the flush: a rerun resumes it
    if not probes and old is JobStatus.PREEMPTED:
        return JobStatus.PREEMPTED, committed, current
    return JobStatus.FAILED, committed, current


def verdict_of(spec: JobSpec, manifest: dict[str, Any]) -> Verdict:
    """The verdict on a committed manifest under the job's ``max_failed_fraction``."""
    return manifest_verdict(manifest, spec.max_failed_fraction)


def job_status(
    job_id: str, *, refresh: bool = True, store: StateStore | None = None, compute: ComputeBackend | None = None
) -> dict[str, Any]:
    """The job now: status, per-shard progress, the backend's view; the state row is updated.

    ``SUCCEEDED`` means every shard is done and, once committed, that the failed fraction is within
    ``max_failed_fraction`` (``verdict``: counts, threshold, failed-rows file; null until committed);
    ``committed`` says whether the output is written and current; ``projection`` (while RUNNING): the
    whole input's projected wall time, GPU-hours and USD (:func:`~prefect_swarm.config.cost.job_projection`).
    With ``refresh=False`` the compute
    backend is not asked (ledger files only); ``compute``: the swarm's, when the caller holds it.
    """
    store = store or StateStore()
    rec = store.require_job(job_id)
    probes = _probe_all(rec, compute) if refresh else []
    base = {
        "id": job_id,
        "swarm": rec.swarm,
        "flow_run_id": rec.flow_run_id,
        "nshards": rec.nshards,
        "created_at": rec.created_at,
        "backend": probes,
    }
    if "input" not in rec.spec:  # a script job: the backend is the only source
        status = next((JobStatus(p["status"]) for p in probes if p.get("status")), rec.status)
        store.update_job(job_id, status=status)
        return {**base, "status": status.value, "kind": "script", "spec": rec.spec}
    spec = JobSpec.model_validate(rec.spec)
    progress = job_progress(spec)
    status, committed, manifest = _overall(spec, probes, rec.status)
    verdict = verdict_of(spec, manifest) if committed and manifest else None
    subs = rec.submissions
    failures = shard_failures(spec, probes, subs) if status is JobStatus.FAILED and not committed else []
    store.update_job(job_id, status=status, progress={k: v for k, v in progress.items() if k != "shards"})
    swarm_rec = store.get_swarm(rec.swarm) if rec.swarm else None
    recorded = swarm_rec.config if swarm_rec else None
    return {
        **base,
        "status": status.value,
        "committed": committed,
        "kind": "batch",
        "input": spec.input,
        "output": spec.output,
        "job_dir": spec.job_dir,
        "progress": progress,
        "manifest": manifest if committed else None,
        "failure_reasons": manifest_failures(manifest) if committed else None,  # why rows failed
        "failures": failures,
        "cost": {**job_cost(progress, recorded), "budget": job_view(spec.budget, progress)},
        "projection": job_projection(progress, recorded) if status is JobStatus.RUNNING else None,
        "verdict": {**asdict(verdict), "failed_fraction": verdict.failed_fraction, "message": verdict.message()}
        if verdict
        else None,
    }


def wait_job(
    job_id: str,
    *,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    commit: bool = True,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    store: StateStore | None = None,
) -> dict[str, Any]:
    """Poll (on a :class:`PollSchedule` of at most ``poll_s``, woken early by the manifest) until
    no shard process runs; then commit if every shard is done. Returns the final status.

    Raises JobError on timeout (the job keeps running).
    """
    store = store or StateStore()
    rec = store.require_job(job_id)
    mark = JobSpec.model_validate(rec.spec).paths.manifest if "input" in rec.spec else None
    schedule = PollSchedule(mark, most=poll_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    budget = _job_budget(rec, store)
    compute = _job_compute(rec)
    holding = rec.swarm is not None and "input" in rec.spec  # a batch job on a swarm
    while True:
        doc = job_status(job_id, store=store, compute=compute)
        if on_progress:
            on_progress(doc)
        if holding and not pending_shards(JobSpec.model_validate(rec.spec)):
            holding = False
            let_go_of_swarm(rec, store)  # the last row is answered: the swarm is not held for the commit
        if budget is not None:
            _hold_to_budget(*budget, rec, doc, store)
        if JobStatus(doc["status"]) not in ACTIVE:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(
                f"job {job_id} still {doc['status']} after {timeout_s:g}s; it keeps running. "
                f"`prefect-swarm job status {job_id}` shows its progress."
            )
        schedule.wait()
    if doc["status"] == JobStatus.SUCCEEDED and commit and doc.get("kind") == "batch" and not doc["committed"]:
        commit_job(job_id, store=store)
        doc = job_status(job_id, refresh=False, store=store)
    return doc


def let_go_of_swarm(rec: JobRecord, store: StateStore) -> None:
    """Job ``rec`` stops holding its swarm (its last row is answered; publishing needs no GPU): with
    other holders (``up``'s KEEP hold, a flow run, another job) the swarm stops when none of them is
    left live; a swarm nobody else holds by a lease (brought up by hand with ``Swarm.up()``; a ``with
    Swarm(...)`` block holds one) is its user's."""
    from prefect_swarm.holding import default_holding
    from prefect_swarm.state import job_lease

    assert rec.swarm is not None
    holding, owner = default_holding(store), job_lease(rec.swarm, rec.id).owner
    if not holding.holds(rec.swarm, owner):
        return
    try:  # held by the job alone (a swarm up by hand): its lease is dead now, left to be reaped
        if any(x.owner != owner for x in holding.holders(rec.swarm)):
            holding.release(rec.swarm, owner)
    except Exception as exc:  # letting go early is an optimisation; the lease also ends with the job
        log.warning("job %s: could not let go of swarm '%s' before the commit: %s", rec.id, rec.swarm, exc)


def _job_compute(rec: JobRecord) -> ComputeBackend | None:
    """The compute backend of the job's swarm, made once for a whole wait (None: job_status says why)."""
    if not rec.swarm:
        return None
    try:
        from prefect_swarm.holding import default_holding

        return default_holding().attach(rec.swarm).compute
    except Exception:
        return None


def _job_budget(rec: JobRecord, store: StateStore) -> tuple[Swarm, BudgetGuard] | None:
    """The job's swarm and its budget guard; None when the swarm has no budget."""
    swarm_rec = store.get_swarm(rec.swarm) if rec.swarm else None
    if swarm_rec is None or not recorded_cost(swarm_rec.config).capped:
        return None
    from prefect_swarm.holding import default_holding

    swarm = default_holding(store).attach(swarm_rec.name)
    return swarm, budget_guard(swarm)


def _hold_to_budget(swarm: Swarm, guard: BudgetGuard, rec: JobRecord, doc: dict[str, Any], store: StateStore) -> None:
    """The control plane's one hold of the budget, for a job it waits on: while the job runs and the swarm
    is past its budget (the guard's check), stop the job (its processes flush and exit 75); once it has
    ended, its shards may have stopped themselves at the budget (they hold it request by request). Either
    way the swarm goes down and BudgetReached gives the final word; a rerun with a larger budget resumes."""
    if JobStatus(doc["status"]) in ACTIVE:
        try:
            guard.check()
        except BudgetReached:
            cancel_job(rec.id, store=store, compute=swarm.compute)
        else:
            return
    elif doc["status"] != JobStatus.PREEMPTED or stopped_by_budget(doc.get("progress") or {}) is None:
        return
    reached = budget_reached(swarm, JobSpec.model_validate(rec.spec))
    swarm.down()
    raise reached


def commit_job(job_id: str, *, store: StateStore | None = None) -> dict[str, Any]:
    """Merge the shard ledgers into the output (cheap when already committed); record it; return the manifest."""
    store = store or StateStore()
    spec = JobSpec.model_validate(store.require_job(job_id).spec)
    manifest = commit_output(spec)
    status = JobStatus.SUCCEEDED if verdict_of(spec, manifest).succeeded else JobStatus.FAILED
    store.update_job(job_id, status=status, progress=_sums(manifest))
    return manifest


def _sums(manifest: dict[str, Any]) -> dict[str, Any]:
    keys = ("rows", "ok", "failed", "prompt_tokens", "completion_tokens")
    out = {k: manifest.get(k) for k in keys}
    out.update(done=manifest.get("rows"), total=manifest.get("rows"))
    return out


def cancel_job(
    job_id: str, *, store: StateStore | None = None, compute: ComputeBackend | None = None
) -> dict[str, Any]:
    """Stop every process of the job (they flush and exit 75); mark it CANCELLED. Idempotent.

    ``compute`` is the swarm's compute backend when the caller has it (the Prefect layer reattaches
    with the secrets of the block the swarm came from); else it is found from the state database."""
    store = store or StateStore()
    rec = store.require_job(job_id)
    subs = rec.submissions
    if compute is None and subs and rec.swarm and store.get_swarm(rec.swarm) is not None:
        from prefect_swarm.holding import default_holding

        compute = default_holding(store).attach(rec.swarm).compute
    if compute is not None:
        for sub in subs:
            compute.cancel(JobHandle.from_dict(sub))
    store.update_job(job_id, status=JobStatus.CANCELLED)
    return {"id": job_id, "status": JobStatus.CANCELLED.value}


def list_jobs(swarm: str | None = None, *, store: StateStore | None = None) -> list[JobRecord]:
    """Every recorded job (of one swarm if given), oldest first."""
    return (store or StateStore()).list_jobs(swarm)
