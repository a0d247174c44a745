"""SQLite state of swarms, their leases and jobs (schema-versioned, safe under concurrent processes)."""

from prefect_swarm.state.store import (
    SCHEMA_VERSION,
    Claim,
    JobRecord,
    LeaseKind,
    LeaseRecord,
    StateStore,
    Submission,
    SwarmRecord,
)

__all__ = [
    "SCHEMA_VERSION",
    "Claim",
    "JobRecord",
    "LeaseKind",
    "LeaseRecord",
    "StateStore",
    "Submission",
    "SwarmRecord",
]
