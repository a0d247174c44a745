"""Compute on DGX Cloud Lepton: one Lepton batch job per shard, next to the swarm's endpoint.

A fanned-out submit creates ``nshards`` Lepton jobs (``<name>-<rand>-<i>``); the JobHandle
lists their ids so any process can probe, wait on or cancel them later. States are read with
the SDK's *job* state enum (:data:`JOB_STATUSES`). Each job's env carries ENDPOINT, MODEL and
PREFECT_SWARM_ENDPOINTS; secrets travel as Lepton secret references, never as values in a spec.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm import __version__
from prefect_swarm.backends.lepton.client import (
    LABEL_CREATE,
    LABEL_JOB,
    LABEL_OWNER,
    LABEL_SWARM,
    OWNED_JOB_FIELDS,
    LeptonClient,
    affinity,
    env_vars,
    job_secret_name,
    mounts,
    queue_config,
    read_log,
    reservation_config,
    resolved,
    swarm_owner,
    swarm_secret_name,
    under_mount,
    with_passthrough,
)
from prefect_swarm.backends.lepton.wheel import INSTALL_FAILED, install_line, stage, staged_path
from prefect_swarm.exceptions import BackendError, ConfigError, PrefectSwarmError
from prefect_swarm.interfaces import ComputeBase, Follow, JobHandle, JobProbe, JobRequest, JobRuntime, JobStatus
from prefect_swarm.interfaces.jobenv import API_KEY, HOME
from prefect_swarm.jobs.checkpoint.plan import shard_marked_done
from prefect_swarm.jobs.rows.storage import is_remote
from prefect_swarm.jobs.spec import JobSpec

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
STORAGE_CHECK_DIR = ".storage-check"
"""Folder under ``backend.shared_path`` holding the nonce of the shared-storage check."""
NO_PREFECT_SWARM = "prefect-swarm check: prefect_swarm is not importable"
"""What the storage check job prints when the job interpreter lacks prefect-swarm."""


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

    @functools.cached_property
    def owner(self) -> str:
        """This home's identity of the swarm (:func:`swarm_owner`), marked on every job and secret."""
        return swarm_owner(self.paths)

    def labels(self, job: str, create: str) -> dict[str, str]:
        """The labels of a job this swarm makes: its name, its owner, the job, the create's name."""
        return {LABEL_SWARM: self.cfg.name, LABEL_OWNER: self.owner, LABEL_JOB: job, LABEL_CREATE: create}

    def job_runtime(self) -> JobRuntime:
        """``python3`` in ``backend.job_image`` (else the endpoint's image); the swarm's env and, as
        ``PREFECT_SWARM_HOME``, ``backend.shared_path`` (the container has no home of ours)."""
        env = dict(self.cfg.env)
        if self.backend.shared_path:
            env.setdefault(HOME, self.backend.shared_path)
        return JobRuntime(python=self.backend.job_python, env=env, image=self.backend.job_image or self.backend.image)

    # ---------------------------------------------------------------- protocol
    def _launch(self, request: JobRequest) -> JobHandle:
        """Create one Lepton job per shard (or just ``shard_id``); returns at once."""
        self._check_shared(request.command)
        self.backend = resolved(self.client)  # node groups given by name: the job specs take ids
        self.stage_wheel()
        shards = request.shards()
        group, names = job_names(request.name, len(shards))
        refs, stored = self._secrets(request)
        for secret, value in stored.items():
            # the swarm's secret is put by `up` and shared by concurrent submits: only created when
            # missing; a submission's own secret has this one writer and is replaced
            self.client.ensure_secret(secret, value, replace=secret not in self._swarm_secrets(refs))
        ids = []
        for shard, job_name in zip(shards, names, strict=True):
            spec = self.job_spec(request, job_name, shard, refs)
            log.info(
                "creating Lepton job '%s' (shard %d/%d): %s",
                job_name,
                shard,
                request.nshards,
                spec.spec.container.command,
            )
            ids.append(self._create_job(job_name, spec))
        meta: dict[str, Any] = {
            "jobs": ids,
            "shards": shards,
            "nshards": request.nshards,
            "workspace_id": self.backend.workspace_id,
        }
        spec_path = _spec_path(request.command)
        if spec_path:
            meta["spec"] = spec_path  # the ledger tells how an archived job ended
        return JobHandle(id=group if len(ids) > 1 else ids[0], backend="lepton", name=request.name, meta=meta)

    def probe(self, handle: JobHandle) -> JobProbe:
        """Each Lepton job's state, combined; ``error`` set when the API could not tell."""
        statuses: list[JobStatus] = []
        details: list[str] = []
        ids = _ids(handle)
        shards = list(handle.meta.get("shards") or range(len(ids)))
        for jid, shard in zip(ids, shards, strict=False):
            try:
                job = self.client.call(f"read job '{jid}'", lambda api, j: api.job.get(j), jid, missing_ok=True)
            except PrefectSwarmError as exc:
                return JobProbe(status=None, error=str(exc).splitlines()[0])
            if job is None:  # deleted, or archived past its TTL: a finished ledger tells which
                done = self._ledger_done(handle, shard)
                statuses.append(JobStatus.SUCCEEDED if done else JobStatus.CANCELLED)
                details.append(f"{jid}: gone" + ("; its ledger is complete" if done else ""))
                continue
            st = job.status
            state = str(getattr(st.state, "value", st.state)) if st and st.state else "UNK"
            status = job_status(state, (st.succeeded or 0) if st else 0, (st.failed or 0) if st else 0)
            if status is None and state == "Archived" and handle.meta.get("spec"):
                status = JobStatus.SUCCEEDED if self._ledger_done(handle, shard) else JobStatus.FAILED
                state += "; its ledger is " + ("complete" if status is JobStatus.SUCCEEDED else "unfinished")
            if status is None:
                return JobProbe(status=None, error=f"Lepton job '{jid}' is in state {state!r}", detail=state)
            if state == "Queueing" and self._queued_too_long(job):
                self.cancel(JobHandle(id=jid, backend="lepton", name=handle.name, meta={"jobs": [jid]}))
                status = JobStatus.FAILED
                state += (
                    f" for more than job_queue_timeout_s ({self.backend.job_queue_timeout_s:.0f}s): stopped; "
                    f"no capacity for job_resource_shape {self.backend.job_resource_shape}"
                )
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
        """The jobs' output so far, each line prefixed with its Lepton job id: from each replica's log
        while the job has replicas, else (archived, or gone past its TTL) from the historical logs."""
        out: list[str] = []
        for jid in _ids(handle):
            replicas = (
                self.client.call(
                    f"list replicas of '{jid}'", lambda api, j: api.job.get_replicas(j), jid, missing_ok=True
                )
                or []
            )
            texts = [
                self.client.call(
                    f"read log of '{jid}'",
                    lambda api, j, r: read_log(api.job.get_log(j, r, timeout=timeout_s)),
                    jid,
                    rep,
                    missing_ok=True,
                )
                or ""
                for rep in replicas
            ]
            if not replicas:
                texts = [self._historical_log(jid, timeout_s)]
            out += [f"[{jid}] {line}" for text in texts for line in text.splitlines()]
        return "\n".join(out)

    def _historical_log(self, jid: str, timeout_s: int) -> str:
        """An archived job's log from ``GET /logs`` (leptonai's ``LogAPI.get_log`` with both ``start``
        and ``end``: the historical query), its first HISTORY_LINES lines of the last HISTORY_DAYS days.
        A 404 reads :data:`NO_LOGS_YET`; a 429 (the log store's rate limit, its ``Retry-After`` kept
        by the SDK's ``LogAPIError``) is retried like any transient answer."""
        end = time.time_ns()
        start = end - HISTORY_DAYS * 86_400 * 10**9
        answer = self.client.call(
            f"read the historical log of '{jid}'",
            lambda api, j: api.log.get_log(
                name_or_job=j,
                start=str(start),
                end=str(end),
                limit=HISTORY_LINES,
                direction="forward",
                job_query_mode="alive_and_archive",
                timeout=timeout_s,
            ),
            jid,
            missing_ok=True,
        )
        result = ((answer or {}).get("data") or {}).get("result") or []
        if answer is None:  # 404: the log store has nothing of this job (yet: it is indexed late)
            return NO_LOGS_YET
        values = sorted((int(v[0]), str(v[1])) for stream in result for v in stream.get("values") or [])
        return "\n".join(line for _, line in values)

    def check_shared_storage(self, timeout_s: float) -> None:
        """Prove the storage is shared and the job image usable before any GPU is asked for: this
        process writes a nonce under ``backend.shared_path``; a tiny CPU job (``job_resource_shape``,
        the job image, ``job_setup``) must read it back through the mounts and import prefect_swarm
        with ``job_python``. ConfigError naming the mount or the image when it cannot."""
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import LeptonContainer
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        b = self.backend
        self.stage_wheel()
        nonce = secrets.token_hex(16)
        folder = Path(str(b.shared_path)) / STORAGE_CHECK_DIR
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f"{nonce}.txt"
        probe.write_text(nonce)
        _group, (job_name,) = job_names(f"{self.cfg.name}-storage", 1)
        labels = self.labels("storage-check", job_name)
        spec = LeptonJob(
            metadata=Metadata(id=job_name, name=job_name, labels=labels),
            spec=LeptonJobUserSpec(
                resource_shape=b.job_resource_shape,
                affinity=affinity(b),
                container=LeptonContainer(
                    image=self.job_runtime().image,
                    command=_wrap(
                        ["sh", "-c", _CHECK_SCRIPT, "sh", str(probe), nonce, b.job_python], None, self.setup()
                    ),
                ),
                completions=1,
                parallelism=1,
                mounts=mounts(b),
                image_pull_secrets=list(b.image_pull_secrets),
                reservation_config=reservation_config(b),
            ),
        )
        log.info("checking that Lepton jobs see %s (job '%s')", b.shared_path, job_name)
        job_id: str | None = None
        try:
            # every poll, the log read and the delete go by the id the platform returned
            job_id = self._create_job(job_name, spec)
            handle = JobHandle(id=job_id, backend="lepton", name="storage-check", meta={"jobs": [job_id]})
            # the check's own time counts from its container's start: before, its image is pulled (a
            # multi-GB image on a cold node takes minutes), given as long as the endpoint's (ready_timeout_s)
            t0 = time.monotonic()
            deadline = t0 + max(timeout_s, self.cfg.ready_timeout_s)
            started = False
            while True:
                st = self.probe(handle)
                if st.status is not None and st.status.finished:
                    break
                if st.status is JobStatus.RUNNING and not started:
                    started, deadline = True, time.monotonic() + timeout_s
                if time.monotonic() >= deadline:
                    raise self._check_timeout(job_id, started, time.monotonic() - t0, timeout_s, st.detail)
                time.sleep(b.ready_poll_s)
            if st.status is not JobStatus.SUCCEEDED:
                where = "; ".join(f"{m.from_}:{m.path} at {m.mount_path}" for m in b.mounts)
                tail = self.logs(handle)[-2000:]
                image = self.job_runtime().image
                if INSTALL_FAILED in tail:
                    raise ConfigError(
                        f"backend.job_wheel: '{b.job_python}' in image {image} could not install prefect-swarm "
                        f"{__version__} from the wheel staged under backend.shared_path (its pip, or the package "
                        "index for its dependencies, failed: see the job log). Use a job_image with prefect-swarm "
                        "installed as the README installs it (from a clone: pip install '.[lepton]'), and set "
                        "backend.job_wheel: false.\nJob log:\n" + tail
                    )
                if NO_PREFECT_SWARM in tail:
                    raise ConfigError(
                        f"backend.job_image: '{b.job_python}' in image {image} cannot import prefect_swarm, so no "
                        f"batch job could run there. Set backend.job_wheel: true (up stages this prefect-swarm's "
                        f"wheel and each job installs it), use a job_image with prefect-swarm {__version__} "
                        "installed as the README installs it (from a clone: pip install '.[lepton]'), or point "
                        "backend.job_python at the interpreter that has it." + f"\nJob log:\n{tail}"
                    )
                raise ConfigError(
                    f"backend.mounts: a Lepton job could not read {probe}, which this process wrote under "
                    f"backend.shared_path ({st.detail}). This process must see the same volume at exactly "
                    f"each mount_path ({where}), or jobs cannot read specs nor this process their ledgers."
                    + (f"\nJob log:\n{tail}" if tail else "")
                )
        finally:
            if job_id is not None:
                self.client.call(f"delete job '{job_id}'", lambda api, j: api.job.delete(j), job_id, missing_ok=True)
            probe.unlink(missing_ok=True)

    def _check_timeout(self, job_id: str, started: bool, waited: float, timeout_s: float, detail: str) -> BackendError:
        """The storage check ran out of time: waiting for capacity, pulling its image, or running."""
        b = self.backend
        where = f"workspace '{b.workspace_id}', job_resource_shape {b.job_resource_shape}"
        if started:
            return BackendError(
                f"the shared-storage check job '{job_id}' started but did not finish within "
                f"storage_check_timeout_s ({timeout_s:.0f}s; {where}): {detail}.",
                hint="its setup installs prefect-swarm when the image lacks it (backend.job_wheel), which a slow "
                "package index can hold up: raise backend.storage_check_timeout_s (null skips the check).",
            )
        if "Queueing" in detail:
            return BackendError(
                f"the shared-storage check job '{job_id}' waited {waited:.0f}s for capacity ({where}): {detail}.",
                hint="check that job_resource_shape can be scheduled on the node groups, or retry later.",
            )
        return BackendError(
            f"the shared-storage check job '{job_id}' was still starting after {waited:.0f}s ({where}): {detail}. "
            f"Its image {self.job_runtime().image} is most likely still being pulled: a multi-GB image on a cold "
            "node takes minutes.",
            hint="the check's own time (storage_check_timeout_s) counts only once its container runs; the pull is "
            "given ready_timeout_s: raise it, or use a smaller backend.job_image.",
        )

    def setup(self) -> list[str]:
        """The shell lines run before each job process: the staged wheel's install (backend.job_wheel),
        then ``backend.job_setup``."""
        b = self.backend
        if not (b.job_wheel and b.shared_path):
            return list(b.job_setup)
        return [install_line(b.job_python, staged_path(b.shared_path)), *b.job_setup]

    def stage_wheel(self) -> None:
        """Stage this prefect-swarm's wheel under ``backend.shared_path`` for the jobs' setup (once per
        version and content; a no-op with ``job_wheel`` off)."""
        if self.backend.job_wheel and self.backend.shared_path:
            stage(self.backend.shared_path)

    # ---------------------------------------------------------------- internals
    def _ledger_done(self, handle: JobHandle, shard: int) -> bool:
        """True when shard ``shard``'s ledger (the spec the job ran says where it is) is marked DONE."""
        spec = handle.meta.get("spec")
        return bool(spec) and shard_marked_done(JobSpec.load(str(spec)), shard)

    def _queued_too_long(self, job: Any) -> bool:
        limit = self.backend.job_queue_timeout_s
        created_ms = getattr(job.metadata, "created_at", None)
        return limit is not None and created_ms is not None and time.time() - created_ms / 1000 > limit

    def _create_job(self, name: str, spec: Any) -> str:
        """Create job ``name``; the id the platform assigned, which every later call must use.

        Lepton job names are not unique (a second create of a name makes a second job), so a create
        retried after a transient failure (a 504 whose request went through) first looks for the job
        an earlier try made, by the :data:`LABEL_CREATE` label this backend sets, and adopts it."""
        labels = dict(spec.metadata.labels or {})
        tries = 0

        def create(api: Any) -> Any:
            nonlocal tries
            tries += 1
            if tries > 1:
                mine = [
                    j for j in api.job.list_all(query=f"{LABEL_CREATE}={name}") if (j.metadata.labels or {}) == labels
                ]
                if mine:
                    log.info("adopting Lepton job '%s', created by an earlier try of the same request", name)
                    return max(mine, key=lambda j: j.metadata.created_at or 0)
            return api.job.create(spec)

        created = self.client.call(f"create job '{name}'", create)
        job_id = getattr(getattr(created, "metadata", None), "id_", None)
        if not job_id:
            raise BackendError(
                f"the Lepton API created job '{name}' but returned no job id (workspace "
                f"'{self.backend.workspace_id}'); it cannot be followed.",
                hint=f"delete it in the dashboard (label {LABEL_CREATE}={name}) and submit again.",
            )
        return str(job_id)

    def _check_shared(self, command: Sequence[str]) -> None:
        """The job spec, and the input, output and ledger folder it names, must lie on the shared
        mount, or the container could not read or write them."""
        value = _spec_path(command)
        if value is None:
            return
        mounts_ = ", ".join(m.mount_path for m in self.backend.mounts) or "none"
        if not under_mount(self.backend, value):
            raise ConfigError(
                f"the job spec {value} is not on the storage Lepton jobs mount (mount_path: {mounts_}); "
                f"the job could not read it. Put the job folder under backend.shared_path "
                f"({self.backend.shared_path}), e.g. by setting {HOME} there."
            )
        if not os.path.exists(value):
            return  # written later by the caller; the job reports a missing spec itself
        spec = JobSpec.load(value)
        for field, path in (("input", spec.input), ("output", spec.output), ("job_dir", spec.job_dir)):
            if path and field != "job_dir" and is_remote(path):
                self._check_store_credentials(field, path)
                continue
            if path and not under_mount(self.backend, os.path.abspath(os.path.expanduser(path))):
                raise ConfigError(
                    f"the job's {field} {path} is not on the storage Lepton jobs mount (mount_path: {mounts_}); "
                    f"a Lepton job sees only what is mounted. Put the {field} under a mount_path, "
                    f"e.g. under backend.shared_path ({self.backend.shared_path})."
                )

    def _check_store_credentials(self, field: str, path: str) -> None:
        """An ``s3://`` input or output needs the store's credentials in the job's own environment: a
        Lepton job has none of this process's (no ``~/.aws``, no instance role of ours)."""
        if not path.startswith("s3://"):
            return  # gs://: Google's default credentials, as the job's image and env give them
        given = {*self.backend.job_secret_env, *self.job_runtime().env}
        if not {"AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"} & given:
            raise ConfigError(
                f"the job's {field} {path} is on S3, but a Lepton job gets no credentials of this process. "
                "Keep them in workspace secrets and name them in backend.job_secret_env, e.g. "
                "{AWS_ACCESS_KEY_ID: aws-key-id, AWS_SECRET_ACCESS_KEY: aws-secret} (`lep secret create -n "
                "aws-key-id -v ...`); AWS_ENDPOINT_URL / AWS_REGION, not secret, go in env."
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
        for key in self.backend.job_secret_env:  # the user's own secrets, by reference: a value never passes here
            values.pop(key, None)
        refs.update(self.backend.job_secret_env)
        for key, value in values.items():
            shared = key == API_KEY and self.cfg.api_key is not None and self._is_endpoint_token(value)
            refs[key] = (
                swarm_secret_name(self.cfg.name, self.owner, key)
                if shared
                else job_secret_name(self.cfg.name, self.owner, request.name, key)
            )
        return refs, {refs[key]: value for key, value in values.items()}

    def _swarm_secrets(self, refs: Mapping[str, str]) -> set[str]:
        return {name for key, name in refs.items() if name == swarm_secret_name(self.cfg.name, self.owner, key)}

    def put_swarm_secrets(self) -> None:
        """Create or replace the swarm's shared secrets (its API key) once, before any job reads them."""
        if self.cfg.api_key is None or self.backend.endpoint_token_secret:
            return
        name = swarm_secret_name(self.cfg.name, self.owner, API_KEY)
        self.client.ensure_secret(name, self.cfg.api_key.get_secret_value(), replace=True)

    def secret_names(self, request: JobRequest) -> dict[str, str]:
        """Env name -> the Lepton secret a job of ``request`` reads it from (stores nothing)."""
        return self._secrets(request)[0]

    def _is_endpoint_token(self, value: str) -> bool:
        return self.cfg.api_key is None or self.cfg.api_key.get_secret_value() == value

    def job_spec(self, request: JobRequest, job_name: str, shard: int, refs: Mapping[str, str]) -> Any:
        """The SDK spec of shard ``shard``'s Lepton job: secrets only as references (``refs``)."""
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import LeptonContainer
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        b, runtime = self.backend, self.job_runtime()
        label = re.sub(r"[^A-Za-z0-9._-]", "-", request.name)[:63].strip("-._") or "job"
        user_spec = LeptonJobUserSpec(
            resource_shape=request.resources.get("resource_shape") or b.job_resource_shape,
            affinity=affinity(b),
            container=LeptonContainer(
                image=runtime.image,
                command=_wrap(request.argv(shard), request.workdir or runtime.workdir, self.setup()),
            ),
            completions=1,
            parallelism=1,
            envs=env_vars(self.job_env(request, shard), refs),
            mounts=mounts(b),
            image_pull_secrets=list(b.image_pull_secrets),
            queue_config=queue_config(b),
            reservation_config=reservation_config(b),
        )
        return LeptonJob(
            metadata=Metadata(id=job_name, name=job_name, labels=self.labels(label, job_name)),
            spec=with_passthrough(user_spec, b.job_spec, "job_spec", OWNED_JOB_FIELDS),
        )


_CHECK_SCRIPT = (
    'test "$(cat "$1")" = "$2" || { echo "prefect-swarm check: $1 is not the file the worker wrote"; exit 1; }; '
    '"$3" -c "import prefect_swarm" || { echo "' + NO_PREFECT_SWARM + ' with $3"; exit 1; }'
)
"""The storage check job: the nonce file must hold the nonce, and the job interpreter must import
prefect_swarm (args: nonce file, nonce, interpreter)."""


def _spec_path(command: Sequence[str]) -> str | None:
    """The ``--spec`` argument of a job command (None when it has none)."""
    for flag, value in itertools.pairwise(command):
        if flag == "--spec":
            return value
    return None


HISTORY_DAYS = 7
"""How far back an archived job's log is looked for."""

NO_LOGS_YET = "(no logs yet: the workspace's log store has none for this job)"
"""What a job's historical log reads when the log store answers 404."""

HISTORY_LINES = 5000
"""Most lines of an archived job's log read (the first ones; the SDK's default limit)."""


def _ids(handle: JobHandle) -> list[str]:
    return list(handle.meta.get("jobs") or [handle.id])


def _wrap(argv: list[str], workdir: str | None, setup: Sequence[str] = ()) -> list[str]:
    """``argv`` after ``backend.job_setup`` and in ``workdir`` (Lepton containers have no
    working-directory field), through sh; as it is when there is neither."""
    lines = [*setup, *([f"cd {shlex.quote(workdir)}"] if workdir else [])]
    if not lines:
        return argv
    return ["sh", "-c", " && ".join([*lines, 'exec "$@"']), "sh", *argv]
