"""Restore of a parked swarm vs a cold `up` of the same swarm, side by side.

    python bench/park_restore.py [--backend local|slurm] [--replicas 2] [--stage-mb 512] [--repeat 3]

The swarm: ``--replicas`` stub engines whose model is a ``--stage-mb`` MB folder of weights copied to
node-local disk before the engines start (``stage``), as a real swarm's weights are. Each round:

- *cold*: ``up`` + readiness of the swarm on a node that has nothing staged (a fresh ``stage.to``
  folder: what a new allocation sees), timed; then it is parked;
- *restore*: ``restore`` of that parked swarm (the same one: its snapshot, its staged copy), timed;
  then it is taken down.

Printed per round and as medians, with the ratio restore ÷ cold. On Slurm (``scripts/slurm/ci-up.sh``)
also the swarm's jobs left in ``squeue`` while it is parked (must be 0). The stub engine starts at
once, so what a restore saves here is what it does not do again: stage the weights (and on a GPU, the
engine's compile and download caches it finds in place); the scheduler's queue wait and the engine's
load are paid by both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _weights(folder: Path, mb: int) -> Path:
    """A model folder of ``mb`` MB (16 MB shards of random bytes: nothing compresses or dedups them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(max(1, mb // 16)):
        (folder / f"model-{i:05d}.safetensors").write_bytes(os.urandom(16 << 20))
    (folder / "config.json").write_text("{}")
    return folder


def _config(args: argparse.Namespace, name: str, model: Path, stage_to: Path) -> dict[str, Any]:
    from prefect_swarm.testing import free_port_block
    from prefect_swarm.testing.stub_engine import engine_command

    backend: dict[str, Any] = {"type": args.backend}
    if args.backend == "local":
        backend.update(health_interval_s=0.3, startup_grace_s=0.5)
    else:
        backend.update(cpus_per_replica=1, time_limit="30:00", queue_timeout_s=120, lb_port=free_port_block(1))
    return {
        "name": name,
        "model": str(model),
        "served_model_name": "stub-model",
        "replicas": args.replicas,
        "gpus_per_replica": 0 if args.backend == "local" else 1,
        "port": free_port_block(args.replicas),
        "ready_timeout_s": 300,
        "stage": {"to": str(stage_to)},
        "engine": {"kind": "command", "command": engine_command(), "python": sys.executable},
        "backend": backend,
    }


def _queued(name: str) -> int:
    out = subprocess.run(
        ["squeue", "-h", "-n", f"psw-{name}-replicas,psw-{name}-lb"], capture_output=True, text=True
    ).stdout
    return len([line for line in out.splitlines() if line.strip()])


def _round(args: argparse.Namespace, work: Path, i: int) -> dict[str, Any]:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.holding import Holding
    from prefect_swarm.state import StateStore, keep_lease
    from prefect_swarm.swarm import Swarm

    name = f"park-bench-{uuid.uuid4().hex[:6]}"
    cfg = SwarmConfig.model_validate(_config(args, name, work / "weights", work / f"node-{i}"))
    hold = Holding(StateStore())
    t0 = time.monotonic()
    hold.bring_up(Swarm(cfg, store=hold.store, keep=True), keep_lease(name), wait=True)
    cold = time.monotonic() - t0
    try:
        hold.park(name, "bench")
        queued = _queued(name) if args.backend == "slurm" else None
        t0 = time.monotonic()
        hold.restore(name)
        restore = time.monotonic() - t0
    finally:
        Swarm.from_state(name, hold.store).down()
    return {"cold_s": round(cold, 2), "restore_s": round(restore, 2), "queued_while_parked": queued}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("local", "slurm"), default="local")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--stage-mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="park-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        os.environ["PREFECT_SWARM_HOME"] = str(work / "home")
        _weights(work / "weights", args.stage_mb)
        rounds = []
        for i in range(args.repeat):
            rounds.append(_round(args, work, i))
            print(json.dumps({"round": i, **rounds[-1]}), flush=True)
    cold = statistics.median(r["cold_s"] for r in rounds)
    restore = statistics.median(r["restore_s"] for r in rounds)
    ratios = [r["restore_s"] / r["cold_s"] for r in rounds]
    summary = {
        "backend": args.backend,
        "replicas": args.replicas,
        "stage_mb": args.stage_mb,
        "cold_s_median": cold,
        "restore_s_median": restore,
        "restore_over_cold_median": round(statistics.median(ratios), 3),
        "per_round_ratios": [round(x, 3) for x in ratios],
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
