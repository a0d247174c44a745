"""The two seams every backend implements: serving (replicas + endpoint) and compute (jobs).

``runtime_checkable`` only checks method names; the behaviour is pinned down by the contract
test suite in ``tests/contract`` that every backend runs. Callers use exactly these members:
nothing is looked up with ``getattr``.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prefect_swarm.interfaces.capabilities import Capabilities
from prefect_swarm.interfaces.jobenv import JobEnv, JobRuntime
from prefect_swarm.interfaces.metrics import MetricsTargets
from prefect_swarm.interfaces.types import (
    JobHandle,
    JobProbe,
    JobRequest,
    JobStatus,
    ServingHandle,
    ServingStatus,
    SleepReport,
)
from prefect_swarm.interfaces.usage import GpuUsage

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig

Follow = Callable[[bool], None]
"""Called after every look at a job with whether it has finished (streams its logs)."""


@runtime_checkable
class ServingBackend(Protocol):
    """Brings replicas of an engine up behind one endpoint, reports on them, and removes them."""

    def capabilities(self) -> Capabilities:
        """What this backend can do; consulted before anything starts."""
        ...

    def validate(self, cfg: SwarmConfig, *, ask: bool = True) -> list[str]:
        """Pre-flight: refuse a config this backend cannot run (ConfigError naming the field).

        Starts and writes nothing and needs no credentials: it runs in ``prefect-swarm validate``. With
        ``ask`` it may ask the scheduler a read-only question (Slurm: ``sbatch --test-only``); what
        could not be checked (the scheduler cannot be asked) comes back as warnings, never as an error.
        """
        ...

    def plan(self) -> dict[str, str]:
        """What ``up`` would start, rendered (file or object name -> text); submits and writes nothing.

        Secrets are masked: this is what ``prefect-swarm validate`` prints.
        """
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

    def client_key(self) -> str | None:
        """The key this swarm's clients send (``Authorization: Bearer``) on every route: ``api_key``, or the
        key the backend generated for the swarm (Slurm); None for an open endpoint. Never logged."""
        ...

    def key_sources(self) -> list[str]:
        """Where this backend looks for the key clients send beyond the swarm's own (``$PREFECT_SWARM_API_KEY``,
        the config's ``api_key``, ``swarm.key``), in the order tried, each saying whether it is there: what a
        message about a missing or refused key names. Never the key itself."""
        ...

    def metrics_targets(self, handle: ServingHandle) -> MetricsTargets:
        """Where each replica engine's ``/metrics`` is now (the file_sd list the backend keeps in the
        swarm folder); a backend that cannot tell answers no targets and a ``reason``. Never blocks."""
        ...

    def gpu_usage(self, handle: ServingHandle) -> GpuUsage:
        """GPU-hours the swarm has used so far, from the best source the backend has (Slurm accounting,
        the platform's durations, wall time x GPUs); ``gpu_hours`` None with a ``reason`` when it cannot
        tell. Also after ``delete`` where the source keeps the figures."""
        ...

    def exec_command(self, handle: ServingHandle, replica: int, argv: Sequence[str]) -> int:
        """Run ``argv`` once inside replica ``replica``'s allocation and environment (its GPUs, the API
        key, ``PORT`` = its engine's port, its working folder); no shell. stdin/stdout/stderr are the
        caller's; returns the command's exit code. The caller checks ``replica`` against the swarm's
        replica count. ConfigError when the backend lacks :attr:`Capability.EXEC` (with its reason) or
        the command cannot start; ReadinessError when the replica is not running. Secrets never reach
        the command line or a log."""
        ...

    def replica_log(self, handle: ServingHandle, replica: int, *, follow: bool = False) -> Iterator[str]:
        """Replica ``replica``'s engine log as text chunks: what it holds now, and with ``follow`` what
        it gains while the replica runs (the caller may stop early: Ctrl-C, or closing the iterator).
        The caller checks ``replica`` against the swarm's replica count. ConfigError when the backend
        keeps no log of its replicas (with the reason)."""
        ...

    # ---- park and restore (scale to zero and back; see interfaces.parking)
    def park(self, handle: ServingHandle) -> dict[str, Any]:
        """Give back every GPU the swarm holds (Slurm: its replica and LB jobs end; Lepton: the endpoint
        goes to zero replicas; local: the engines stop), leaving on disk what a fast restore reuses
        (the swarm's folder, staged weights, the engine's caches). Returns what :meth:`restore` needs
        beyond the config: JSON-safe, no secret (the addresses replicas take again). ConfigError when
        the backend lacks :attr:`Capability.PARK` (with its reason), before anything stops.
        Idempotent: parking a parked swarm stops nothing more."""
        ...

    def restore(self, cfg: SwarmConfig, parked: dict[str, Any]) -> ServingHandle:
        """Bring the parked swarm ``cfg`` back; ``parked`` is what :meth:`park` returned. Replicas take
        the addresses they had again where the platform lets them; returns once submitted, readiness is
        :meth:`wait_ready`'s. Never starts a duplicate (as :meth:`create_or_update`)."""
        ...

    # --- sleep and wake (replicas that free their GPUs and keep their allocation) ---
    def sleep(self, handle: ServingHandle, replicas: Sequence[int] = (), level: int = 1) -> list[SleepReport]:
        """Put ``replicas`` (all when empty) to sleep: each leaves the load balancer and the job endpoints
        first, then its engine frees its GPU memory (``level`` 1 keeps the weights in CPU memory, 2
        discards them); the allocation is kept. Returns once each says it sleeps. ConfigError when the
        backend lacks :attr:`Capability.SLEEP_WAKE` (with its reason) or the swarm runs without
        ``engine.sleep_mode``; one asleep already is reported as it is."""
        ...

    def wake(self, handle: ServingHandle, replicas: Sequence[int] = ()) -> list[SleepReport]:
        """Wake ``replicas`` (all when empty) and put each back in rotation once its engine says it is
        awake and answered one real chat completion. ConfigError as :meth:`sleep`; one awake is reported
        as it is."""
        ...


@runtime_checkable
class ComputeBackend(Protocol):
    """Runs job processes next to the swarm: submit, probe, wait, cancel."""

    def submit(self, request: JobRequest) -> JobHandle:
        """Start every shard of ``request`` (see :class:`JobRequest`) with :meth:`job_runtime`'s environment,
        the swarm's endpoints, the shard's place and the swarm's API key. With ``detach=False`` it
        returns after the job ends."""
        ...

    def probe(self, handle: JobHandle) -> JobProbe:
        """Look at the job now. Never blocks; ``error`` set means "could not tell", not "failed"."""
        ...

    def probe_many(self, handles: Sequence[JobHandle]) -> list[JobProbe]:
        """:meth:`probe` of every handle, in order, with as few scheduler calls as the backend can
        (Slurm: one ``squeue`` and at most one ``sacct`` for all of a job's steps, however many
        shards): what a job's one watcher calls. Never blocks, never raises."""
        ...

    def wait(self, handle: JobHandle, stream_logs: bool = False, poll_s: float = 1.0) -> JobStatus:
        """Block until the job has finished; return its final status."""
        ...

    def cancel(self, handle: JobHandle) -> None:
        """Stop the job. Idempotent: cancelling a finished job is not an error."""
        ...

    def job_runtime(self) -> JobRuntime:
        """How job processes start where this backend runs them: the interpreter that exists there,
        base env, workdir, image. Callers build job commands with it, never with ``sys.executable``."""
        ...

    def endpoints(self) -> list[str]:
        """Base URLs a job spreads its requests over: the replicas themselves wherever a job process
        can reach them (local: each replica's port; Slurm: the replicas' head files), else the
        swarm's one endpoint; empty when the swarm has none yet. The swarm's public endpoint (the
        LB) is unchanged: this is only where the job's own requests go."""
        ...


class ComputeBase(abc.ABC):
    """What every compute backend shares: submit's shape, the polling ``wait``, the job environment.

    A backend implements :meth:`_launch` (start every shard, return at once), ``probe``,
    ``cancel``, ``job_runtime`` and :meth:`_follow` (log streaming for ``wait``).
    """

    cfg: SwarmConfig
    serving: ServingHandle | None

    @abc.abstractmethod
    def job_runtime(self) -> JobRuntime:
        """See :meth:`ComputeBackend.job_runtime`."""

    @abc.abstractmethod
    def probe(self, handle: JobHandle) -> JobProbe:
        """See :meth:`ComputeBackend.probe`."""

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """See :meth:`ComputeBackend.cancel`."""

    @abc.abstractmethod
    def _launch(self, request: JobRequest) -> JobHandle:
        """Start every shard of ``request``; return at once."""

    @abc.abstractmethod
    def _follow(self, handle: JobHandle) -> Follow:
        """What ``wait(stream_logs=True)`` calls after each look: prints the job's new output."""

    def probe_many(self, handles: Sequence[JobHandle]) -> list[JobProbe]:
        """See :meth:`ComputeBackend.probe_many`: one :meth:`probe` per handle unless the backend batches."""
        out = []
        for handle in handles:
            try:
                out.append(self.probe(handle))
            except Exception as exc:  # "could not tell" is not "failed"
                out.append(JobProbe(None, error=f"probe failed: {exc}"))
        return out

    def submit(self, request: JobRequest) -> JobHandle:
        """See :meth:`ComputeBackend.submit`."""
        handle = self._launch(request)
        if not request.detach:
            self.wait(handle)
        return handle

    def wait(self, handle: JobHandle, stream_logs: bool = False, poll_s: float = 1.0) -> JobStatus:
        """Probe until the job has finished; with ``stream_logs`` print its output as it comes."""
        return wait_by_polling(self, handle, poll_s, follow=self._follow(handle) if stream_logs else None)

    def endpoints(self) -> list[str]:
        """URLs the job spreads its requests over: the serving handle's replicas, else its URL."""
        if self.serving is None or not self.serving.url:
            return []
        return list(self.serving.meta.get("replica_urls") or [self.serving.url])

    def job_env(self, request: JobRequest, shard: int) -> dict[str, str]:
        """Plain environment of one shard: runtime env < swarm (endpoints, model) < request < shard."""
        swarm = JobEnv(endpoints=tuple(self.endpoints()), model=self.cfg.model_name).to_env()
        return {**self.job_runtime().env, **swarm, **request.env, **request.shard_env(shard)}

    def job_secret_env(self, request: JobRequest) -> dict[str, str]:
        """Secret environment of every shard: the swarm's API key, then the request's secrets."""
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key is not None else None
        return {**JobEnv(api_key=key).secret_env(), **request.secret_env}


def wait_by_polling(
    backend: ComputeBackend, handle: JobHandle, poll_s: float = 1.0, follow: Follow | None = None
) -> JobStatus:
    """Probe until finished; ``follow(finished)`` after each look. Probe errors ("could not tell") keep waiting."""
    while True:
        probe = backend.probe(handle)
        finished = probe.status is not None and probe.status.finished
        if follow is not None:
            follow(finished)
        if probe.status is not None and finished:
            return probe.status
        time.sleep(poll_s)


__all__ = [
    "ComputeBackend",
    "ComputeBase",
    "Follow",
    "JobHandle",
    "JobProbe",
    "JobRequest",
    "JobStatus",
    "ServingBackend",
    "ServingHandle",
    "ServingStatus",
    "wait_by_polling",
]
