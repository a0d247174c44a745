"""Slurm's state names (squeue/sacct, long and short) map to one JobStatus each (table)."""

from __future__ import annotations

import pytest

from prefect_swarm.backends.slurm.states import slurm_job_status
from prefect_swarm.interfaces import JobStatus

P, R, S, F, C = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

TABLE = [
    ("COMPLETED", S),
    ("CANCELLED by 0", C),
    ("CANCELLED+", C),
    ("TIMEOUT", F),
    ("NODE_FAIL", F),
    ("OUT_OF_MEMORY", F),
    ("PREEMPTED", JobStatus.PREEMPTED),
    ("PR", JobStatus.PREEMPTED),
    ("REQUEUED", P),
    ("CONFIGURING", P),
    ("COMPLETING", R),
    ("SUSPENDED", P),
    ("BOOT_FAIL", F),
    ("DEADLINE", F),
    ("  running  ", R),
    # Slurm short codes
    ("PD", P),
    ("R", R),
    ("CG", R),
    ("CD", S),
    ("F", F),
    ("CA", C),
    ("TO", F),
    ("NF", F),
    ("OOM", F),
    # what every backend says means the same here
    ("RUNNING", R),
    ("completed", S),
]


@pytest.mark.parametrize(("raw", "expected"), TABLE, ids=[str(r) for r, _ in TABLE])
def test_slurm_state(raw: str, expected: JobStatus) -> None:
    assert slurm_job_status(raw) is expected


@pytest.mark.parametrize("raw", ["", "bogus", None])
def test_unknown_states_raise(raw: str | None) -> None:
    with pytest.raises(ValueError):
        slurm_job_status(raw)
