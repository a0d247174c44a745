"""Lease records: who holds a swarm (:class:`~prefect_swarm.state.LeaseRecord`), one constructor per
kind of holder. Whether a holder is still there, and taking and letting go of a hold, are
:mod:`prefect_swarm.holding`'s; these sit beside the record so the swarm itself can take the short
leases of its own steps (a bring-up, a park, a ``with`` block).
"""

from __future__ import annotations

import os
import socket
import time

from prefect_swarm.state.store import LeaseKind, LeaseRecord

FLOW_RUN_LEASE_TTL_S = 30.0
"""Heartbeat period of a flow run's lease (its liveness is Prefect's state of the run)."""

KEEP_OWNER = "keep"
"""Owner of the lease that ``up`` / ``keep_swarm`` leave behind; only ``down`` releases it."""


def this_host() -> str:
    """Host name recorded with process leases (a pid means something only there)."""
    return socket.gethostname()


def flow_run_owner(flow_run_id: str) -> str:
    """Lease owner of a flow run."""
    return f"flow-run:{flow_run_id}"


def flow_run_lease(flow_run_id: str) -> LeaseRecord:
    """A lease held by flow run ``flow_run_id`` (the swarm is filled in when it is taken)."""
    now = time.time()
    return LeaseRecord(
        swarm="",
        owner=flow_run_owner(flow_run_id),
        kind=LeaseKind.FLOW_RUN,
        host=this_host(),
        pid=os.getpid(),
        heartbeat=now,
        expires_at=now + FLOW_RUN_LEASE_TTL_S,
    )


def process_lease(kind: LeaseKind = LeaseKind.PROCESS, owner: str | None = None) -> LeaseRecord:
    """A lease held by this process (dead once its pid is gone on this host)."""
    host, pid, now = this_host(), os.getpid(), time.time()
    return LeaseRecord(
        swarm="", owner=owner or f"pid:{host}:{pid}", kind=kind, host=host, pid=pid, heartbeat=now, expires_at=now
    )


def job_lease(swarm: str, job_id: str) -> LeaseRecord:
    """A lease held by job ``job_id`` while it is active (``job submit`` that does not wait)."""
    now = time.time()
    return LeaseRecord(swarm=swarm, owner=f"job:{job_id}", kind=LeaseKind.JOB, heartbeat=now, expires_at=now)


def keep_lease(swarm: str) -> LeaseRecord:
    """The lease ``up`` and ``keep_swarm`` leave: never dead, released by ``down``."""
    return LeaseRecord(swarm=swarm, owner=KEEP_OWNER, kind=LeaseKind.KEEP, host=this_host())
