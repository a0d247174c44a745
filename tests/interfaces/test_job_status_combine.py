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


def test_preempted_is_finished_beats_cancelled_and_loses_to_failed() -> None:
    pre = JobStatus.PREEMPTED
    assert pre.finished and not pre.active
    assert JobStatus.combine([pre, S]) is pre
    assert JobStatus.combine([pre, C]) is pre
    assert JobStatus.combine([pre, F]) is F
    assert JobStatus.combine([pre, R]) is R


def test_a_job_process_exit_code_says_done_preempted_or_failed() -> None:
    assert JobStatus.of_exit(0) is S
    assert JobStatus.of_exit(75) is JobStatus.PREEMPTED  # flushed, then stopped by a signal
    assert JobStatus.of_exit(1) is F and JobStatus.of_exit(2) is F and JobStatus.of_exit(None) is F
