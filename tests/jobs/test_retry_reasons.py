"""A retried error row keeps every run's reason: the ledger joins a row's new error to the one it had
(``EARLIER_ERRORS``), so the latest write, the one the commit and a compaction keep, holds them all."""

from __future__ import annotations

from pathlib import Path

from _jobkit import error_result, ok_result, open_ledger

from prefect_swarm.jobs.checkpoint.ledger import EARLIER_ERRORS, ShardLedger, latest_positions, read_ledger
from prefect_swarm.paths import ShardPaths

START, END = 0, 50


def _ledger(root: Path, retry_failed: bool = False) -> ShardLedger:
    led: ShardLedger = open_ledger(root, START, END, retry_failed=retry_failed)
    return led


def _latest_errors(root: Path) -> dict[int, str | None]:
    table = read_ledger(ShardPaths(root))
    assert table is not None
    pos = latest_positions(table.column("_row").to_numpy(), START, END)
    errors = table.column("error").to_pylist()
    return {i: errors[p] for i, p in enumerate(pos.tolist())}


def test_a_retried_row_keeps_each_runs_reason_and_an_answered_one_has_none(tmp_path: Path) -> None:
    root = tmp_path / "shard"
    led = _ledger(root)
    for row in range(START, END):
        led.add(error_result(row, "HTTP 503: overloaded") if row in (3, 7) else ok_result(row))
    led.flush("done")

    again = _ledger(root, retry_failed=True)  # the first retry: row 3 fails for another reason, row 7 is answered
    assert again.n_left == 2 and again.earlier == {3: "HTTP 503: overloaded", 7: "HTTP 503: overloaded"}
    again.add(error_result(3, "connection error: refused"))
    again.add(ok_result(7))
    again.flush("done")
    latest = _latest_errors(root)
    assert latest[3] == f"connection error: refused{EARLIER_ERRORS}HTTP 503: overloaded"
    assert latest[7] is None and latest[0] is None

    third = _ledger(root, retry_failed=True)  # only row 3 is an error now; its whole history comes along
    assert third.n_left == 1 and list(third.earlier) == [3]
    third.add(error_result(3, "timeout after 5s"))
    third.flush("done")
    third.compact(len(third._parts))  # a merge keeps each row's latest write: the one holding every reason
    assert len(read_ledger(ShardPaths(root)) or []) == END - START
    assert _latest_errors(root)[3] == (
        f"timeout after 5s{EARLIER_ERRORS}connection error: refused{EARLIER_ERRORS}HTTP 503: overloaded"
    )
    plain = _ledger(root)  # without retry_failed nothing is sent again and no reason is read
    assert plain.complete and plain.earlier == {} and plain.n_failed == 1
