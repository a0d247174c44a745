"""The two seams every backend implements: serving (replicas + endpoint) and compute (jobs).

``runtime_checkable`` only checks method names; the behaviour is pinned down by the contract
test suite in ``tests/contract`` that every backend runs.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prefect_swarm.interfaces import jobenv
from prefect_swarm.interfaces.capabilities import Capabilities
from prefect_swarm.interfaces.jobenv import JobRuntime
from prefect_swarm.interfaces.types import JobHandle, JobProbe, JobStatus, ServingHandle, ServingStatus

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig


@runtime_checkable
class ServingBackend(Protocol):
    """Brings replicas of an engine up behind one endpoint, reports on them, and removes them."""

    def capabilities(self) -> Capabilities:
        """What this backend can do; consulted before anything starts."""
        ...

    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Start the swarm described by ``cfg``, or reconcile an existing one of that name.

        Never starts a duplicate: calling it twice for a live swarm returns the same handle. Returns
        as soon as everything is submitted; readiness is :meth:`wait_ready`'s job.
        """
        ...

    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """Block until every replica answers a real chat completion.

        Raises ReadinessError early when readiness cannot come (every replica failed), with the
        evidence (log tail, scheduler reason), and CapacityError when the swarm stays queued past
        the backend's queue timeout. Whatever it raises, the caller still owns the teardown.
        """
        ...

    def status(self, handle: ServingHandle) -> ServingStatus:
        """Look at the swarm now, without blocking on it; an unreachable swarm is UNKNOWN, not FAILED."""
        ...

    def delete(self, handle: ServingHandle) -> None:
        """Stop everything this swarm started. Idempotent: deleting what is gone is not an error;
        safe on a half-launched swarm."""
        ...


@runtime_checkable
class ComputeBackend(Protocol):
    """Runs job processes next to the swarm: submit, probe, wait, cancel."""

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
        """Start ``command``; with ``nshards`` > 1 and no ``shard_id``, fan out into ``nshards`` processes.

        Each process gets ``--shard-id i --nshards n`` appended and ``PREFECT_SWARM_SHARD_ID`` /
        ``PREFECT_SWARM_NSHARDS`` in its environment. ``secret_env`` reaches the process environment but
        never a rendered command, a log or a state row. With ``detach=False`` it returns after the job ends.
        """
        ...

    def probe(self, handle: JobHandle) -> JobProbe:
        """Look at the job now. Never blocks; ``error`` set means "could not tell", not "failed"."""
        ...

    def wait(self, handle: JobHandle, stream_logs: bool = False, poll_s: float = 1.0) -> JobStatus:
        """Block until the job has finished; return its final status."""
        ...

    def cancel(self, handle: JobHandle) -> None:
        """Stop the job. Idempotent: cancelling a finished job is not an error."""
        ...

    def job_runtime(self) -> JobRuntime:
        """How job processes start where this backend runs them: interpreter, base env, workdir, image."""
        ...


class DefaultComputeMixin:
    """Defaults a compute backend may use for how it starts the job process."""

    cfg: SwarmConfig

    def default_python(self) -> str:
        """Interpreter that runs ``python -m prefect_swarm.jobs.run``."""
        return sys.executable

    def default_image(self) -> str | None:
        """Container image for job processes; None runs on the host."""
        return None

    def default_resources(self) -> dict[str, Any]:
        """Resources a job process asks for."""
        return {"cpus": 1, "gpus": 0}

    def default_env(self) -> dict[str, str]:
        """Environment every job process gets: the swarm's env and the paths it needs."""
        env = dict(self.cfg.env)
        env.setdefault(jobenv.HOME, os.environ.get(jobenv.HOME, ""))
        return {k: v for k, v in env.items() if v != ""}

    def job_runtime(self) -> JobRuntime:
        """The runtime assembled from the ``default_*`` hooks above."""
        return JobRuntime(python=self.default_python(), env=self.default_env(), image=self.default_image())

    @staticmethod
    def shard_argv(command: Sequence[str], nshards: int, shard_id: int) -> list[str]:
        """``command`` with the shard arguments appended."""
        return [*command, "--shard-id", str(shard_id), "--nshards", str(nshards)]

    @staticmethod
    def printable(command: Sequence[str]) -> str:
        """A shell-quoted rendering of ``command`` for logs (holds no secrets: those go by env)."""
        return shlex.join(command)


def wait_by_polling(backend: ComputeBackend, handle: JobHandle, poll_s: float = 1.0) -> JobStatus:
    """Generic ``wait``: probe until finished. Probe errors ("could not tell") keep waiting."""
    import time

    while True:
        probe = backend.probe(handle)
        if probe.status is not None and probe.status.finished:
            return probe.status
        time.sleep(poll_s)


__all__ = [
    "ComputeBackend",
    "DefaultComputeMixin",
    "JobHandle",
    "JobProbe",
    "JobStatus",
    "ServingBackend",
    "ServingHandle",
    "ServingStatus",
    "wait_by_polling",
]
