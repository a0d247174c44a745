"""Job tasks: prepare + plan (from the ledger), run one shard, commit.

``run_shard`` submits ONE shard through the swarm's compute backend and waits in short steps,
honouring the flow run's stop event, keeping a progress artifact current. Its cache key is
(job fingerprint, shard, nshards) with results persisted under ``$PREFECT_SWARM_HOME``, so a
rerun shows finished shards as Cached; the ledger stays the truth (a shard the ledger calls
pending is always rerun, with ``refresh_cache``), and a retry resumes from the ledger.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from prefect_swarm.exceptions import CapacityError, ConfigError, DatasetError, JobError
from prefect_swarm.interfaces import JobHandle, JobStatus
from prefect_swarm.jobs.commit import commit_output as _commit
from prefect_swarm.jobs.fingerprint import job_fingerprint
from prefect_swarm.jobs.plan import pending_shards, shard_done, shard_progress
from prefect_swarm.jobs.shard import EXIT_BAD_INPUT, EXIT_OK, EXIT_REQUEUE, validate_input
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import SwarmPaths, read_json
from prefect_swarm.settings import get_settings
from prefect_swarm.state import JobRecord, StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.tasks._common import current_flow_run_id, current_task_run_id, retry_on_type, stop_event

POLL_MIN_S, POLL_MAX_S = 0.1, 2.0
"""Shard polling steps grow from POLL_MIN_S to POLL_MAX_S: short jobs end fast, a cancel is seen in <= 2 s."""
ARTIFACT_EVERY_S = 3.0
"""Least seconds between two progress-artifact updates (each is an API call)."""


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


def results_dir() -> Path:
    """Where shard task results (the Prefect cache) are persisted."""
    return get_settings().home_dir / "prefect-results"


def job_id_for(swarm_name: str, spec: JobSpec, fingerprint: str) -> str:
    """A job id that is the same for the same parameters, so a rerun finds its ledger."""
    key = f"{Path(spec.output).expanduser().resolve()}|{fingerprint}|{spec.shards}"
    return f"{swarm_name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def prepare_spec(spec: JobSpec, swarm_name: str) -> JobSpec:
    """Fill job_id and job_dir deterministically (under the swarm's folder), save spec.json."""
    fp = job_fingerprint(spec)
    job_id = spec.job_id or job_id_for(swarm_name, spec, fp)
    job_dir = spec.job_dir or str(SwarmPaths.for_swarm(swarm_name).job_dir(job_id))
    spec = spec.model_copy(update={"job_id": job_id, "job_dir": job_dir, "swarm": spec.swarm or swarm_name})
    spec.paths.ensure()
    spec.save()
    return spec


@task(name="plan-shards", cache_policy=NO_CACHE)
def plan_shards(spec: JobSpec, swarm_name: str) -> JobPlan:
    """Validate the input (before any GPU is asked for), save the spec, read which shards are pending."""
    spec = prepare_spec(spec, swarm_name)
    validate_input(spec)
    fp = job_fingerprint(spec)
    pending = pending_shards(spec)
    done = [i for i in range(spec.shards) if i not in pending]
    get_run_logger().info(
        "Job %s: %d/%d shards pending (fingerprint %s, ledger %s).",
        spec.job_id,
        len(pending),
        spec.shards,
        fp,
        spec.job_dir,
    )
    return JobPlan(spec=spec, fingerprint=fp, pending=pending, done=done)


def shard_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a shard task: job fingerprint, shard, shard count (the endpoint is not part of it)."""
    fp, shard, nshards = parameters["fingerprint"], parameters["shard"], parameters["spec"].shards
    return f"prefect-swarm-{fp}-shard-{shard}-of-{nshards}"


@task(
    name="run-shard",
    task_run_name="shard-{shard}",
    cache_key_fn=shard_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=3,
    retry_condition_fn=retry_on_type,
)
def run_shard(spec: JobSpec, shard: int, fingerprint: str, swarm: Swarm | None = None) -> dict[str, Any]:
    """Run shard ``shard`` of ``spec`` to the end (resuming its ledger); return its progress."""
    if shard_done(spec, shard, fingerprint):
        return _summary(spec, shard, "skipped")
    if swarm is None:
        raise ConfigError(f"shard {shard} of job {spec.job_id} is pending but no swarm was given.")
    return ShardWatch(spec, shard, swarm).run()


class ShardWatch:
    """Submit one shard, then poll it in short steps until it ends or the flow's stop event is set."""

    def __init__(self, spec: JobSpec, shard: int, swarm: Swarm) -> None:
        self.spec, self.shard, self.swarm = spec, shard, swarm
        self.compute = swarm.compute
        self.stop = stop_event()
        self.log = get_run_logger()
        self.artifact_id: Any = None
        self.last_artifact = 0.0

    def run(self) -> dict[str, Any]:
        """Submit, watch, interpret the exit code."""
        handle = self._submit()
        try:
            status, code = self._watch(handle)
        except BaseException:
            self.compute.cancel(handle)
            raise
        self._record(handle, status.value)
        self._publish(force=True)
        return self._outcome(status, code)

    def _submit(self) -> JobHandle:
        spec, i = self.spec, self.shard
        command = [sys.executable, "-m", "prefect_swarm.jobs.run", "--spec", str(spec.paths.spec)]
        handle = self.compute.submit(
            name=f"{spec.job_id}-s{i}", command=command, nshards=spec.shards, shard_id=i, detach=True
        )
        self._record(handle, JobStatus.RUNNING.value)
        self.log.info(
            "Shard %d/%d of job %s submitted on %s (job %s).",
            i,
            spec.shards,
            spec.job_id,
            handle.backend,
            handle.id,
        )
        self.artifact_id = create_progress_artifact(
            progress=_percent(shard_progress(spec, i)), description=f"job {spec.job_id} shard {i}: rows done"
        )
        return handle

    def _watch(self, handle: JobHandle) -> tuple[JobStatus, int | None]:
        step = POLL_MIN_S
        while True:
            probe = self.compute.probe(handle)
            if probe.status is not None and probe.status.finished:
                return probe.status, probe.exit_code
            self._publish()
            if self.stop.wait(step):
                self.log.warning("Shard %d: flow run is stopping; cancelling job %s.", self.shard, handle.id)
                self.compute.cancel(handle)
                self._record(handle, JobStatus.CANCELLED.value)
                raise JobError(f"shard {self.shard} of job {self.spec.job_id} stopped: the flow run is ending.")
            step = min(step * 1.5, POLL_MAX_S)

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.artifact_id is None or (not force and now - self.last_artifact < ARTIFACT_EVERY_S):
            return
        self.last_artifact = now
        update_progress_artifact(artifact_id=self.artifact_id, progress=_percent(shard_progress(self.spec, self.shard)))

    def _outcome(self, status: JobStatus, code: int | None) -> dict[str, Any]:
        spec, i = self.spec, self.shard
        if status is JobStatus.SUCCEEDED and code in (None, EXIT_OK):
            return _summary(spec, i, "ran")
        tail = _log_tail(self.swarm, i, spec)
        if code == EXIT_BAD_INPUT:
            raise DatasetError(f"shard {i} of job {spec.job_id} refused its input (exit 2).\n{tail}")
        if code == EXIT_REQUEUE:
            raise CapacityError(f"shard {i} of job {spec.job_id} was preempted (exit 75); retrying resumes it.")
        raise JobError(f"shard {i} of job {spec.job_id} ended {status.value} (exit {code}).\n{tail}")

    def _record(self, handle: JobHandle, status: str) -> None:
        store = StateStore()
        rec_id = f"{self.spec.job_id}-s{self.shard}"
        store.put_job(
            JobRecord(
                id=rec_id,
                spec=self.spec.model_dump(mode="json"),
                status=status,
                swarm=self.swarm.cfg.name,
                handle=handle.to_dict(),
                shard=self.shard,
                nshards=self.spec.shards,
                progress=shard_progress(self.spec, self.shard),
                flow_run_id=current_flow_run_id(),
                task_run_id=current_task_run_id(),
                job_dir=self.spec.job_dir,
            )
        )


def _percent(progress: dict[str, Any]) -> float:
    total = int(progress.get("total") or 0)
    return 100.0 if total == 0 else round(100.0 * int(progress.get("done") or 0) / total, 1)


def _summary(spec: JobSpec, shard: int, how: str) -> dict[str, Any]:
    return {**shard_progress(spec, shard), "shard": shard, "how": how}


def _log_tail(swarm: Swarm, shard: int, spec: JobSpec, lines: int = 20) -> str:
    for path in (spec.paths.shard(shard).log, spec.paths.log(shard)):
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        return f"log tail ({path}):\n" + "\n".join(text)
    return ""


@task(name="commit-output", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def commit_output(spec: JobSpec) -> dict[str, Any]:
    """Merge the shard ledgers into the output (cheap when already committed); return the manifest."""
    manifest = _commit(spec)
    get_run_logger().info(
        "Output %s: %s rows (%s ok, %s failed).",
        manifest.get("output"),
        manifest.get("rows"),
        manifest.get("ok"),
        manifest.get("failed"),
    )
    return manifest


def read_manifest(spec: JobSpec) -> dict[str, Any] | None:
    """The job's manifest, if it was committed."""
    data = read_json(spec.paths.manifest)
    return dict(data) if isinstance(data, dict) else None
