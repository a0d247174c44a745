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
    # decorations a scheduler adds
    ("CANCELLED by 0", C),
    ("CANCELLED+", C),
    ("  running  ", R),
]


@pytest.mark.parametrize(("raw", "expected"), TABLE, ids=[str(r) for r, _ in TABLE])
def test_coerce(raw: str | JobStatus, expected: JobStatus) -> None:
    assert coerce_job_status(raw) is expected


@pytest.mark.parametrize("raw", ["", "   ", "bogus", "half-done", None, "TIMEOUT", "PD"])
def test_unknown_values_raise(raw: str | None) -> None:  # a scheduler's own names need its table
    with pytest.raises(ValueError):
        coerce_job_status(raw)


def test_finished() -> None:
    assert {s for s in JobStatus if s.finished} == {S, F, C, JobStatus.PREEMPTED}
