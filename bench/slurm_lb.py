"""Rows/s through the Slurm swarm's nginx LB / rows/s spread directly over its replicas (goal >= 0.9).

    python bench/slurm_lb.py [--replicas 4] [--concurrency 64] [--seconds 8] [--repeat 3]
                             [--latency-ms 0 20] [--nginx-workers N] [--no-pin]

Brings up a real Slurm swarm of stub engines (scripts/slurm/ci-up.sh first), runs a closed-loop
aiohttp client (``concurrency`` requests always in flight, one chat completion per row) for
``seconds`` against (a) the LB URL and (b) the replica URLs directly, round robin, then tears the
swarm down. Prints one Markdown table row per latency setting: medians over ``repeat`` rounds.

Fair on a small machine: the client runs alone on ``--client-core`` (default 1); every process of
the swarm -- the stubs, their watchdogs, nginx and the reconciler -- is pinned to ``--server-core``
(default 0), for BOTH measurements (in the direct one nginx is merely idle). Each round runs the
two sides in alternating order (LB first in even rounds, direct first in odd ones), each after a
1 s warm-up, so drift of the machine's load hits both alike. The rendered nginx.conf is checked for
the proxy settings that matter here (access_log off, HTTP/1.1 with keep-alive to the upstreams).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psutil

BENCH_KEY = "bench-lb-key"
"""The swarm's API key: a Slurm swarm without one gets a generated key that every request must carry."""


async def closed_loop(urls: list[str], concurrency: int, seconds: float, model: str) -> tuple[float, int]:
    """Rows/s and errors of ``concurrency`` workers posting chat completions for ``seconds``."""
    cycle = itertools.cycle(urls)
    done = errors = 0
    stop = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    auth = {"Authorization": f"Bearer {BENCH_KEY}"}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, headers=auth) as session:

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


def measure(urls: list[str], concurrency: int, seconds: float, model: str) -> tuple[float, int]:
    """1 s warm-up (connections opened, caches warm), then the measured closed loop."""
    asyncio.run(closed_loop(urls, concurrency, 1.0, model))
    return asyncio.run(closed_loop(urls, concurrency, seconds, model))


NGINX_MUST = {
    "access_log off": r"^\s*access_log off;",
    "proxy_http_version 1.1": r"^\s*proxy_http_version 1\.1;",
    'Connection ""': r'^\s*proxy_set_header Connection "";',
    "upstream keepalive": r"^\s*keepalive \d+;",
}


def check_nginx_conf(text: str) -> str:
    """Fail unless the rendered nginx.conf has every setting of NGINX_MUST; return its worker_processes."""
    missing = [what for what, pattern in NGINX_MUST.items() if not re.search(pattern, text, re.M)]
    if missing:
        raise SystemExit(f"rendered nginx.conf lacks {', '.join(missing)}")
    found = re.search(r"^\s*worker_processes (\S+);", text, re.M)
    return found.group(1) if found else "?"


def swarm_pids(swarm_dir: Path, ports: set[int]) -> list[int]:
    """Every process of the swarm: stubs (by --port), watchdogs, nginx and reconciler (by swarm folder)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        if argv[:1] and Path(argv[0]).name in ("bash", "sh", "srun", "slurmstepd"):
            continue  # the job scripts themselves only wait
        by_port = any(a == "--port" and b.isdigit() and int(b) in ports for a, b in itertools.pairwise(argv))
        if by_port or any(str(swarm_dir) in a for a in argv):
            found.append(int(proc.info["pid"]))
            # nginx's workers ("nginx: worker process") name no folder: take the children too
            found += [c.pid for c in proc.children(recursive=True)]
    return sorted(set(found))


def pin(pids: list[int], core: int) -> int:
    """Pin every thread of ``pids`` to ``core``; return how many threads were pinned."""
    n = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {core})
                n += 1
            except OSError:
                continue
    return n


def swarm_config(replicas: int, latency_ms: float) -> Any:
    """A Slurm swarm of ``replicas`` stub engines, one CPU each."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.testing import free_port_block
    from prefect_swarm.testing.stub_engine import engine_command

    command = engine_command(latency_ms=latency_ms)
    return SwarmConfig.model_validate(
        {
            "name": f"bench-{uuid.uuid4().hex[:6]}",
            "model": "stub-model",
            "api_key": BENCH_KEY,
            "replicas": replicas,
            "gpus_per_replica": 0,
            "port": free_port_block(replicas),
            "engine": {"kind": "command", "command": command},
            "backend": {"type": "slurm", "cpus_per_replica": 1, "lb_port": free_port_block(1), "time_limit": "20:00"},
        }
    )


def run(args: argparse.Namespace, latency_ms: float) -> dict[str, Any]:
    """One swarm, ``args.repeat`` rounds of both measurements; medians."""
    from prefect_swarm.backends.slurm.serving import SlurmServing
    from prefect_swarm.paths import SwarmPaths

    cfg = swarm_config(args.replicas, latency_ms)
    serving = SlurmServing(cfg, SwarmPaths.for_swarm(cfg.name))
    workers = check_nginx_conf(serving.plan()["nginx.conf"])
    handle = serving.create_or_update(cfg)
    lbs, directs, ratios, errors = [], [], [], 0
    try:
        st = serving.wait_ready(handle, 180)
        direct = [r.url for r in st.replicas if r.url]
        assert st.url and len(direct) == args.replicas, st
        if args.pin:
            ports = {cfg.port + i for i in range(cfg.replicas)}
            pids = swarm_pids(serving.paths.root, ports)
            threads = pin(pids, args.server_core)
            print(
                f"  pinned {len(pids)} swarm processes ({threads} threads) to core {args.server_core}",
                file=sys.stderr,
            )
        for r in range(args.repeat):
            sides = [("lb", [st.url]), ("direct", direct)]
            got: dict[str, float] = {}
            for side, urls in sides if r % 2 == 0 else sides[::-1]:
                got[side], err = measure(urls, args.concurrency, args.seconds, cfg.model_name)
                errors += err
            if not got["lb"] or not got["direct"]:
                raise SystemExit(
                    f"no request answered (LB {got['lb']:.0f} rows/s, direct {got['direct']:.0f}; {errors} errors)"
                )
            lbs.append(got["lb"])
            directs.append(got["direct"])
            ratios.append(got["lb"] / got["direct"])
            print(
                f"  {latency_ms:g} ms round {r + 1}: LB {got['lb']:.0f}, direct {got['direct']:.0f}, "
                f"ratio {ratios[-1]:.3f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        serving.delete(handle)
    return {
        "latency_ms": latency_ms,
        "lb": statistics.median(lbs),
        "direct": statistics.median(directs),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "errors": errors,
        "workers": workers,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="leave the scheduler to place everything")
    ap.add_argument("--nginx-workers", type=int, default=None, help="override nginx worker_processes (experiments)")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SWARM_HOME", tempfile.mkdtemp(prefix="psw-bench-"))
    if args.nginx_workers is not None:
        from prefect_swarm.backends.slurm import render

        render.NGINX_WORKERS = args.nginx_workers
    if args.pin:
        os.sched_setaffinity(0, {args.client_core})
    print(
        f"| stub latency | concurrency | nginx workers | LB rows/s | direct rows/s ({args.replicas} reps) "
        f"| ratio (median of {args.repeat}) | ratios | errors |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for latency in args.latency_ms:
        r = run(args, latency)
        print(
            f"| {latency:g} ms | {args.concurrency} | {r['workers']} | {r['lb']:.0f} | {r['direct']:.0f} "
            f"| {r['ratio']:.2f} | {' '.join(f'{x:.2f}' for x in r['ratios'])} | {r['errors']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
