"""The tail of a job: the last 5 % of rows' share of the request phase, copies off vs on (the default).

    python bench/tail.py [--profile slow-replica long-tail] [--replicas 4] [--rows 4000] [--repeat 2]

N simulated GPU replicas (``prefect_swarm.testing.gpu_sim``: 256 sequences batched, 32-token
answers, ``--speed 0.25``: a GPU four times slower than the simulator's default, so that N replicas
stay within what one client core drives) pinned to core 0; the job runner
(:class:`prefect_swarm.jobs.dispatch.runner.Runner`, the in-flight loop with defaults: the batch found from
the replicas' ``/metrics``) in this process, pinned to core 1. Profiles:

- ``slow-replica``: one of the N replicas three times slower than the others (``--speed`` / 3);
- ``long-tail``: every replica alike, 5 % of the answers 8 x as long (``--long-tail 0.05
  --long-tail-x 8``).

Side by side on the same replicas, alternating, ``--repeat`` times: the runner with
``hedge=False`` (no copies: the tail as it was) and with defaults (the tail kept full by copies, see
``Runner._steal``). Printed per run: the request phase (first request → last answer) and its rows/s,
the last 5 % of rows' share of it and their seconds, the copies sent and those that won; then the
medians. Every run checks that each row was reported exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import CLIENT_CPU, SERVER_CPU, wait_healthy  # noqa: E402

SIM = "prefect_swarm.testing.gpu_sim"
PROFILES: dict[str, dict[str, Any]] = {
    "slow-replica": {"slow_one": 3.0},
    "long-tail": {"args": ["--long-tail", "0.05", "--long-tail-x", "8"]},
}


def rows(n: int) -> Iterator[Any]:
    from prefect_swarm.jobs.dispatch.runner import Item

    for i in range(n):
        body = {"model": "stub-model", "messages": [{"role": "user", "content": f"question {i:08d} about a topic"}]}
        yield Item(i, str(i), "/v1/chat/completions", json.dumps(body).encode())


def start_sims(n: int, speed: float, profile: dict[str, Any]) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """N simulators on the server core; the last one slower by the profile's ``slow_one``."""

    from prefect_swarm.testing import free_port_block

    base = free_port_block(n)
    procs, urls = [], []
    for i in range(n):
        s = speed / profile["slow_one"] if i == n - 1 and "slow_one" in profile else speed
        argv = ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", SIM, "--port", str(base + i), "--speed", str(s)]
        procs.append(subprocess.Popen([*argv, *profile.get("args", [])], stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{base + i}")
    wait_healthy(urls)
    return procs, urls


def one(urls: list[str], n: int, hedge: bool) -> dict[str, Any]:
    """The runner over ``n`` rows; its tail."""
    from prefect_swarm.jobs.builtin import ChatCompletionJob
    from prefect_swarm.jobs.checkpoint.ledger import RowResult
    from prefect_swarm.jobs.dispatch.runner import Runner, RunnerConfig

    times: list[float] = []
    seen: list[int] = []

    def report(r: RowResult) -> None:
        times.append(time.monotonic())
        seen.append(r.row)

    runner = Runner(ChatCompletionJob(), urls, RunnerConfig(hedge=hedge), report)
    t0 = time.monotonic()
    assert asyncio.run(runner.run(rows(n)))
    assert sorted(seen) == list(range(n)), "a row reported twice or not at all"
    times.sort()
    phase, tail = times[-1] - t0, times[-1] - times[int(0.95 * n)]
    return {
        "hedge": hedge,
        "request_s": round(phase, 2),
        "rows_s": round(n / phase, 1),
        "last5_s": round(tail, 2),
        "last5_share": round(tail / phase, 3),
        "copies": runner.copies,
        "copies_won": runner.copies_won,
        "load_avg": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--speed", type=float, default=0.25)
    a = ap.parse_args()
    for name in a.profile:
        procs, urls = start_sims(a.replicas, a.speed, PROFILES[name])
        mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {CLIENT_CPU})
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        try:
            for rep in range(a.repeat):
                for hedge in (False, True) if rep % 2 == 0 else (True, False):
                    res = one(urls, a.rows, hedge)
                    runs[hedge].append(res)
                    print(json.dumps({"profile": name, "run": rep, **res}), flush=True)
        finally:
            os.sched_setaffinity(0, mask)
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
        med = {
            str(h): {k: statistics.median(r[k] for r in rs) for k in ("rows_s", "last5_s", "last5_share")}
            for h, rs in runs.items()
        }
        off, on = med["False"], med["True"]
        ratio = {"last5_share_on_off": round(on["last5_share"] / off["last5_share"], 2)}
        ratio["rows_s_on_off"] = round(on["rows_s"] / off["rows_s"], 3)
        print(json.dumps({"profile": name, "replicas": a.replicas, "median_of": a.repeat, **med, **ratio}), flush=True)


if __name__ == "__main__":
    main()
