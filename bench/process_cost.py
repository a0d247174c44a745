"""What our own processes cost before and while they work: the CPU of importing each entry point
(medians, beside a bare interpreter's start), and the idle CPU of a local swarm's watchdogs.

    python bench/process_cost.py [--repeat 7] [--idle-s 30] [--cpu 1]

Each start is pinned to one core (``taskset -c CPU`` when present). Every `prefect-swarm` call, job
process, watchdog, LB reconciler and stub engine pays its import once per start; a watchdog pays its
probes for the life of its replica.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ENTRY_POINTS = [
    "prefect_swarm.cli.main",
    "prefect_swarm.jobs.run",
    "prefect_swarm.sidecar.watchdog",
    "prefect_swarm.backends.slurm.lb",
    "prefect_swarm.backends.slurm.members",
    "prefect_swarm.sidecar.ports",
    "prefect_swarm.testing.stub_engine",
]
REPO = Path(__file__).resolve().parents[1]


def child_cpu(argv: list[str], env: dict[str, str] | None = None) -> float:
    """CPU seconds (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_costs(repeat: int, pin: list[str]) -> None:
    bare = statistics.median(child_cpu([*pin, sys.executable, "-c", "pass"]) for _ in range(repeat))
    print(f"{'entry point':40} {'import CPU s':>13} {'x bare start':>13}")
    print(f"{'(bare interpreter)':40} {bare:13.3f} {1:13.1f}")
    for module in ENTRY_POINTS:
        cost = statistics.median(child_cpu([*pin, sys.executable, "-c", f"import {module}"]) for _ in range(repeat))
        print(f"{module:40} {cost:13.3f} {cost / bare:13.1f}")


def process_cpu(procs: list[psutil.Process]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def idle_watchdogs(idle_s: float) -> None:
    """A local swarm of two stub engines: its watchdogs' CPU over ``idle_s`` seconds of nothing to do."""
    home = Path(tempfile.mkdtemp(prefix="psw-bench-"))
    env = {**os.environ, "PREFECT_SWARM_HOME": str(home)}
    cli = [sys.executable, "-m", "prefect_swarm.cli.main"]
    config = str(REPO / "examples" / "local-stub.yaml")
    try:
        subprocess.run([*cli, "up", "-c", config], env=env, check=True, capture_output=True, timeout=180)
        watchdogs = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "prefect_swarm.sidecar.watchdog" in (p.info["cmdline"] or [])
            and str(home) in " ".join(p.info["cmdline"])
        ]
        time.sleep(3)  # past the first healthy answers: the steady state
        before = process_cpu(watchdogs)
        time.sleep(idle_s)
        used = process_cpu(watchdogs) - before
        per = used / max(1, len(watchdogs))
        share = 100 * per / idle_s
        print(f"idle watchdogs: {len(watchdogs)}, {used:.2f} CPU-s in {idle_s:g} s: {share:.2f} % of a core each")
    finally:
        subprocess.run([*cli, "down", "local-stub", "-y"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--cpu", default="1", help="core the measured starts are pinned to")
    args = ap.parse_args()
    pin = ["taskset", "-c", args.cpu] if shutil.which("taskset") else []
    import_costs(args.repeat, pin)
    idle_watchdogs(args.idle_s)


if __name__ == "__main__":
    main()
