"""Compute on DGX Cloud Lepton: one Lepton batch job per shard, next to the swarm's endpoint.

A fanned-out submit creates ``nshards`` Lepton jobs (``<name>-<rand>-<i>``); the JobHandle
lists their ids so any process can probe, wait on or cancel them later. States are read with
the SDK's *job* state enum (:data:`JOB_STATUSES`). Each job's env carries ENDPOINT, MODEL and
PREFECT_SWARM_ENDPOINTS; secrets travel as Lepton secret references, never as values in a spec.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.lepton.client import (
    LABEL_JOB,
    LABEL_SWARM,
    LeptonClient,
    affinity,
    env_vars,
    mounts,
    secret_name,
    under_mount,
)
from prefect_swarm.exceptions import ConfigError, PrefectSwarmError
from prefect_swarm.interfaces import DefaultComputeMixin, JobHandle, JobProbe, JobStatus

if TYPE_CHECKING:
    from prefect_swarm.config import LeptonConfig, SwarmConfig
    from prefect_swarm.interfaces import ServingHandle
    from prefect_swarm.paths import SwarmPaths

log = logging.getLogger(__name__)

JOB_STATUSES: dict[str, JobStatus | None] = {
    "Starting": JobStatus.PENDING,
    "Queueing": JobStatus.PENDING,
    "Awaiting": JobStatus.PENDING,
    "PendingRetry": JobStatus.PENDING,  # a worker failed; Lepton will retry it
    "Running": JobStatus.RUNNING,
    "Restarting": JobStatus.RUNNING,
    "Stopping": JobStatus.RUNNING,  # not finished until its processes are gone
    "Terminating": JobStatus.RUNNING,
    "Deleting": JobStatus.RUNNING,
    "Completed": JobStatus.SUCCEEDED,
    "Failed": JobStatus.FAILED,
    "Stopped": JobStatus.CANCELLED,
    "Deleted": JobStatus.CANCELLED,
    "Archived": None,  # finished and archived: the worker counts tell how (see job_status)
    "UNK": None,  # could not tell
}
"""Every ``LeptonJobState`` value -> our status; None means "look closer" (tests cover the enum)."""

API_KEY_ENV = "PREFECT_SWARM_API_KEY"
MAX_NAME = 36


def job_status(state: str | None, succeeded: int = 0, failed: int = 0) -> JobStatus | None:
    """Our status for a Lepton job state; None when it cannot be told."""
    if state == "Archived":
        if failed:
            return JobStatus.FAILED
        return JobStatus.SUCCEEDED if succeeded else None
    return JOB_STATUSES.get(state or "UNK")


def job_names(name: str, count: int, suffix: str | None = None) -> tuple[str, list[str]]:
    """A group id and ``count`` Lepton job names (``^[a-z][a-z0-9-]*$``, at most 36 chars)."""
    suffix = suffix or secrets.token_hex(3)
    base = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "job"
    if not base[0].isalpha():
        base = "j" + base
    tail = f"-{suffix}-{count - 1}"
    base = base[: MAX_NAME - len(tail)].rstrip("-")
    group = f"{base}-{suffix}"
    return group, [f"{group}-{i}" for i in range(count)]


def aggregate(statuses: Sequence[JobStatus]) -> JobStatus:
    """One status for a fanned-out job: unfinished while any shard is (so wait() leaves nothing running),
    then failed beats cancelled beats succeeded."""
    for status in (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.FAILED, JobStatus.CANCELLED):
        if status in statuses:
            return status
    return JobStatus.SUCCEEDED


class LeptonCompute(DefaultComputeMixin):
    """Lepton batch jobs for the shards of a swarm's jobs."""

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths, serving: ServingHandle | None = None) -> None:
        self.cfg = cfg
        self.paths = paths
        self.serving = serving
        self.backend: LeptonConfig = cfg.backend  # type: ignore[assignment]
        self.client = LeptonClient(self.backend)

    # ---------------------------------------------------------------- defaults
    def default_python(self) -> str:
        """The interpreter inside the job image."""
        return "python"

    def default_image(self) -> str:
        """The job image: ``backend.job_image``, else the endpoint's image."""
        return self.backend.job_image or self.backend.image

    def default_resources(self) -> dict[str, Any]:
        """One worker of ``backend.job_resource_shape``."""
        return {"resource_shape": self.backend.job_resource_shape}

    def default_env(self) -> dict[str, str]:
        """The swarm's env plus where the endpoint is; no PREFECT_SWARM_HOME (the container has its own)."""
        env = dict(self.cfg.env)
        if self.serving is not None and self.serving.url:
            urls = self.serving.meta.get("replica_urls") or [self.serving.url]
            env.setdefault("ENDPOINT", self.serving.url)
            env.setdefault("PREFECT_SWARM_ENDPOINTS", ",".join(urls))
        env.setdefault("MODEL", self.cfg.model_name)
        if self.backend.shared_path:
            env.setdefault("PREFECT_SWARM_HOME", self.backend.shared_path)
        return env

    # ---------------------------------------------------------------- protocol
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
        """Create one Lepton job per shard (or just ``shard_id``); returns at once unless detach=False."""
        if not command:
            raise ConfigError("submit: command is empty; pass the argv of the job process.")
        self._check_shared(command)
        shards = list(range(nshards)) if shard_id is None and nshards > 1 else [shard_id or 0]
        group, names = job_names(name, len(shards))
        base_env = {**self.default_env(), **(env or {})}
        refs = self._secret_refs(secret_env or {})
        shape = dict(resources or {}).get("resource_shape") or self.backend.job_resource_shape
        for shard, job_id in zip(shards, names, strict=True):
            argv = (
                self.shard_argv(command, nshards, shard)
                if nshards > 1 or shard_id is not None
                else list(command)
            )
            shard_env = {
                **base_env,
                "PREFECT_SWARM_SHARD_ID": str(shard),
                "PREFECT_SWARM_NSHARDS": str(nshards),
            }
            spec = self._spec(job_id, name, _with_workdir(argv, workdir), shard_env, refs, shape)
            log.info(
                "creating Lepton job '%s' (shard %d/%d): %s", job_id, shard, nshards, self.printable(argv)
            )
            self.client.call(f"create job '{job_id}'", lambda api, s: api.job.create(s), spec)
        handle = JobHandle(
            id=group if len(names) > 1 else names[0],
            backend="lepton",
            name=name,
            meta={
                "jobs": names,
                "shards": shards,
                "nshards": nshards,
                "workspace_id": self.backend.workspace_id,
            },
        )
        if not detach:
            self.wait(handle)
        return handle

    def probe(self, handle: JobHandle) -> JobProbe:
        """Each Lepton job's state, combined; ``error`` set when the API could not tell."""
        statuses: list[JobStatus] = []
        details: list[str] = []
        for jid in _ids(handle):
            try:
                job = self.client.call(
                    f"read job '{jid}'", lambda api, j: api.job.get(j), jid, missing_ok=True
                )
            except PrefectSwarmError as exc:
                return JobProbe(status=None, error=str(exc).splitlines()[0])
            if job is None:
                statuses.append(JobStatus.CANCELLED)
                details.append(f"{jid}: deleted")
                continue
            st = job.status
            state = str(getattr(st.state, "value", st.state)) if st and st.state else "UNK"
            status = job_status(state, (st.succeeded or 0) if st else 0, (st.failed or 0) if st else 0)
            if status is None:
                return JobProbe(status=None, error=f"Lepton job '{jid}' is in state {state!r}", detail=state)
            statuses.append(status)
            details.append(f"{jid}: {state}")
        status = aggregate(statuses)
        # Lepton reports no exit codes; a Completed job's containers all exited 0.
        return JobProbe(
            status=status, exit_code=0 if status is JobStatus.SUCCEEDED else None, detail="; ".join(details)
        )

    def wait(self, handle: JobHandle, stream_logs: bool = False, poll_s: float = 1.0) -> JobStatus:
        """Block until every Lepton job of ``handle`` has finished; log their output with stream_logs."""
        while True:
            probe = self.probe(handle)
            if probe.status is not None and probe.status.finished:
                if stream_logs:
                    for line in self.logs(handle).splitlines():
                        log.info("%s", line)
                return probe.status
            time.sleep(poll_s)

    def cancel(self, handle: JobHandle) -> None:
        """Stop every Lepton job of ``handle`` (kept for its state and logs). Idempotent."""
        for jid in _ids(handle):
            self.client.call(
                f"stop job '{jid}'",
                lambda api, j: api.job.update(j, spec={"spec": {"stopped": True}}),
                jid,
                missing_ok=True,
            )

    def logs(self, handle: JobHandle, timeout_s: int = 10) -> str:
        """The jobs' output so far, each line prefixed with its Lepton job id."""
        out: list[str] = []
        for jid in _ids(handle):
            replicas = (
                self.client.call(
                    f"list replicas of '{jid}'", lambda api, j: api.job.get_replicas(j), jid, missing_ok=True
                )
                or []
            )
            for rep in replicas:
                text = (
                    self.client.call(
                        f"read log of '{jid}'",
                        lambda api, j, r: "".join(api.job.get_log(j, r, timeout=timeout_s)),
                        jid,
                        rep,
                        missing_ok=True,
                    )
                    or ""
                )
                out += [f"[{jid}] {line}" for line in text.splitlines()]
        return "\n".join(out)

    # ---------------------------------------------------------------- internals
    def _check_shared(self, command: Sequence[str]) -> None:
        """The job spec must lie on the shared mount, or the container could not read it."""
        args = list(command)
        for flag, value in itertools.pairwise(args):
            if flag == "--spec" and not under_mount(self.backend, value):
                mounts_ = ", ".join(m.mount_path for m in self.backend.mounts) or "none"
                raise ConfigError(
                    f"the job spec {value} is not on the storage Lepton jobs mount (mount_path: {mounts_}); "
                    f"the job could not read it. Put the job folder under backend.shared_path "
                    f"({self.backend.shared_path}), e.g. by setting PREFECT_SWARM_HOME there."
                )

    def _secret_refs(self, secret_env: Mapping[str, str]) -> dict[str, str]:
        """Env name -> Lepton secret name; values are stored as workspace secrets, never in the spec."""
        values = dict(secret_env)
        token_secret = self.backend.endpoint_token_secret
        if API_KEY_ENV not in values and self.cfg.api_key is not None and not token_secret:
            values[API_KEY_ENV] = self.cfg.api_key.get_secret_value()
        refs: dict[str, str] = {}
        if token_secret and (API_KEY_ENV not in values or self._is_endpoint_token(values[API_KEY_ENV])):
            values.pop(API_KEY_ENV, None)
            refs[API_KEY_ENV] = token_secret
        for key, value in values.items():
            refs[key] = secret_name(self.cfg.name, key)
            self.client.upsert_secret(refs[key], value)
        return refs

    def _is_endpoint_token(self, value: str) -> bool:
        return self.cfg.api_key is None or self.cfg.api_key.get_secret_value() == value

    def _spec(
        self, job_id: str, name: str, argv: list[str], env: dict[str, str], refs: dict[str, str], shape: str
    ) -> Any:
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import LeptonContainer
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        b = self.backend
        label = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:63].strip("-._") or "job"
        return LeptonJob(
            metadata=Metadata(id=job_id, name=job_id, labels={LABEL_SWARM: self.cfg.name, LABEL_JOB: label}),
            spec=LeptonJobUserSpec(
                resource_shape=shape,
                affinity=affinity(b),
                container=LeptonContainer(image=self.default_image(), command=argv),
                completions=1,
                parallelism=1,
                envs=env_vars(env, refs),
                mounts=mounts(b),
                image_pull_secrets=list(b.image_pull_secrets),
            ),
        )


def _ids(handle: JobHandle) -> list[str]:
    return list(handle.meta.get("jobs") or [handle.id])


def _with_workdir(argv: list[str], workdir: str | None) -> list[str]:
    """Lepton containers have no working-directory field: change into it through sh."""
    if not workdir:
        return argv
    return ["sh", "-c", f'cd {shlex.quote(workdir)} && exec "$@"', "sh", *argv]
