"""Local compute: a job is one subprocess per shard on this machine.

Each process runs under ``python -m prefect_swarm.sidecar.exitcode`` in its own process group, so
any later process can learn how it ended from ``logs/shard-<i>.exit.json``; pids are recorded with
their create time in ``launch.json`` (and the handle), so a reattached process never signals a
recycled pid. Files live in ``SwarmPaths.job_dir(handle.id)``:

    launch.json                 what was started (no secrets)
    logs/shard-<i>.log          stdout+stderr of shard i
    logs/shard-<i>.exit.json    exit code, written when shard i ends

Shards start staggered: as many at once as this machine has cores for this process; shard i (from
then on) waits until shard i - cores has written its first log line (its modules loaded, its
checkpoint open: it is about to send), at most a few seconds (the wrapper's ``--after``). Loading a
job process's modules takes ~0.5 s of CPU; 64 shards loading at once on 2 cores took 77 s to the
first request, the stagger brings it to what one shard takes.

The job's environment: this process's, the swarm's ``env``, ``ENDPOINT`` (serving URL), ``MODEL``
(served name), ``PREFECT_SWARM_ENDPOINTS`` (every replica URL, comma-separated), the caller's
``env``, then ``secret_env`` (and the swarm's API key as ``PREFECT_SWARM_API_KEY``) — secrets go
through the environment only, never into a file.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.common import LogFollower
from prefect_swarm.backends.local.processes import spawn, stop
from prefect_swarm.backends.sleep import asleep_urls
from prefect_swarm.exceptions import StateError
from prefect_swarm.interfaces import ComputeBase, Follow, JobHandle, JobProbe, JobRequest, JobRuntime, JobStatus, jobenv
from prefect_swarm.paths import JobPaths, atomic_write_json, read_json
from prefect_swarm.sidecar.procref import ProcRef

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.interfaces import ServingHandle
    from prefect_swarm.paths import SwarmPaths

CANCEL_GRACE_S = 10.0
"""Seconds a job process gets to flush after SIGTERM before SIGKILL."""


class LocalCompute(ComputeBase):
    """ComputeBackend running job processes on this machine."""

    backend = "local"

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths, serving_handle: ServingHandle | None = None) -> None:
        self.cfg = cfg
        self.paths = paths
        self.serving = serving_handle

    def endpoints(self) -> list[str]:
        """:meth:`ComputeBase.endpoints` less the replicas asleep (``prefect-swarm sleep``)."""
        out = asleep_urls(self.paths)
        return [url for url in super().endpoints() if url not in out]

    def job_runtime(self) -> JobRuntime:
        """This interpreter, on this machine; the swarm's env and ``PREFECT_SWARM_HOME``."""
        env = {jobenv.HOME: jobenv.env_value(jobenv.HOME) or "", **self.cfg.env}
        return JobRuntime(python=sys.executable, env={k: v for k, v in env.items() if v})

    # ------------------------------------------------------------------ submit
    def _launch(self, request: JobRequest) -> JobHandle:
        """Start one process per shard; ``resources`` are not enforced locally."""
        job_id = f"{_slug(request.name)}-{uuid.uuid4().hex[:8]}"
        jp = JobPaths(self.paths.job_dir(job_id)).ensure()
        secrets = self.job_secret_env(request)
        procs = []
        cores = max(1, len(os.sched_getaffinity(0)))
        shards = list(request.shards())
        for k, i in enumerate(shards):
            argv = request.argv(i)
            env = {**os.environ, **self.job_env(request, i), **secrets}
            after = jp.log(shards[k - cores]) if k >= cores else None
            ref = self._start(jp, i, argv, env, request.workdir, after=after)
            procs.append({"shard_id": i, **ref.to_dict(), "command": shlex.join(argv)})
        record = {
            "id": job_id,
            "name": request.name,
            "nshards": request.nshards,
            "shards": procs,
            "workdir": request.workdir,
            "job_dir": str(jp.root),
            "submitted_at": time.time(),
            "cancelled_at": None,
        }
        atomic_write_json(jp.launch, record)
        logs = [str(jp.log(p["shard_id"])) for p in procs]  # where `job status` finds a failed shard's log
        meta = {"job_dir": str(jp.root), "nshards": request.nshards, "shards": procs, "logs": logs}
        return JobHandle(id=job_id, backend=self.backend, name=request.name, meta=meta)

    def _start(
        self, jp: JobPaths, i: int, argv: list[str], env: dict[str, str], workdir: str | None, *, after: Path | None
    ) -> ProcRef:
        log, exit_file = jp.log(i), jp.exit_status(i)
        log.parent.mkdir(parents=True, exist_ok=True)
        exit_file.unlink(missing_ok=True)
        wrapped = [
            sys.executable,
            "-m",
            "prefect_swarm.sidecar.exitcode",
            "--out",
            str(exit_file),
            *(["--after", str(after)] if after is not None else []),
            "--",
            *argv,
        ]
        return spawn(wrapped, env, log, workdir)

    # ------------------------------------------------------------------ reattach
    def handle_for(self, job_id: str) -> JobHandle:
        """Rebuild the handle of job ``job_id`` from its launch record (any process, any time)."""
        rec = read_json(JobPaths(self.paths.job_dir(job_id)).launch)
        if not isinstance(rec, dict):
            raise StateError(f"no local job '{job_id}' under {self.paths.root / 'jobs'} (launch.json missing).")
        return JobHandle(
            id=job_id,
            backend=self.backend,
            name=rec.get("name", ""),
            meta={"job_dir": rec["job_dir"], "nshards": rec["nshards"], "shards": rec["shards"]},
        )

    def _paths(self, handle: JobHandle) -> JobPaths:
        return JobPaths(Path(handle.meta.get("job_dir") or self.paths.job_dir(handle.id)))

    def _shards(self, handle: JobHandle) -> list[dict[str, Any]]:
        shards = handle.meta.get("shards")
        return list(shards) if shards else list(self.handle_for(handle.id).meta["shards"])

    # ------------------------------------------------------------------ probe / wait / cancel
    def probe(self, handle: JobHandle) -> JobProbe:
        """Exit files and identity-checked pids only: never blocks."""
        try:
            jp = self._paths(handle)
            outcomes = [_shard_outcome(jp, sh) for sh in self._shards(handle)]
            launch = read_json(jp.launch) or {}
        except (OSError, KeyError, StateError) as exc:
            return JobProbe(status=None, error=f"cannot read job '{handle.id}': {exc}")
        return _aggregate(outcomes, cancelled=bool(launch.get("cancelled_at")))

    def _follow(self, handle: JobHandle) -> Follow:
        jp, name = self._paths(handle), handle.name or handle.id
        shards = [int(sh["shard_id"]) for sh in self._shards(handle)]
        return LogFollower(lambda: [(f"{name} shard {i}", jp.log(i)) for i in shards])

    def cancel(self, handle: JobHandle) -> None:
        """TERM each shard's wrapper (it forwards to the job), KILL its group after a grace. Idempotent."""
        jp = self._paths(handle)
        shards = self._shards(handle)
        if all(_shard_outcome(jp, sh)[1] != "running" for sh in shards):
            return  # finished (exit status written): cancelling must not relabel the outcome
        refs = [ProcRef.from_dict(sh) for sh in shards]
        launch = read_json(jp.launch) or {}
        if launch:
            atomic_write_json(jp.launch, {**launch, "cancelled_at": time.time()})
        stop(refs, grace_s=CANCEL_GRACE_S, term_group=False)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:40] or "job"


def _shard_outcome(jp: JobPaths, shard: dict[str, Any]) -> tuple[int, str, int | None]:
    """(shard, 'running'|'done'|'vanished', exit code) of one shard process."""
    i = int(shard["shard_id"])
    done = read_json(jp.exit_status(i))
    if isinstance(done, dict):
        return i, "done", done.get("exit_code")
    ref = ProcRef.from_dict(shard)
    if ref is not None and ref.alive():
        return i, "running", None
    done = read_json(jp.exit_status(i))  # it may have finished between the two looks
    if isinstance(done, dict):
        return i, "done", done.get("exit_code")
    return i, "vanished", None


def _aggregate(outcomes: list[tuple[int, str, int | None]], cancelled: bool) -> JobProbe:
    running = [i for i, state, _ in outcomes if state == "running"]
    bad = [(i, state, code) for i, state, code in outcomes if state != "running" and (state != "done" or code != 0)]
    detail = "; ".join(
        f"shard {i} " + (f"exited {code}" if state == "done" else "vanished without an exit status")
        for i, state, code in bad
    )
    if running:
        head = f"{len(running)}/{len(outcomes)} shard(s) running"
        return JobProbe(JobStatus.RUNNING, detail="; ".join(filter(None, [head, detail])))
    if cancelled:
        return JobProbe(JobStatus.CANCELLED, exit_code=bad[0][2] if bad else 0, detail=detail or "cancelled")
    if bad:
        status = JobStatus.combine(JobStatus.of_exit(code if state == "done" else None) for _, state, code in bad)
        return JobProbe(status, exit_code=bad[0][2], detail=detail)
    return JobProbe(JobStatus.SUCCEEDED, exit_code=0, detail=f"{len(outcomes)} shard(s) succeeded")
