"""Local compute: a job is one subprocess per shard on this machine.

Each process runs under ``python -m prefect_swarm.sidecar.exitcode`` in its own process group, so
any later process can learn how it ended from ``logs/shard-<i>.exit.json``; pids are recorded with
their create time in ``launch.json`` (and the handle), so a reattached process never signals a
recycled pid. Files live in ``SwarmPaths.job_dir(handle.id)``:

    launch.json                 what was started (no secrets)
    logs/shard-<i>.log          stdout+stderr of shard i
    logs/shard-<i>.exit.json    exit code, written when shard i ends

The job's environment: this process's, the swarm's ``env``, ``ENDPOINT`` (serving URL), ``MODEL``
(served name), ``PREFECT_SWARM_ENDPOINTS`` (every replica URL, comma-separated), the caller's
``env``, then ``secret_env`` (and the swarm's API key as ``PREFECT_SWARM_API_KEY``) — secrets go
through the environment only, never into a file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.local.processes import ProcRef, stop
from prefect_swarm.exceptions import StateError
from prefect_swarm.interfaces import DefaultComputeMixin, JobHandle, JobProbe, JobStatus
from prefect_swarm.paths import JobPaths, atomic_write_json, read_json

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.interfaces import ServingHandle
    from prefect_swarm.paths import SwarmPaths

CANCEL_GRACE_S = 10.0
"""Seconds a job process gets to flush after SIGTERM before SIGKILL."""

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this process, kept so their Popen objects are not collected while running."""


class LocalCompute(DefaultComputeMixin):
    """ComputeBackend running job processes on this machine."""

    backend = "local"

    def __init__(
        self, cfg: SwarmConfig, paths: SwarmPaths, serving_handle: ServingHandle | None = None
    ) -> None:
        self.cfg = cfg
        self.paths = paths
        self.serving = serving_handle

    # ------------------------------------------------------------------ environment
    def swarm_env(self) -> dict[str, str]:
        """ENDPOINT, MODEL and PREFECT_SWARM_ENDPOINTS for the swarm behind the serving handle."""
        env = {"MODEL": self.cfg.model_name}
        if self.serving is not None and self.serving.url:
            urls = list(self.serving.meta.get("replica_urls") or [self.serving.url])
            env.update(ENDPOINT=self.serving.url, PREFECT_SWARM_ENDPOINTS=",".join(urls))
        return env

    def _process_env(
        self, env: Mapping[str, str] | None, secret_env: Mapping[str, str] | None, shard_id: int, nshards: int
    ) -> dict[str, str]:
        secrets = dict(secret_env or {})
        if self.cfg.api_key is not None:
            secrets.setdefault("PREFECT_SWARM_API_KEY", self.cfg.api_key.get_secret_value())
        return {
            **os.environ,
            **self.default_env(),
            **self.swarm_env(),
            **(env or {}),
            **secrets,
            "PREFECT_SWARM_SHARD_ID": str(shard_id),
            "PREFECT_SWARM_NSHARDS": str(nshards),
        }

    # ------------------------------------------------------------------ submit
    def submit(
        self,
        *,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        secret_env: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
        detach: bool = True,
        nshards: int = 1,
        shard_id: int | None = None,
        workdir: str | None = None,
    ) -> JobHandle:
        """Start one process per shard (see ComputeBackend.submit); ``resources`` are not enforced locally."""
        if not command:
            raise ValueError("submit needs a command")
        if nshards < 1 or (shard_id is not None and not 0 <= shard_id < nshards):
            raise ValueError(f"shard_id {shard_id} is not in range for nshards={nshards}")
        job_id = f"{_slug(name)}-{uuid.uuid4().hex[:8]}"
        jp = JobPaths(self.paths.job_dir(job_id)).ensure()
        shards = list(range(nshards)) if shard_id is None and nshards > 1 else [shard_id or 0]
        procs = []
        for i in shards:
            argv = (
                list(command) if nshards == 1 and shard_id is None else self.shard_argv(command, nshards, i)
            )
            ref = self._start(jp, i, argv, self._process_env(env, secret_env, i, nshards), workdir)
            procs.append({"shard_id": i, **ref.to_dict(), "command": self.printable(argv)})
        record = {
            "id": job_id,
            "name": name,
            "nshards": nshards,
            "shards": procs,
            "workdir": workdir,
            "job_dir": str(jp.root),
            "submitted_at": time.time(),
            "cancelled_at": None,
        }
        atomic_write_json(jp.launch, record)
        handle = JobHandle(
            id=job_id,
            backend=self.backend,
            name=name,
            meta={"job_dir": str(jp.root), "nshards": nshards, "shards": procs},
        )
        if not detach:
            self.wait(handle)
        return handle

    def _start(
        self, jp: JobPaths, i: int, argv: list[str], env: dict[str, str], workdir: str | None
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
            "--",
            *argv,
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                wrapped,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=workdir,
            )
        _CHILDREN[proc.pid] = proc
        return ProcRef.of(proc.pid)

    # ------------------------------------------------------------------ reattach
    def handle_for(self, job_id: str) -> JobHandle:
        """Rebuild the handle of job ``job_id`` from its launch record (any process, any time)."""
        rec = read_json(JobPaths(self.paths.job_dir(job_id)).launch)
        if not isinstance(rec, dict):
            raise StateError(
                f"no local job '{job_id}' under {self.paths.root / 'jobs'} (launch.json missing)."
            )
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

    def wait(self, handle: JobHandle, stream_logs: bool = False, poll_s: float = 1.0) -> JobStatus:
        """Poll :meth:`probe` until the job ends; with ``stream_logs`` print new log lines as they come."""
        offsets: dict[int, int] = {}
        while True:
            probe = self.probe(handle)
            if stream_logs:
                self._stream(handle, offsets)
            if probe.status is not None and probe.status.finished:
                return probe.status
            time.sleep(poll_s)

    def _stream(self, handle: JobHandle, offsets: dict[int, int]) -> None:
        jp = self._paths(handle)
        for sh in self._shards(handle):
            i = int(sh["shard_id"])
            try:
                with jp.log(i).open("rb") as fh:
                    fh.seek(offsets.get(i, 0))
                    data = fh.read()
            except FileNotFoundError:
                continue
            offsets[i] = offsets.get(i, 0) + len(data)
            for line in data.decode("utf-8", "replace").splitlines():
                print(f"[{handle.name or handle.id} shard {i}] {line}", flush=True)

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
    bad = [
        (i, state, code)
        for i, state, code in outcomes
        if state != "running" and (state != "done" or code != 0)
    ]
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
        return JobProbe(JobStatus.FAILED, exit_code=bad[0][2], detail=detail)
    return JobProbe(JobStatus.SUCCEEDED, exit_code=0, detail=f"{len(outcomes)} shard(s) succeeded")
