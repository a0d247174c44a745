"""SQLite state of swarms, their leases and jobs (schema-versioned, safe under concurrent processes)."""

from prefect_swarm.state.leases import (
    FLOW_RUN_LEASE_TTL_S,
    KEEP_OWNER,
    flow_run_lease,
    flow_run_owner,
    job_lease,
    keep_lease,
    process_lease,
    this_host,
)
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
    "FLOW_RUN_LEASE_TTL_S",
    "KEEP_OWNER",
    "SCHEMA_VERSION",
    "Claim",
    "JobRecord",
    "LeaseKind",
    "LeaseRecord",
    "StateStore",
    "Submission",
    "SwarmRecord",
    "flow_run_lease",
    "flow_run_owner",
    "job_lease",
    "keep_lease",
    "process_lease",
    "this_host",
]
