"""Rows/s through the Slurm swarm's nginx LB / rows/s spread directly over its replicas (goal >= 0.9).

    python bench/slurm_lb.py [--replicas 4] [--concurrency 64] [--seconds 10] [--latency-ms 0 20]

Brings up a real Slurm swarm of stub engines (scripts/slurm/ci-up.sh first), runs a closed-loop
aiohttp client (``concurrency`` requests always in flight, one chat completion per row) for
``seconds`` against (a) the LB URL and (b) the replica URLs directly, round robin, then tears the
swarm down. Prints one Markdown table row per latency setting.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
import uuid

import aiohttp


async def closed_loop(urls: list[str], concurrency: int, seconds: float, model: str) -> tuple[float, int]:
    """Rows/s and errors of ``concurrency`` workers posting chat completions for ``seconds``."""
    cycle = itertools.cycle(urls)
    done = errors = 0
    stop = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker(w: int) -> None:
            nonlocal done, errors
            i = 0
            while time.monotonic() < stop:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"row {w}-{i}"}],
                    "max_tokens": 8,
                }
                i += 1
                try:
                    async with session.post(next(cycle) + "/v1/chat/completions", json=body) as resp:
                        await resp.read()
                        if resp.status == 200:
                            done += 1
                        else:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done / (time.monotonic() - t0), errors


def run(replicas: int, concurrency: int, seconds: float, latency_ms: float) -> dict[str, float]:
    """One swarm, both measurements (each after a short warm-up)."""
    from prefect_swarm.backends.serving.slurm import SlurmServing
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths
    from prefect_swarm.testing.services import free_port_block

    cfg = SwarmConfig.model_validate(
        {
            "name": f"bench-{uuid.uuid4().hex[:6]}",
            "model": "stub-model",
            "replicas": replicas,
            "gpus_per_replica": 1,
            "port": free_port_block(replicas),
            "engine": {
                "kind": "command",
                "command": [
                    "{python}",
                    "-m",
                    "prefect_swarm.testing.stub_engine",
                    "--host",
                    "{host}",
                    "--port",
                    "{port}",
                    "--model",
                    "{served_model_name}",
                    "--latency-ms",
                    str(latency_ms),
                ],
            },
            "backend": {
                "type": "slurm",
                "cpus_per_replica": 1,
                "lb_port": free_port_block(1),
                "time_limit": "20:00",
            },
        }
    )
    serving = SlurmServing(cfg, SwarmPaths.for_swarm(cfg.name))
    handle = serving.create_or_update(cfg)
    try:
        st = serving.wait_ready(handle, 120)
        direct = [r.url for r in st.replicas if r.url]
        assert st.url and len(direct) == replicas, st
        asyncio.run(closed_loop([st.url], concurrency, 1.0, cfg.model_name))
        lb, lb_err = asyncio.run(closed_loop([st.url], concurrency, seconds, cfg.model_name))
        asyncio.run(closed_loop(direct, concurrency, 1.0, cfg.model_name))
        dr, dr_err = asyncio.run(closed_loop(direct, concurrency, seconds, cfg.model_name))
    finally:
        serving.delete(handle)
    return {"latency_ms": latency_ms, "lb": lb, "direct": dr, "ratio": lb / dr, "errors": lb_err + dr_err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SWARM_HOME", tempfile.mkdtemp(prefix="psw-bench-"))
    print(
        f"| stub latency | concurrency | LB rows/s | direct rows/s ({args.replicas} reps) | ratio | errors |"
    )
    print("|---|---|---|---|---|---|")
    for latency in args.latency_ms:
        r = run(args.replicas, args.concurrency, args.seconds, latency)
        print(
            f"| {latency:g} ms | {args.concurrency} | {r['lb']:.0f} | {r['direct']:.0f} | {r['ratio']:.2f} "
            f"| {r['errors']:.0f} |",
            flush=True,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
