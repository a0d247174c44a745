"""``tail_file``: what ``prefect-swarm logs`` prints on local and Slurm (a replica's log file)."""

from __future__ import annotations

import threading
from pathlib import Path

from prefect_swarm.backends.common import tail_file


def test_without_follow_it_reads_the_file_once(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    log.write_text("one\ntwo\n")
    asked: list[bool] = []
    assert "".join(tail_file(log, follow=False, alive=lambda: asked.append(True) or True)) == "one\ntwo\n"
    assert asked == []  # the writer is not even asked about
    assert list(tail_file(tmp_path / "missing.log", follow=False, alive=lambda: True)) == []


def test_follow_yields_what_the_file_gains_until_the_writer_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    log.write_text("before\n")
    running = threading.Event()
    running.set()
    chunks = tail_file(log, follow=True, alive=running.is_set, poll_s=0.01)
    assert next(chunks) == "before\n"

    def write_then_stop() -> None:
        with log.open("a") as fh:
            fh.write("after\n")
        running.clear()  # it wrote its last line, then went

    threading.Timer(0.1, write_then_stop).start()
    assert "".join(chunks) == "after\n"  # the last line is not lost to the stop
