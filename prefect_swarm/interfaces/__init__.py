"""The seams between prefect-swarm and where it runs: protocols, handles, statuses, capabilities,
and the environment contract of job processes (``jobenv``)."""

from prefect_swarm.interfaces.capabilities import Capabilities, Capability, check_config
from prefect_swarm.interfaces.jobenv import JobEnv, JobRuntime
from prefect_swarm.interfaces.protocols import ComputeBackend, ComputeBase, Follow, ServingBackend, wait_by_polling
from prefect_swarm.interfaces.types import (
    JobHandle,
    JobProbe,
    JobRequest,
    JobStatus,
    ReplicaHealth,
    ReplicaStatus,
    ServingHandle,
    ServingPhase,
    ServingStatus,
    coerce_job_status,
)

__all__ = [
    "Capabilities",
    "Capability",
    "ComputeBackend",
    "ComputeBase",
    "Follow",
    "JobEnv",
    "JobHandle",
    "JobProbe",
    "JobRequest",
    "JobRuntime",
    "JobStatus",
    "ReplicaHealth",
    "ReplicaStatus",
    "ServingBackend",
    "ServingHandle",
    "ServingPhase",
    "ServingStatus",
    "check_config",
    "coerce_job_status",
    "wait_by_polling",
]
