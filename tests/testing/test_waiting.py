"""The one way a test waits: on what the product writes, failing with what it waited for and saw last."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from prefect_swarm.testing import WaitTimedOut, wait_until


def test_returns_what_passed_once_it_is_written(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    writer = threading.Timer(0.3, lambda: progress.write_text('{"done": 7}'))
    writer.start()
    try:
        text = wait_until("a progress file", progress.read_text, until=lambda t: "done" in t, timeout_s=30, poll_s=0.05)
    finally:
        writer.join()
    assert text == '{"done": 7}'


def test_a_timeout_names_what_it_waited_for_and_what_it_saw_last() -> None:
    seen = iter(range(1000))
    with pytest.raises(WaitTimedOut, match=r"after 0\.3 s waiting for 5 rows done; last seen: [1-9]\d*$") as info:
        wait_until("5 rows done", lambda: next(seen), until=lambda n: n >= 10_000, timeout_s=0.3, poll_s=0.01)
    assert isinstance(info.value, AssertionError)  # pytest shows it as a failed assertion


def test_an_error_while_looking_is_seen_and_looked_past(tmp_path: Path) -> None:
    missing = tmp_path / "not-yet"
    with pytest.raises(WaitTimedOut, match=r"last seen: FileNotFoundError"):
        wait_until("a file", missing.read_text, timeout_s=0.2, poll_s=0.05)


def test_an_assertion_in_the_look_ends_the_wait_at_once() -> None:
    def look() -> int:
        raise AssertionError("the job process exited 1")

    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="the job process exited 1"):
        wait_until("rows done", look, timeout_s=30)
    assert time.monotonic() - t0 < 5
