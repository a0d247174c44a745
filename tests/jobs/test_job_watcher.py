"""One watcher per job: every shard waits on one batched probe, whatever the number of shards.

The compute backend here is a counting fake of the seam (``probe_many``): the Slurm one turns each
call into one ``squeue`` and at most one ``sacct`` (counted on the real Slurm in
``tests/slurm/test_slurm_calls.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from prefect_swarm.exceptions import BudgetReached
from prefect_swarm.interfaces import JobHandle, JobProbe, JobStatus
from prefect_swarm.launch import JobWatcher, ShardStopped, latest_submissions
from prefect_swarm.testing.waiting import wait_until


class CountingCompute:
    """probe_many answers RUNNING until a handle's end time, then SUCCEEDED; counts its calls. A handle
    without an end in ``ends`` ends ``run_s`` after its first probe (on a loaded machine the last of
    128 threads starts seconds after the first, and must still find its shard running)."""

    def __init__(self, ends: dict[str, float] | None = None, run_s: float = 0.0) -> None:
        self.run_s = run_s
        self.ends = dict(ends or {})
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def probe_many(self, handles: Sequence[JobHandle]) -> list[JobProbe]:
        now = time.monotonic()
        with self.lock:
            self.calls.append(len(handles))
            ends = [self.ends.setdefault(h.id, now + self.run_s) for h in handles]
        done = JobProbe(JobStatus.SUCCEEDED, exit_code=0)
        return [done if now >= end else JobProbe(JobStatus.RUNNING) for end in ends]


def _watch_all(n: int, run_s: float, tmp_path: Path) -> tuple[CountingCompute, list[JobProbe], float]:
    start = time.monotonic()
    compute = CountingCompute(run_s=run_s)
    watcher = JobWatcher(compute, None)  # type: ignore[arg-type]
    results: list[JobProbe] = []
    steps = [0] * n

    def one(i: int) -> None:
        def on_step() -> None:
            steps[i] += 1

        results.append(watcher.wait(JobHandle(id=f"s{i}", backend="fake"), on_step=on_step, mark=tmp_path / f"m{i}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(1 for s in steps if s) >= n // 2, "on_step runs in the shard's own thread after a batched probe"
    return compute, results, time.monotonic() - start


def test_one_batched_probe_covers_every_shard(tmp_path: Path) -> None:
    compute8, results8, _ = _watch_all(8, 3.0, tmp_path)
    compute128, results128, wall = _watch_all(128, 3.0, tmp_path)
    assert len(results8) == 8 and len(results128) == 128
    assert all(r.status is JobStatus.SUCCEEDED for r in results8 + results128)
    assert wall < 3.0 + 10.0
    # one call a step for the whole job: as many calls at 128 shards as at 8 (the steps grow)
    assert len(compute128.calls) <= len(compute8.calls) + 2, (compute8.calls, compute128.calls)
    assert len(compute128.calls) <= 12
    assert max(compute128.calls) == 128  # each call covered every shard still running


def test_a_shard_end_mark_wakes_the_watcher(tmp_path: Path) -> None:
    """Steps grow to WATCH_MAX_S; a shard writing its end mark gets its end seen within a second."""
    far = time.monotonic() + 3600
    compute = CountingCompute({"s0": far})
    watcher = JobWatcher(compute, None)  # type: ignore[arg-type]
    mark = tmp_path / "DONE"
    out: list[JobProbe] = []
    t = threading.Thread(target=lambda: out.append(watcher.wait(JobHandle(id="s0", backend="fake"), mark=mark)))
    t.start()
    time.sleep(12)  # the watcher's step is now long
    before = len(compute.calls)
    assert before <= 8  # 0.5 s growing by 1.5x: not a poll every fraction of a second
    compute.ends["s0"] = time.monotonic()
    mark.write_text("done")
    t.join(3)
    assert out and out[0].status is JobStatus.SUCCEEDED


def test_stop_and_budget_end_every_wait(tmp_path: Path) -> None:
    far = time.monotonic() + 3600
    compute = CountingCompute({"a": far, "b": far})
    watcher = JobWatcher(compute, None)  # type: ignore[arg-type]
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    with pytest.raises(ShardStopped):
        watcher.wait(JobHandle(id="a", backend="fake"), stop=stop, mark=None)

    class Guard:
        def check(self) -> None:
            raise BudgetReached("swarm 'x': budget reached: 2 of 1 GPU-hours")

    broke = JobWatcher(compute, Guard())  # type: ignore[arg-type]
    with pytest.raises(BudgetReached, match="budget reached"):
        broke.wait(JobHandle(id="b", backend="fake"), mark=None)
    # the grace, plus room for a loaded machine
    wait_until(
        "both watchers' threads to end",
        lambda: broke.thread is None and watcher.thread is None,
        timeout_s=WATCH_GRACE_S + 30,
    )
    assert broke.thread is None and watcher.thread is None  # nothing watched: the threads ended


WATCH_GRACE_S = 2.0


def test_only_the_latest_submission_of_each_shard_is_probed() -> None:
    subs = [
        {"id": "fan", "shards": [0, 1, 2]},
        {"id": "retry-1", "shards": [1]},
        {"id": "retry-1b", "shards": [1]},
        {"id": "retry-2", "shards": [2]},
    ]
    assert [s["id"] for s in latest_submissions(subs)] == ["fan", "retry-1b", "retry-2"]
    subs = [{"id": "old", "shards": [0]}, {"id": "new", "shards": [0]}]
    assert [s["id"] for s in latest_submissions(subs)] == ["new"]
    assert [s["id"] for s in latest_submissions([{"id": "a", "shards": []}, {"id": "b", "shards": []}])] == ["b"]


def test_a_later_run_of_the_job_gets_a_watcher_of_its_own() -> None:
    """A budget stop of one run does not stick to the job: once nothing is watched the watcher is forgotten."""

    class Guard:
        def check(self) -> None:
            raise BudgetReached("swarm 'x': budget reached")

    compute = CountingCompute({"a": time.monotonic() + 3600, "b": time.monotonic()})
    first = JobWatcher.of("job-later", compute, Guard)  # type: ignore[arg-type]
    with pytest.raises(BudgetReached):
        first.wait(JobHandle(id="a", backend="fake"))
    second = JobWatcher.of("job-later", compute, None)  # type: ignore[arg-type]
    assert second is not first
    assert second.wait(JobHandle(id="b", backend="fake")).status is JobStatus.SUCCEEDED
