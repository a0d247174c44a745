"""Slurm calls (``squeue``, ``sacct``) a job makes per minute, at 8 and 64 shards: they must not grow with shards.

    python bench/slurm_calls.py [--shards 8 64] [--rows-per-shard 40] [--latency-ms 250]
                                [--mode cli tasks] [--json OUT]
    python bench/slurm_calls.py --idle 120     # an idle swarm's calls per minute

Needs the single-node Slurm (``make slurm``). Brings a stub-engine swarm up on it with
``prefect-swarm up``, then runs each job with a PATH shim in front of the real Slurm tools: a
folder holding ``squeue`` and ``sacct`` wrappers that append one line to a count file and exec the
real binary. Only the job's side sees the shim (the submitting process and the job steps it
starts); the swarm's own processes (LB reconciler, watchdogs) were started without it. Two ways a
job is driven:

* ``cli``: ``prefect-swarm job submit --shards N`` (one fan-out submission, then the CLI's wait);
* ``tasks``: what the ``batch_inference`` flow's shard tasks do, without a Prefect server: one
  :class:`prefect_swarm.launch.ShardWatch` per shard, each in its own thread (one submission per
  shard), watched by the job's one :class:`prefect_swarm.launch.JobWatcher`.

and two placements, one swarm each (``--placement``): ``steps``, an LB job that hosts every shard as
a job step (``backend.lb.steps_per_cpu`` 64), and ``jobs``, the defaults (the LB job hosts 4 shards;
a job of more runs each shard as an sbatch job of its own).

Per row: calls of each tool over the whole job (submit to the end of the wait), the job's wall
time, and calls per minute. Every row of the input must come back (exactly once).

The machine has 2 cores: each shard is a full job process, so rows are few and small, and the job
knobs keep each process small (no /metrics server, short read batches, one request in flight).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("squeue", "sacct")


def make_shim(folder: Path, count_file: Path) -> dict[str, str]:
    """A PATH shim: ``squeue`` and ``sacct`` wrappers counting each call; returns the environment to run with."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            raise SystemExit(f"{tool} is not on PATH: start the single-node Slurm first (make slurm).")
        wrapper = folder / tool
        wrapper.write_text(f'#!/bin/sh\necho "{tool}" >> "{count_file}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


def counts(count_file: Path) -> dict[str, int]:
    """Calls of each tool recorded so far."""
    lines = count_file.read_text().split() if count_file.exists() else []
    return {tool: lines.count(tool) for tool in TOOLS}


def swarm_yaml(path: Path, name: str, latency_ms: float, placement: str) -> Path:
    """A one-replica stub swarm on the single-node Slurm (free ports picked now). ``placement``
    ``steps``: its LB job hosts every shard as a job step (``backend.lb.steps_per_cpu`` 64); ``jobs``:
    the defaults (a job of more than 4 shards runs each shard as an sbatch job of its own)."""
    import yaml

    from prefect_swarm.testing import free_port_block
    from prefect_swarm.testing.stub_engine import engine_command

    cfg = {
        "name": name,
        "model": "stub-model",
        "replicas": 1,
        "gpus_per_replica": 1,
        "port": free_port_block(1),
        "engine": {"kind": "command", "command": engine_command(), "args": ["--latency-ms", str(latency_ms)]},
        "backend": {
            "type": "slurm",
            "cpus_per_replica": 1,
            "queue_timeout_s": 900,
            "time_limit": "60:00",
            "lb_port": free_port_block(1),
            **({"lb": {"steps_per_cpu": 64}} if placement == "steps" else {}),
        },
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def job_spec(folder: Path, shards: int, rows_per_shard: int) -> Path:
    """A dataset of ``shards * rows_per_shard`` prompts and a small-footprint JobSpec over it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    n = shards * rows_per_shard
    table = pa.table({"id": [f"r{i:06d}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)]})
    pq.write_table(table, folder / "in.parquet", row_group_size=rows_per_shard)
    spec = {
        "input": str(folder / "in.parquet"),
        "output": str(folder / "out.parquet"),
        "job_dir": str(folder / "job"),
        "id_column": "id",
        "shards": shards,
        "concurrency": 1,
        "read_batch_rows": 64,
        "checkpoint_every": 20,
        "checkpoint_seconds": 5,
        "metrics_host": None,
        "job_kwargs": {"sampling": {"max_tokens": 4}},
    }
    path = folder / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def cli(args: list[str], env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``prefect-swarm ARGS`` with ``env``."""
    argv = [sys.executable, "-m", "prefect_swarm.cli.main", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise SystemExit(f"prefect-swarm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


TASKS_DRIVER = """
import sys, threading
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import ShardWatch, commit_job, for_swarm, plan_job
from prefect_swarm.swarm import Swarm

swarm = Swarm.from_state(sys.argv[1])
plan = plan_job(for_swarm(JobSpec.load(sys.argv[2]), swarm), swarm.cfg.name)
spec = plan.spec
spec.save()
bad = []

def shard(i):
    watch = ShardWatch(swarm, spec, i)
    watch.submit()
    try:
        watch.outcome(watch.watch())
    except Exception as exc:
        bad.append(f"shard {i}: {exc}")

threads = [threading.Thread(target=shard, args=(i,)) for i in plan.pending]
for t in threads:
    t.start()
for t in threads:
    t.join()
if bad:
    sys.exit("\\n".join(bad))
commit_job(spec.job_id)
"""


def run_job(mode: str, name: str, spec: Path, env: dict[str, str], count_file: Path) -> dict[str, Any]:
    """Run one job with the shim on PATH; its calls, wall time and calls per minute."""
    count_file.write_text("")
    t0 = time.monotonic()
    if mode == "cli":
        cli(["job", "submit", "-n", name, "--spec", str(spec)], env)
    else:
        proc = subprocess.run(
            [sys.executable, "-c", TASKS_DRIVER, name, str(spec)], env=env, capture_output=True, text=True, cwd=ROOT
        )
        if proc.returncode != 0:
            raise SystemExit(f"the tasks driver failed:\n{proc.stderr[-4000:]}")
    wall = time.monotonic() - t0
    got = counts(count_file)
    return {**got, "wall_s": round(wall, 1), **{f"{t}_per_min": round(got[t] * 60 / wall, 1) for t in TOOLS}}


def check_output(folder: Path, rows: int) -> None:
    """Every input row came back exactly once."""
    import pyarrow.parquet as pq

    ids = pq.read_table(folder / "out.parquet", columns=["id"]).column("id").to_pylist()
    if sorted(ids) != [f"r{i:06d}" for i in range(rows)]:
        raise SystemExit(f"{folder}: {len(ids)} output rows for {rows} input rows")


def measure(
    shard_counts: list[int], rows_per_shard: int, latency_ms: float, modes: list[str], work: Path, placement: str
) -> list[dict[str, Any]]:
    """Bring one swarm up, run every (mode, shards) job against it, bring it down; one dict per job."""
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    base = {**os.environ, "PREFECT_SWARM_HOME": str(home)}
    name = f"calls-{uuid.uuid4().hex[:6]}"
    cli(["up", "-c", str(swarm_yaml(work / "swarm.yaml", name, latency_ms, placement))], base)
    out = []
    try:
        env = {**make_shim(work / "shim", work / "calls.txt"), "PREFECT_SWARM_HOME": str(home)}
        for mode in modes:
            for shards in shard_counts:
                folder = work / f"{mode}-{shards}"
                row = run_job(mode, name, job_spec(folder, shards, rows_per_shard), env, work / "calls.txt")
                check_output(folder, shards * rows_per_shard)
                where = "steps" if placement == "steps" or shards <= 4 else "jobs"
                out.append({"mode": mode, "shards": shards, "placement": where, "rows": shards * rows_per_shard, **row})
                print(json.dumps(out[-1]), flush=True)
    finally:
        cli(["down", name, "--force", "--yes"], base, check=False)
    return out


def idle_rate(work: Path, seconds: float) -> dict[str, float]:
    """Slurm calls per minute of an idle swarm: one brought up with the shim on PATH (its LB reconciler
    and replica keepers then count), then left alone for ``seconds`` after it is ready."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**make_shim(work / "shim", work / "calls.txt"), "PREFECT_SWARM_HOME": str(work / "home")}
    name = f"idle-{uuid.uuid4().hex[:6]}"
    cli(["up", "-c", str(swarm_yaml(work / "swarm.yaml", name, 1.0, "jobs"))], env)
    try:
        before, t0 = counts(work / "calls.txt"), time.monotonic()
        time.sleep(seconds)  # the measurement: calls the swarm makes in a window of its idle life
        after, wall = counts(work / "calls.txt"), time.monotonic() - t0
    finally:
        cli(["down", name, "--force", "--yes"], env, check=False)
    return {f"{tool}_per_min": round((after[tool] - before[tool]) * 60 / wall, 1) for tool in TOOLS}


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of BENCHMARKS.md."""
    lines = [
        "| mode | shards | shards run as | rows | wall s | squeue | sacct | squeue/min | sacct/min |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['mode']} | {r['shards']} | {r['placement']} | {r['rows']} | {r['wall_s']} | {r['squeue']} "
        f"| {r['sacct']} | {r['squeue_per_min']} | {r['sacct_per_min']} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--rows-per-shard", type=int, default=40)
    ap.add_argument("--latency-ms", type=float, default=250.0, help="the stub engine's latency per request")
    ap.add_argument("--mode", nargs="+", choices=["cli", "tasks"], default=["cli", "tasks"])
    ap.add_argument(
        "--placement",
        nargs="+",
        choices=["steps", "jobs"],
        default=["steps", "jobs"],
        help="steps: an LB job sized to host every shard as a job step; jobs: the defaults (more than 4 "
        "shards run as sbatch jobs of their own). One swarm each.",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--idle", type=float, default=0, help="instead: calls per minute of an idle swarm over this many s")
    args = ap.parse_args()
    if args.idle:
        with tempfile.TemporaryDirectory(prefix="slurm-calls-") as tmp:
            print(json.dumps(idle_rate(Path(tmp), args.idle)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="slurm-calls-") as tmp:
        for placement in args.placement:
            work = Path(tmp) / placement
            rows += measure(args.shards, args.rows_per_shard, args.latency_ms, args.mode, work, placement)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
