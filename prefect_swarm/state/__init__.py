"""SQLite state of swarms and jobs (schema-versioned, safe under concurrent processes)."""

from prefect_swarm.state.store import SCHEMA_VERSION, JobRecord, StateStore, SwarmRecord

__all__ = ["SCHEMA_VERSION", "JobRecord", "StateStore", "SwarmRecord"]
