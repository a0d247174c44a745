"""coerce_job_status: every raw status a backend reports maps to one JobStatus (table)."""

from __future__ import annotations

import pytest

from prefect_swarm.interfaces import JobStatus, coerce_job_status

P, R, S, F, C = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

TABLE = [
    # ours, any case
    ("PENDING", P),
    ("running", R),
    ("Succeeded", S),
    ("FAILED", F),
    ("cancelled", C),
    (JobStatus.RUNNING, R),
    # generic words
    ("queued", P),
    ("submitted", P),
    ("started", R),
    ("success", S),
    ("completed", S),
    ("done", S),
    ("error", F),
    ("canceled", C),
    # Slurm state names (squeue/sacct) and their decorations
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
]


@pytest.mark.parametrize(("raw", "expected"), TABLE, ids=[str(r) for r, _ in TABLE])
def test_coerce(raw: str | JobStatus, expected: JobStatus) -> None:
    assert coerce_job_status(raw) is expected


@pytest.mark.parametrize("raw", ["", "   ", "bogus", "half-done", None])
def test_unknown_values_raise(raw: str | None) -> None:
    with pytest.raises(ValueError):
        coerce_job_status(raw)


def test_finished() -> None:
    assert {s for s in JobStatus if s.finished} == {S, F, C, JobStatus.PREEMPTED}
