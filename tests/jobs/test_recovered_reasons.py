"""A row answered on a retry has no error in the output (status ok), yet the reason it failed with
before stays visible: the shard's ledger counts such rows by that reason, in its index (so every
later run keeps the count) and in its progress (what `job status` and the Prefect summary read)."""

from __future__ import annotations

from pathlib import Path

from _jobkit import error_result, ok_result, open_ledger

from prefect_swarm.jobs.checkpoint.ledger import OTHER_REASONS, RECOVERED_REASONS, ShardLedger
from prefect_swarm.jobs.checkpoint.plan import recovered_text

START, END = 0, 40


def _ledger(root: Path, retry_failed: bool = False) -> ShardLedger:
    led: ShardLedger = open_ledger(root, START, END, retry_failed=retry_failed)
    return led


def test_rows_answered_on_a_retry_keep_their_earlier_reason_counted(tmp_path: Path) -> None:
    root = tmp_path / "shard"
    led = _ledger(root)
    for row in range(START, END):
        led.add(
            error_result(row, "HTTP 503: overloaded")
            if row < 5
            else error_result(row, "timeout")
            if row < 8
            else ok_result(row)
        )
    led.flush("done")
    assert led._progress("done")["recovered"] == 0

    again = _ledger(root, retry_failed=True)  # rows 0-4 and 6 answered now; 5 and 7 time out again
    for row in range(8):
        again.add(error_result(row, "timeout") if row in (5, 7) else ok_result(row))
    again.flush("done")
    progress = again._progress("done")
    assert progress["recovered"] == 6 and progress["recovered_reasons"] == {"HTTP 503: overloaded": 5, "timeout": 1}

    third = _ledger(root, retry_failed=True)  # a later run starts from the index's count and adds to it
    assert third.recovered == {"HTTP 503: overloaded": 5, "timeout": 1}
    third.add(ok_result(5))  # its latest reason counts (the newest one of "timeout | earlier: timeout")
    third.add(error_result(7, "HTTP 500: bug"))
    third.flush("done")
    reasons = third._progress("done")["recovered_reasons"]
    assert reasons == {"HTTP 503: overloaded": 5, "timeout": 2}, reasons
    text = recovered_text([{"recovered_reasons": reasons}, {"recovered_reasons": {"timeout": 1}}])
    assert text == (
        "8 rows answered on a retry after failing before (earlier reasons: HTTP 503: overloaded x5; timeout x3)"
    )
    assert recovered_text([{"recovered_reasons": {}}, {}]) == ""


def test_distinct_reasons_are_bounded(tmp_path: Path) -> None:
    root = tmp_path / "shard"
    led = _ledger(root)
    for row in range(START, END):
        led.add(error_result(row, f"HTTP 500: request {row} refused"))
    led.flush("done")
    again = _ledger(root, retry_failed=True)
    for row in range(START, END):
        again.add(ok_result(row))
    again.flush("done")
    reasons = again._progress("done")["recovered_reasons"]
    assert len(reasons) == RECOVERED_REASONS + 1 and reasons[OTHER_REASONS] == END - START - RECOVERED_REASONS
    assert sum(reasons.values()) == END - START
