"""The Slurm calls a job makes do not grow with its shards (one watcher per job, batched probes).

Counted with the PATH shim of ``bench/slurm_calls.py`` (``squeue``/``sacct`` wrappers that count
each call and exec the real tool) around a whole job, submit to end, on the single-node Slurm with
the stub engine: 2 shards, then 16 (8 times as many; ``bench/slurm_calls.py`` measures 8 and 64),
both as job steps in the LB's allocation, driven the CLI's way
(one fan-out submission) and the flow's way (one submission per shard, each watched from its own
thread, as the ``batch_inference`` shard tasks do).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from slurm_calls import idle_rate, measure  # the benchmark's own measurement (BENCHMARKS.md)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ABSOLUTE_PER_MIN = {"squeue": 90.0, "sacct": 40.0}
"""Calls per minute no job may exceed, at any shard count (the CLI's wait polls at most every 2 s)."""


@pytest.mark.timeout(1800)
def test_squeue_and_sacct_per_minute_do_not_grow_with_shards(need_slurm: None, tmp_path: Path) -> None:
    rows = measure([2, 16], 12, 250.0, ["cli", "tasks"], tmp_path, "steps")
    by = {(r["mode"], r["shards"]): r for r in rows}
    for mode in ("cli", "tasks"):
        few, many = by[(mode, 2)], by[(mode, 16)]
        for tool in ("squeue", "sacct"):
            rate_few, rate_many = few[f"{tool}_per_min"], many[f"{tool}_per_min"]
            # per-shard calls would grow 8x from 2 to 16 shards; a short job's fixed calls (its last
            # checks) weigh more per minute on a loaded machine, hence the slack (seen: 11.0 -> 23.7)
            assert rate_many <= 2 * rate_few + 6, (mode, tool, few, many)
            assert rate_many <= ABSOLUTE_PER_MIN[tool], (mode, tool, many)


IDLE_PER_MIN = 12.0
"""An idle swarm's Slurm calls a minute: the LB's reconciler (one squeue per ``lb.REPLENISH_S``) and the
replica tasks' keeper (one per ``members.KEEP_LB_S`` for the whole swarm), 10 s each, whatever the load."""


@pytest.mark.timeout(600)
def test_an_idle_swarm_asks_slurm_at_a_slow_pace(need_slurm: None, tmp_path: Path) -> None:
    rate = idle_rate(tmp_path, 30)
    assert rate["squeue_per_min"] <= IDLE_PER_MIN + 4, rate  # + one call of each poller at the window's edges
    assert rate["sacct_per_min"] == 0, rate
