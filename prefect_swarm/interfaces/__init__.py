"""The seams between prefect-swarm and where it runs: protocols, handles, statuses, capabilities,
and the environment contract of job processes (``jobenv``).

The names below are loaded on first use (PEP 562): a process that needs one module of this package
(a job process, the environment contract ``jobenv``; a sidecar, the types) does not pay for the
others' imports (httpx, prometheus_client, the config models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
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

_WHERE: dict[str, str] = {
    "Capabilities": "prefect_swarm.interfaces.capabilities",
    "Capability": "prefect_swarm.interfaces.capabilities",
    "ComputeBackend": "prefect_swarm.interfaces.protocols",
    "ComputeBase": "prefect_swarm.interfaces.protocols",
    "Follow": "prefect_swarm.interfaces.protocols",
    "JobEnv": "prefect_swarm.interfaces.jobenv",
    "JobHandle": "prefect_swarm.interfaces.types",
    "JobProbe": "prefect_swarm.interfaces.types",
    "JobRequest": "prefect_swarm.interfaces.types",
    "JobRuntime": "prefect_swarm.interfaces.jobenv",
    "JobStatus": "prefect_swarm.interfaces.types",
    "ReplicaHealth": "prefect_swarm.interfaces.types",
    "ReplicaStatus": "prefect_swarm.interfaces.types",
    "ServingBackend": "prefect_swarm.interfaces.protocols",
    "ServingHandle": "prefect_swarm.interfaces.types",
    "ServingPhase": "prefect_swarm.interfaces.types",
    "ServingStatus": "prefect_swarm.interfaces.types",
    "SleepReport": "prefect_swarm.interfaces.types",
    "check_config": "prefect_swarm.interfaces.capabilities",
    "coerce_job_status": "prefect_swarm.interfaces.types",
    "wait_by_polling": "prefect_swarm.interfaces.protocols",
}

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
    "SleepReport",
    "check_config",
    "coerce_job_status",
    "wait_by_polling",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
