"""Handles, phases and statuses shared by every backend.

Handles are frozen and JSON-serialisable (``to_dict``/``from_dict``): they are stored in SQLite
so that any later process can reattach to a swarm or a job.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect_swarm.interfaces.jobenv import EXIT_OK, EXIT_REQUEUE, JobEnv


class ServingPhase(enum.StrEnum):
    """Where a swarm's serving side stands."""

    UNKNOWN = "UNKNOWN"
    PENDING = "PENDING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    PARKED = "PARKED"
    """Every GPU given back, a snapshot kept in the swarm's folder: ``restore`` (or the next holder)
    brings it back from it; jobs on it pause meanwhile."""


class JobStatus(enum.StrEnum):
    """Where a compute job stands."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    """Stopped by the scheduler (preemption, time limit) after flushing its checkpoint: resumable."""

    @property
    def finished(self) -> bool:
        """True for SUCCEEDED, FAILED, CANCELLED and PREEMPTED."""
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PREEMPTED)

    @property
    def active(self) -> bool:
        """True for PENDING and RUNNING: the job still has (or will have) processes."""
        return not self.finished

    @classmethod
    def of_exit(cls, code: int | None) -> JobStatus:
        """A finished job process's status from its exit code (``jobenv.EXIT_*``): 0 SUCCEEDED, 75
        (flushed, then stopped: a signal, an outage, the budget) PREEMPTED, anything else, or no exit code, FAILED."""
        if code == EXIT_OK:
            return cls.SUCCEEDED
        return cls.PREEMPTED if code == EXIT_REQUEUE else cls.FAILED

    @classmethod
    def combine(cls, statuses: Iterable[JobStatus]) -> JobStatus:
        """One status for the shards of a job: unfinished while any shard is (so a wait leaves nothing
        running; RUNNING before PENDING), then FAILED beats PREEMPTED beats CANCELLED beats SUCCEEDED."""
        seen = set(statuses)
        for status in (cls.RUNNING, cls.PENDING, cls.FAILED, cls.PREEMPTED, cls.CANCELLED):
            if status in seen:
                return status
        return cls.SUCCEEDED


class ReplicaHealth(enum.StrEnum):
    """Health of one replica as its watchdog (or scheduler) last saw it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


_JOB_ALIASES: dict[str, JobStatus] = {
    # generic
    "pending": JobStatus.PENDING,
    "queued": JobStatus.PENDING,
    "submitted": JobStatus.PENDING,
    "running": JobStatus.RUNNING,
    "started": JobStatus.RUNNING,
    "succeeded": JobStatus.SUCCEEDED,
    "success": JobStatus.SUCCEEDED,
    "completed": JobStatus.SUCCEEDED,
    "done": JobStatus.SUCCEEDED,
    "failed": JobStatus.FAILED,
    "error": JobStatus.FAILED,
    "cancelled": JobStatus.CANCELLED,
    "canceled": JobStatus.CANCELLED,
}


def coerce_job_status(raw: str | JobStatus | None, aliases: Mapping[str, JobStatus] | None = None) -> JobStatus:
    """Normalise a raw status (ours, generic words, a scheduler's ``CANCELLED by 0``...) to a JobStatus.

    ``aliases`` are a backend's own state names (lower case), e.g. Slurm's in
    ``prefect_swarm.backends.slurm.states``. Unknown values raise ValueError: silently mapping them
    would report wrong outcomes.
    """
    if isinstance(raw, JobStatus):
        return raw
    if raw is None:
        raise ValueError("no job status given")
    key = raw.strip().split()[0].rstrip("+").lower() if raw.strip() else ""
    try:
        return JobStatus(key.upper())
    except ValueError:
        pass
    if key in _JOB_ALIASES:
        return _JOB_ALIASES[key]
    if aliases and key in aliases:
        return aliases[key]
    raise ValueError(f"unknown job status {raw!r}")


@dataclass(frozen=True)
class ServingHandle:
    """What a backend needs to find a swarm again: its name, backend type and backend data."""

    name: str
    backend: str
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form for the state database."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingHandle:
        """Inverse of :meth:`to_dict`."""
        return cls(name=data["name"], backend=data["backend"], url=data.get("url"), meta=dict(data.get("meta", {})))


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica's health as last observed."""

    index: int
    health: ReplicaHealth
    url: str | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    external_id: str | None = None
    detail: str = ""
    log_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (health as its string value)."""
        data = asdict(self)
        data["health"] = self.health.value
        return data


@dataclass(frozen=True)
class ServingStatus:
    """A swarm's serving status: its phase, endpoint URL, a human detail and each replica."""

    phase: ServingPhase
    url: str | None = None
    detail: str = ""
    replicas: tuple[ReplicaStatus, ...] = ()
    stopped_at_budget: bool = False
    """STOPPED by its own sidecar at the swarm's budget (``detail`` says how far): bringing it up again
    with a larger budget is the way on, submitting more to it is not."""

    @property
    def healthy(self) -> int:
        """How many replicas are healthy."""
        return sum(r.health is ReplicaHealth.HEALTHY for r in self.replicas)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "phase": self.phase.value,
            "url": self.url,
            "detail": self.detail,
            "healthy_replicas": self.healthy,
            "replicas": [r.to_dict() for r in self.replicas],
        }


@dataclass(frozen=True)
class JobHandle:
    """What a compute backend needs to find a job again (``id`` is the reconnectable external id)."""

    id: str
    backend: str
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form for the state database."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobHandle:
        """Inverse of :meth:`to_dict`."""
        return cls(id=data["id"], backend=data["backend"], name=data.get("name", ""), meta=dict(data.get("meta", {})))


@dataclass(frozen=True)
class JobProbe:
    """A non-blocking look at a job. ``error`` set means "could not tell", never "failed"."""

    status: JobStatus | None
    exit_code: int | None = None
    error: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class JobRequest:
    """What :meth:`ComputeBackend.submit` starts: a command, its environment and its shards.

    With ``nshards`` > 1 and no ``shard_id`` the job fans out into ``nshards`` processes; with
    ``shard_id`` only that shard starts. A sharded process gets ``--shard-id i --nshards n``
    appended to its command and the shard in its environment (:class:`JobEnv`). ``secret_env``
    reaches the process environment only: never a rendered command, a log or a state row.
    """

    name: str
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    resources: Mapping[str, Any] = field(default_factory=dict)
    detach: bool = True
    nshards: int = 1
    shard_id: int | None = None
    workdir: str | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(f"job '{self.name}': command is empty; pass the argv of the job process.")
        if self.nshards < 1 or (self.shard_id is not None and not 0 <= self.shard_id < self.nshards):
            raise ValueError(f"job '{self.name}': shard_id {self.shard_id} is not in range for nshards={self.nshards}")

    @property
    def sharded(self) -> bool:
        """False for a plain one-process job (its command gets no shard arguments)."""
        return self.nshards > 1 or self.shard_id is not None

    def shards(self) -> list[int]:
        """The shard ids this request starts (``[0]`` for a plain job)."""
        if self.shard_id is not None:
            return [self.shard_id]
        return list(range(self.nshards))

    def argv(self, shard: int) -> list[str]:
        """The command of shard ``shard``, with the shard arguments when the job is sharded."""
        if not self.sharded:
            return list(self.command)
        return [*self.command, "--shard-id", str(shard), "--nshards", str(self.nshards)]

    def shard_env(self, shard: int) -> dict[str, str]:
        """The shard's place in the job, as environment (``JobEnv`` names)."""
        return JobEnv(shard_id=shard, nshards=self.nshards).to_env()


# --- sleep and wake (replicas that free their GPUs and keep their allocation) ---
@dataclass(frozen=True)
class SleepReport:
    """What sleeping or waking one replica did: where it listens, whether it is asleep now, how long it took."""

    index: int
    url: str
    asleep: bool
    seconds: float
    level: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (CLI output, task results)."""
        return {"replica": self.index, "url": self.url, "asleep": self.asleep, "seconds": round(self.seconds, 3),
                "level": self.level}  # fmt: skip
