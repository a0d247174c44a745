"""JobStatus.combine: the one rule for which status a job of several shards has."""

from __future__ import annotations

from prefect_swarm.interfaces import JobStatus

S, R, F, C, P = (JobStatus.SUCCEEDED, JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PENDING)


def test_unfinished_while_any_shard_is_then_failed_beats_cancelled_beats_succeeded() -> None:
    assert JobStatus.combine([S, S]) is S
    assert JobStatus.combine([S, R]) is R
    assert JobStatus.combine([P, S]) is P
    assert JobStatus.combine([F, S]) is F
    assert JobStatus.combine([R, F]) is R  # finished only when every shard is
    assert JobStatus.combine([P, R]) is R
    assert JobStatus.combine([C, S]) is C
    assert JobStatus.combine([C, F]) is F


def test_no_shard_is_success_and_any_iterable_will_do() -> None:
    assert JobStatus.combine([]) is S
    assert JobStatus.combine(iter([S, F])) is F
