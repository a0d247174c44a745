"""SlurmCompute: job processes as ``srun --jobid=<raw id> --overlap`` steps inside the swarm's allocation.

Steps run in the LB job's allocation (the one job that must live for the endpoint to work), so a
replica task that dies or is cancelled does not take a job's shards with it. Without a running LB
job there is no endpoint: submit refuses at once (ReadinessError) rather than start steps that
would send every row to a dead address.

* n shards = n steps (fan-out); each resumes from its ledger, which the job process owns.
* Submit starts the ``srun`` processes and returns: it asks Slurm nothing per step. A step is
  known by its name (``meta.step_names``, unique per submission); the external id is
  ``<jobid>:<name of the first step>``. Any process can probe, wait for or cancel it.
* Probe: one ``squeue`` for the running steps of the allocation, then (only for steps no longer
  running) one ``sacct`` (which lags ~0.5 s) -- per allocation, however many handles and shards
  :meth:`SlurmCompute.probe_many` is given (a job's one watcher). Neither knowing a step is "could
  not tell" (``JobProbe.error``), never "failed"; a step that never showed up in either within
  ``STEP_APPEAR_S`` of its start did not start (srun's error is in the step log): FAILED.
* Environment: srun's own process environment with ``--export=ALL`` -- values with commas, quotes
  or newlines arrive intact, and secrets appear in no printed command and no file.
* With ``backend.jobs``, or for a job of more shards than the LB job hosts
  (:func:`render.step_slots`), each shard is an sbatch job of its own instead (``psw-<swarm>.<job>-...``,
  external id = job ids); the LB job must still run (it is the endpoint).
* A shard stopped by the scheduler (exit 75 after its flush, or sacct's PREEMPTED) reads PREEMPTED,
  with the command that resumes it in the probe's detail.
* Preemption/walltime: the allocation was submitted with ``--signal=USR1@N`` (no ``B:``), which
  Slurm delivers to every job step, so the job process flushes its ledger before it is killed.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.common import LogFollower, head_url, start_logged
from prefect_swarm.backends.slurm import identity, members, render
from prefect_swarm.backends.slurm.client import AcctEntry, QueueEntry, SlurmClient, clean_env
from prefect_swarm.backends.slurm.lb import read_heads
from prefect_swarm.backends.slurm.lb import resolve as lb_resolve
from prefect_swarm.backends.slurm.states import slurm_job_status
from prefect_swarm.exceptions import BackendError, CapacityError, ReadinessError
from prefect_swarm.interfaces import ComputeBase, Follow, JobHandle, JobProbe, JobRequest, JobRuntime, JobStatus, jobenv
from prefect_swarm.paths import JobPaths, SwarmPaths, open_log, read_json, read_text

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.interfaces import ServingHandle

STEP_APPEAR_S = 60.0
"""How long a started srun may take to show up as a step (in squeue or sacct) before it counts as failed."""
TARGET_POLL_S = 1.0
"""How often submit asks squeue while the swarm's jobs are still starting."""
TARGET_REUSE_S = 30.0
"""A running LB job found by one submit is reused by the next ones of this process for that long
(the flow submits one shard per task: 512 shards are not 512 ``squeue`` calls)."""
_TARGET_LOCK = threading.Lock()
_TARGETS: dict[str, tuple[str, float, str]] = {}
"""LB job name -> (raw job id, monotonic time it was seen running, its ``lb.head`` then): reused only
while ``lb.head`` still says the same (a replaced LB job writes its own)."""
STEP_SHOW_S = 10.0
"""cancel(): how long it waits for steps it started (srun running) to be registered, to stop them too."""
CANCEL_GRACE_S = 20.0
"""cancel(): how long steps get after TERM to flush their ledgers before they are killed."""
LB_HEAD_WAIT_S = 60.0
"""Once the LB job runs, how long submit waits for it to write ``lb.head`` (the jobs' ENDPOINT)."""
_STARTING = {"PENDING", "CONFIGURING", "REQUEUED", "RESIZING"}
"""Queue states from which a job goes on to RUNNING."""
_QUEUED = _STARTING | {"RUNNING"}
"""Queue states of a job that runs or will."""


class SlurmCompute(ComputeBase):
    """ComputeBackend running job processes as steps in a Slurm swarm's allocation."""

    backend = "slurm"

    def __init__(
        self,
        cfg: SwarmConfig,
        paths: SwarmPaths,
        serving_handle: ServingHandle | None,
        client: SlurmClient | None = None,
    ) -> None:
        self.paths = render.swarm_paths(cfg, paths)
        self.cfg = identity.with_key(cfg, self.paths)  # job steps get the swarm's generated key
        self.serving = serving_handle
        self.client = client or SlurmClient()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._sids: dict[str, str] = {}
        """Step name -> ``jobid.stepid``, as squeue showed it (sacct then asks for just those steps)."""
        self._final: dict[str, AcctEntry] = {}
        """Step name (or shard job id) -> its accounting once it ended: never asked for again."""

    def job_runtime(self) -> JobRuntime:
        """``backend.job_python`` (else this interpreter) on the compute nodes; the swarm's env and home."""
        env = {jobenv.HOME: jobenv.env_value(jobenv.HOME) or "", **self.cfg.env}
        return JobRuntime(python=render.job_python(self.cfg), env={k: v for k, v in env.items() if v})

    def endpoints(self) -> list[str]:
        """The healthy replicas themselves (their head files ``replica-<i>.head``, which the watchdog
        writes once the replica answered and removes when it stops: what the LB routes to), in
        replica order; the LB's URL (``lb.head``) when none has announced itself. Job steps run
        inside the cluster, so they reach the replicas: the LB stays the swarm's public endpoint."""
        # addresses resolved as the LB reconciler resolves them for targets.json (the replica list a
        # running job re-reads to find replicas added by `scale`): one replica, one spelling
        replicas = [f"http://{lb_resolve(head) or head}" for _, head in sorted(read_heads(self.paths).items())]
        lb = head_url(self.paths.lb_head)
        return replicas or ([lb] if lb else [])

    def job_env(self, request: JobRequest, shard: int) -> dict[str, str]:
        """:meth:`ComputeBase.job_env` with ``ENDPOINT`` the swarm's public endpoint (the LB), for
        users' scripts; the job's own requests go to ``PREFECT_SWARM_ENDPOINTS`` (the replicas)."""
        env = super().job_env(request, shard)
        lb = head_url(self.paths.lb_head)
        return {**env, jobenv.ENDPOINT: lb} if lb and jobenv.ENDPOINT not in request.env else env

    # ------------------------------------------------------------------ submit
    def _launch(self, request: JobRequest) -> JobHandle:
        """Start one step per shard in the swarm's allocation (or, with ``backend.jobs``, one sbatch
        job per shard); see the module docstring."""
        with _TARGET_LOCK:  # shard tasks submitting at once: one looks, the others reuse what it found
            jobid = self._target()
        if render.shards_as_jobs(self.cfg, request.nshards):  # more shards than the LB's allocation hosts
            return self._launch_jobs(request)
        token = secrets.token_hex(3)
        names, logs = [], []
        secret = self.job_secret_env(request)
        started_at = time.time()
        for shard in request.shards():
            label = shard if request.sharded else "x"
            step_name = f"{render.JOB_PREFIX}{self.cfg.name}-{request.name}-{label}-{token}"
            log = self._log_path(request.workdir if request.sharded else None, shard, step_name)
            env = {**self.job_env(request, shard), **secret}
            self._start(jobid, step_name, request.argv(shard), env, log, request.workdir)
            names.append(step_name)
            logs.append(str(log))
        return _handle(request, [f"{jobid}:{names[0]}"], names, logs, jobid=jobid, started_at=started_at)

    def _launch_jobs(self, request: JobRequest) -> JobHandle:
        """One sbatch job per shard with ``backend.jobs`` resources (the swarm's LB runs: checked first)."""
        names = render.job_names(self.cfg)
        token = secrets.token_hex(3)
        secret = self.job_secret_env(request)
        ids, job_names, logs = [], [], []
        for shard in request.shards():
            label = shard if request.sharded else "x"
            name = f"{names.shard_prefix}{request.name}-{label}-{token}"
            log = self._log_path(request.workdir if request.sharded else None, shard, name)
            workdir = Path(request.workdir) if request.workdir else self.paths.root
            argv = render.shard_job_argv(self.cfg, name=name, log=log, workdir=workdir, command=request.argv(shard))
            with open_log(log) as out:
                out.write(f"# prefect-swarm: {shlex.join(argv)}\n".encode())
            env = {**self.job_env(request, shard), **secret}
            out_text = self.client.run(argv, what=f"submit shard {label} of job {request.name}", env=env)
            job_id = out_text.strip().split(";")[0]
            if not job_id.isdigit():
                raise BackendError(f"sbatch printed no job id for shard {label}: {out_text!r}", command=argv[:1])
            ids.append(job_id)
            job_names.append(name)
            logs.append(str(log))
        return _handle(request, ids, job_names, logs, mode="jobs", jobs=ids)

    def _target(self) -> str:
        """Raw id of the allocation steps go into: the swarm's LB job (found by its job name).

        Right after ``up`` the jobs are still PENDING/CONFIGURING: wait (polling squeue, at most
        ``backend.queue_timeout_s``) for the LB job to run and announce itself (``lb.head``, so the
        step gets ``ENDPOINT``); still queued at the end: CapacityError with Slurm's pending reason.
        No LB job in the queue: ReadinessError at once (exit 4), never steps against a dead endpoint.
        """
        names = render.job_names(self.cfg)
        seen = _TARGETS.get(names.lb)
        if seen is not None and time.monotonic() - seen[1] < TARGET_REUSE_S and self._lb_head() == seen[2]:
            return seen[0]
        queue_timeout = render.slurm_section(self.cfg).queue_timeout_s
        start = time.monotonic()
        deadline = start + queue_timeout
        head_deadline: float | None = None
        while True:
            entries = [e for e in self.client.squeue(names=names.all()) if e.state in _QUEUED]
            lb = next((e for e in entries if e.name == names.lb), None)
            now = time.monotonic()
            if lb is None:
                if self._lb_replaced(entries) and now < deadline:
                    time.sleep(TARGET_POLL_S)  # a replica task resubmits it within members.KEEP_LB_S
                    continue
                self._refuse(entries)
            elif lb.state == "RUNNING":
                self._refuse_ending(lb)
                head_deadline = head_deadline or now + LB_HEAD_WAIT_S
                if head_url(self.paths.lb_head):
                    _TARGETS[names.lb] = (lb.raw_id, now, self._lb_head())
                    return lb.raw_id
                if now >= head_deadline:
                    return lb.raw_id
            elif lb.state not in _STARTING:
                self._refuse(entries)
            elif now >= deadline:
                waiting = ", ".join(f"{e.id} {e.state} ({e.reason})" for e in entries)
                raise CapacityError(
                    f"swarm '{self.cfg.name}' had no running Slurm allocation to run job steps in "
                    f"after {now - start:.0f}s (backend.queue_timeout_s={queue_timeout:g}): {waiting}.\n"
                    f"Hint: `prefect-swarm status {self.cfg.name}`; submit again once it runs, or "
                    "ask for fewer resources / another partition."
                )
            time.sleep(TARGET_POLL_S)

    def _lb_head(self) -> str:
        """``lb.head`` now, with its mtime ('' when there is none): it goes with its LB job (written once
        nginx answers, removed by its script's exit and by a replacement, which may reuse the address)."""
        try:
            return f"{read_text(self.paths.lb_head)}@{self.paths.lb_head.stat().st_mtime_ns}"
        except OSError:
            return ""

    def _lb_replaced(self, entries: Sequence[QueueEntry]) -> bool:
        """True while a replica task will resubmit the LB job that left the queue (see :mod:`members`)."""
        record = read_json(self.paths.slurm_record, {}) or {}
        live = any(e.state == "RUNNING" for e in entries)
        return live and int(record.get("array_tasks") or 0) > 0 and not members.no_replacement(record, "lb")

    def _refuse_ending(self, lb: QueueEntry) -> None:
        """An LB job about to reach its time limit takes no new steps (Slurm would kill them)."""
        if lb.time_left_s is not None and lb.time_left_s < render.slurm_section(self.cfg).ending_s:
            raise ReadinessError(
                f"the allocation of swarm '{self.cfg.name}' (LB job {lb.id}) reaches its time limit in "
                f"{lb.time_left_s:.0f}s (backend.time_limit bounds the swarm's life); no job step was started.",
                hint=f"`prefect-swarm up -c {SwarmPaths.for_swarm(self.cfg.name).config}` waits for it to end "
                "and brings the swarm up again; `job submit --resubmit-on-preempt N` does the same by itself.",
            )

    def _refuse(self, entries: Sequence[QueueEntry]) -> None:
        """The swarm has no live load balancer: nothing to send rows to."""
        config = SwarmPaths.for_swarm(self.cfg.name).config
        if not entries:
            raise ReadinessError(
                f"swarm '{self.cfg.name}' has no Slurm job in the queue to run job steps in.",
                hint=f"`prefect-swarm status {self.cfg.name}`; bring it up again with `prefect-swarm up -c {config}`.",
            )
        stopped = ((read_json(self.paths.slurm_record, {}) or {}).get("stopped") or {}).get("reason")
        raise ReadinessError(
            f"the load balancer job of swarm '{self.cfg.name}' is not running, so the swarm has no endpoint "
            f"({len(entries)} replica task(s) still queued){f'; the swarm is stopping: {stopped}' if stopped else ''}; "
            "no job step was started.",
            hint=f"`prefect-swarm up -c {config}` resubmits the load balancer and keeps the running "
            f"replicas; `prefect-swarm status {self.cfg.name}` shows the swarm.",
        )

    def _log_path(self, workdir: str | None, shard: int | None, step_name: str) -> Path:
        """The shard's log in its job folder, else a log of its own under ``steps/``."""
        if workdir and shard is not None:
            return JobPaths(Path(workdir)).log(shard)
        return self.paths.step_log(step_name)

    def _start(
        self, jobid: str, step_name: str, argv: list[str], env: dict[str, str], log: Path, workdir: str | None
    ) -> None:
        srun = render.step_argv(self.cfg, jobid=jobid, step_name=step_name, command=argv)
        with open_log(log) as out:
            out.write(f"# prefect-swarm: {shlex.join(srun)}\n".encode())
        try:
            proc = start_logged(srun, clean_env(env), log, workdir)
        except FileNotFoundError as exc:
            raise BackendError("srun not found", command=srun[:1], hint="install the Slurm client tools.") from exc
        self._procs[step_name] = proc

    # ------------------------------------------------------------------ probe / wait / cancel
    def probe(self, handle: JobHandle) -> JobProbe:
        """squeue, then sacct; aggregated over a fan-out. Never blocks."""
        return self.probe_many([handle])[0]

    def probe_many(self, handles: Sequence[JobHandle]) -> list[JobProbe]:
        """Every handle's probe from one ``squeue`` per allocation (running steps) and at most one
        ``sacct`` per allocation (the steps no longer running), whatever the number of shards."""
        self._reap()
        out: dict[int, JobProbe] = {}
        jobs = [k for k, h in enumerate(handles) if h.meta.get("mode") == "jobs"]
        if jobs:
            for k, probe in zip(jobs, self._probe_jobs([handles[k] for k in jobs]), strict=True):
                out[k] = self._preempted(handles[k], probe)
        by_alloc: dict[str, list[int]] = {}
        for k, h in enumerate(handles):
            if h.meta.get("mode") != "jobs":
                by_alloc.setdefault(_alloc(h), []).append(k)
        for jobid, ks in by_alloc.items():
            for k, probe in zip(ks, self._probe_steps(jobid, [handles[k] for k in ks]), strict=True):
                out[k] = self._preempted(handles[k], probe)
        return [out[k] for k in range(len(handles))]

    def _probe_steps(self, jobid: str, handles: list[JobHandle]) -> list[JobProbe]:
        """Steps of one allocation, known by name: running ones from squeue, the rest from sacct."""
        for h in handles:  # handles written before steps were known by name carry their ids
            self._sids.update(zip(_step_names(h), h.meta.get("steps") or [], strict=False))
        try:
            running = {name: sid for sid, name in self.client.steps(jobid).items()}
            self._sids.update(running)
            gone = [n for h in handles for n in _step_names(h) if n not in running]
            acct, told = self._acct_steps(jobid, gone) if gone else ({}, True)
        except Exception as exc:  # "could not tell" is not "failed"
            return [JobProbe(None, error=f"cannot ask Slurm: {exc}") for _ in handles]
        out = []
        for h in handles:
            names = _step_names(h)
            cancelled = {n for n in names if self.paths.step_cancelled(n).exists()}
            unseen = {n for n in names if n not in running and n not in acct and n not in self._sids}
            young = time.time() - float(h.meta.get("started_at") or 0) <= STEP_APPEAR_S
            starting = unseen if young else set()  # srun started, the step not registered yet
            lost = unseen if told and not young else set()
            out.append(_aggregate(names, set(running) | starting, acct, cancelled, starting, lost=lost))
        return out

    def _acct_steps(self, jobid: str, names: list[str]) -> tuple[dict[str, AcctEntry], bool]:
        """sacct of steps no longer running (by step id where known, else the whole allocation's
        steps: one call either way), by step name; and whether accounting answered at all."""
        known = {n: self._final[n] for n in names if n in self._final}
        ask = [n for n in names if n not in known]
        if not ask:
            return known, True
        sids = [self._sids.get(n) for n in ask]
        query = [sid for sid in sids if sid] if all(sids) else [jobid]
        try:
            entries = self.client.sacct(query)
        except BackendError:  # no accounting (sacct refuses): cannot tell how the steps ended
            return known, False
        wanted = set(ask)
        found = {e.name: e for e in entries if "." in e.id and e.name in wanted}
        self._final.update((n, e) for n, e in found.items() if _ended(e))
        return {**known, **found}, True

    def _probe_jobs(self, handles: list[JobHandle]) -> list[JobProbe]:
        """Shards run as jobs of their own: one squeue, then one sacct (the jobs' own lines, not
        their steps) for every handle."""
        per = [list(h.meta.get("jobs") or h.id.split(",")) for h in handles]
        ids = [i for group in per for i in group]
        live = [i for i in ids if i not in self._final]  # an ended shard job is not asked about again
        try:
            queued = {e.raw_id: e.state for e in self.client.squeue(live) if e.state in _QUEUED} if live else {}
            rest = [i for i in live if i not in queued]
            found = {e.id: e for e in self.client.sacct(rest) if e.id in rest} if rest else {}
        except Exception as exc:  # "could not tell" is not "failed"
            return [JobProbe(None, error=f"cannot ask Slurm: {exc}") for _ in handles]
        self._final.update((i, e) for i, e in found.items() if _ended(e))
        acct = {**{i: self._final[i] for i in ids if i in self._final}, **found}
        cancelled = {i for i in ids if self.paths.step_cancelled(i).exists()}
        pending = {i for i, state in queued.items() if state in _STARTING}
        return [_aggregate(group, set(queued), acct, cancelled, pending) for group in per]

    def _preempted(self, handle: JobHandle, probe: JobProbe) -> JobProbe:
        """A job that ended with shards stopped by Slurm (USR1 before the time limit, preemption:
        exit 75 after the flush, or sacct's PREEMPTED) is resumable: say so, and how."""
        if probe.status is not JobStatus.PREEMPTED:
            return probe
        swarm = self.serving.name if self.serving else self.cfg.name
        how = (
            f"PREEMPTED (resumable): the shards flushed their checkpoints; "
            f"`prefect-swarm job submit -n {swarm} --id {handle.name}` with the same arguments "
            "(or --resubmit-on-preempt N) resumes them"
        )
        return replace(probe, detail=f"{how}; {probe.detail}" if probe.detail else how)

    def _follow(self, handle: JobHandle) -> Follow:
        return LogFollower(lambda: [(Path(log).stem, Path(log)) for log in handle.meta.get("logs") or []])

    def cancel(self, handle: JobHandle) -> None:
        """TERM every running step (the job process flushes its ledger and exits 75), KILL what is
        left after ``CANCEL_GRACE_S``. A finished job keeps its outcome. Idempotent.

        A step stopped this way reads CANCELLED (a marker under ``steps/`` tells probe, from any
        process, that its non-zero exit was asked for), not FAILED.
        """
        if handle.meta.get("mode") == "jobs":
            self._cancel_jobs(list(handle.meta.get("jobs") or handle.id.split(",")))
            return
        jobid, names = _alloc(handle), set(_step_names(handle))

        def live() -> list[str]:
            return [sid for sid, name in self.client.steps(jobid).items() if name in names]

        running = live()
        end = time.monotonic() + STEP_SHOW_S
        while len(running) < len(self._starting(names)) and time.monotonic() < end:
            time.sleep(0.5)  # srun started here and its step is not registered yet: cancel it too
            running = live()
        if running:
            for name in names:
                marker = self.paths.step_cancelled(name)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            self.client.scancel(running, signal="TERM")
            end, left = time.monotonic() + CANCEL_GRACE_S, running
            while left and time.monotonic() < end:
                time.sleep(1.0)
                left = live()
            self.client.scancel(left)
        self._reap()

    def _starting(self, names: set[str]) -> list[str]:
        """Steps of ``names`` whose srun this process started and still runs."""
        return [n for n in names if (proc := self._procs.get(n)) is not None and proc.poll() is None]

    def _cancel_jobs(self, ids: list[str]) -> None:
        """TERM the batch shell (the job process itself: it exec'd), KILL what is left after the grace."""
        running = [e.raw_id for e in self.client.squeue(ids) if e.state in _QUEUED]
        for job_id in running:
            marker = self.paths.step_cancelled(job_id)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        self.client.terminate(running, grace_s=CANCEL_GRACE_S, full=True)

    def _reap(self) -> None:
        for step_name, proc in list(self._procs.items()):
            if proc.poll() is not None:
                del self._procs[step_name]


def _aggregate(
    steps: list[str],
    running: set[str],
    acct: dict[str, AcctEntry],
    cancelled: set[str] | None = None,
    pending: set[str] | None = None,
    *,
    lost: set[str] | None = None,
) -> JobProbe:
    """One probe of a submission's steps (or jobs): ``lost`` ones never started (FAILED)."""
    statuses: list[JobStatus] = []
    codes: list[int] = []
    unknown = []
    for step in steps:
        if step in running:
            statuses.append(JobStatus.PENDING if step in (pending or set()) else JobStatus.RUNNING)
            continue
        if step in (lost or set()):
            statuses.append(JobStatus.FAILED)
            continue
        entry = acct.get(step)
        if entry is None:
            unknown.append(step)
            continue
        status = slurm_job_status(entry.state)
        if status is JobStatus.FAILED and entry.exit_code == jobenv.EXIT_REQUEUE:
            status = JobStatus.PREEMPTED  # flushed, then stopped by Slurm's signal
        if status in (JobStatus.FAILED, JobStatus.PREEMPTED) and step in (cancelled or set()):
            status = JobStatus.CANCELLED  # stopped by cancel(): flushed and exited, as asked
        statuses.append(status)
        if entry.exit_code is not None:
            codes.append(entry.exit_code)
    if unknown:
        return JobProbe(None, error=f"step(s) {', '.join(unknown)} in neither squeue nor sacct yet")
    detail = ", ".join(f"{s}={st.value}" for s, st in zip(steps, statuses, strict=True))
    exit_code = max(codes, default=None) if all(st.finished for st in statuses) else None
    return JobProbe(JobStatus.combine(statuses), exit_code=exit_code, detail=detail)


def _ended(entry: AcctEntry) -> bool:
    """The accounting line is final (the step or job ended); an unknown state is not."""
    try:
        return slurm_job_status(entry.state).finished
    except ValueError:
        return False


def _step_names(handle: JobHandle) -> list[str]:
    """The names of a submission's steps (how probe and cancel find them)."""
    return [str(n) for n in handle.meta.get("step_names") or []]


def _alloc(handle: JobHandle) -> str:
    """Raw id of the allocation a submission's steps run in."""
    return str(handle.meta.get("jobid") or handle.id.split(":")[0].split(".")[0])


def _handle(request: JobRequest, ids: list[str], names: list[str], logs: list[str], **where: Any) -> JobHandle:
    """The handle of a submitted job: its Slurm ids (steps or jobs) and, per shard, name and log."""
    meta = {
        **where,
        "step_names": names,
        "logs": logs,
        "shards": request.shards() if request.sharded else [],
        "nshards": request.nshards,
    }
    return JobHandle(id=",".join(ids), backend="slurm", name=request.name, meta=meta)
