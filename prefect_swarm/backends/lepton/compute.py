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
from prefect_swarm.interfaces import ComputeBase, Follow, JobHandle, JobProbe, JobRequest, JobRuntime, JobStatus
from prefect_swarm.interfaces.jobenv import API_KEY, HOME

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

MAX_NAME = 36
IMAGE_PYTHON = "python3"
"""The interpreter job commands name: images built for Python (vllm/vllm-openai among them) ship
``python3``; a bare ``python`` is not guaranteed, and this machine's interpreter path means nothing there."""


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


class LeptonCompute(ComputeBase):
    """Lepton batch jobs for the shards of a swarm's jobs."""

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths, serving: ServingHandle | None = None) -> None:
        self.cfg = cfg
        self.paths = paths
        self.serving = serving
        self.backend: LeptonConfig = cfg.backend  # type: ignore[assignment]
        self.client = LeptonClient(self.backend)

    def job_runtime(self) -> JobRuntime:
        """``python3`` in ``backend.job_image`` (else the endpoint's image); the swarm's env and, as
        ``PREFECT_SWARM_HOME``, ``backend.shared_path`` (the container has no home of ours)."""
        env = dict(self.cfg.env)
        if self.backend.shared_path:
            env.setdefault(HOME, self.backend.shared_path)
        return JobRuntime(python=IMAGE_PYTHON, env=env, image=self.backend.job_image or self.backend.image)

    # ---------------------------------------------------------------- protocol
    def _launch(self, request: JobRequest) -> JobHandle:
        """Create one Lepton job per shard (or just ``shard_id``); returns at once."""
        self._check_shared(request.command)
        shards = request.shards()
        group, names = job_names(request.name, len(shards))
        refs, stored = self._secrets(request)
        for secret, value in stored.items():
            self.client.upsert_secret(secret, value)
        for shard, job_id in zip(shards, names, strict=True):
            spec = self.job_spec(request, job_id, shard, refs)
            log.info(
                "creating Lepton job '%s' (shard %d/%d): %s",
                job_id,
                shard,
                request.nshards,
                spec.spec.container.command,
            )
            self.client.call(f"create job '{job_id}'", lambda api, s: api.job.create(s), spec)
        meta = {"jobs": names, "shards": shards, "nshards": request.nshards, "workspace_id": self.backend.workspace_id}
        return JobHandle(id=group if len(names) > 1 else names[0], backend="lepton", name=request.name, meta=meta)

    def probe(self, handle: JobHandle) -> JobProbe:
        """Each Lepton job's state, combined; ``error`` set when the API could not tell."""
        statuses: list[JobStatus] = []
        details: list[str] = []
        for jid in _ids(handle):
            try:
                job = self.client.call(f"read job '{jid}'", lambda api, j: api.job.get(j), jid, missing_ok=True)
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
        status = JobStatus.combine(statuses)
        # Lepton reports no exit codes; a Completed job's containers all exited 0.
        return JobProbe(
            status=status, exit_code=0 if status is JobStatus.SUCCEEDED else None, detail="; ".join(details)
        )

    def _follow(self, handle: JobHandle) -> Follow:
        """The API serves a job's whole log: print it once the job has finished."""

        def follow(finished: bool) -> None:
            if finished:
                for line in self.logs(handle).splitlines():
                    log.info("%s", line)

        return follow

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
                    f"({self.backend.shared_path}), e.g. by setting {HOME} there."
                )

    def _secrets(self, request: JobRequest) -> tuple[dict[str, str], dict[str, str]]:
        """(env name -> Lepton secret name, secret name -> value to store): values go to workspace
        secrets, never into a spec. The swarm's API key is the endpoint token: with
        ``backend.endpoint_token_secret`` the job reads it from that secret, never from a copy."""
        values = self.job_secret_env(request)
        token_secret = self.backend.endpoint_token_secret
        refs: dict[str, str] = {}
        if token_secret and (API_KEY not in values or self._is_endpoint_token(values[API_KEY])):
            values.pop(API_KEY, None)
            refs[API_KEY] = token_secret
        refs.update({key: secret_name(self.cfg.name, key) for key in values})
        return refs, {refs[key]: value for key, value in values.items()}

    def secret_names(self, request: JobRequest) -> dict[str, str]:
        """Env name -> the Lepton secret a job of ``request`` reads it from (stores nothing)."""
        return self._secrets(request)[0]

    def _is_endpoint_token(self, value: str) -> bool:
        return self.cfg.api_key is None or self.cfg.api_key.get_secret_value() == value

    def job_spec(self, request: JobRequest, job_id: str, shard: int, refs: Mapping[str, str]) -> Any:
        """The SDK spec of shard ``shard``'s Lepton job: secrets only as references (``refs``)."""
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import LeptonContainer
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        b, runtime = self.backend, self.job_runtime()
        label = re.sub(r"[^A-Za-z0-9._-]", "-", request.name)[:63].strip("-._") or "job"
        return LeptonJob(
            metadata=Metadata(id=job_id, name=job_id, labels={LABEL_SWARM: self.cfg.name, LABEL_JOB: label}),
            spec=LeptonJobUserSpec(
                resource_shape=request.resources.get("resource_shape") or b.job_resource_shape,
                affinity=affinity(b),
                container=LeptonContainer(
                    image=runtime.image, command=_with_workdir(request.argv(shard), request.workdir or runtime.workdir)
                ),
                completions=1,
                parallelism=1,
                envs=env_vars(self.job_env(request, shard), refs),
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
