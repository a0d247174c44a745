"""Scaling with defaults: swarm rows/s ÷ (N x one replica driven alone), on the GPU-like simulator.

    python bench/scale.py [--replicas 1 2 4 8] [--rows 20000] [--rows-per-replica 6000]
        [--alone-rows 3000] [--repeat 3] [--speed 1.0] [--capacity 512] [--beside]
    python bench/scale.py --backend slurm [--slurm-replicas 4] [...]       # the single-node Slurm
    python bench/scale.py --flow [--flow-replicas 4] [...]                 # the batch_inference flow only
    python bench/scale.py --backend local slurm --flow [...]               # all of them, side by side

For each N, side by side in one run:

- **one alone**: one simulated replica (``prefect_swarm.testing.gpu_sim``, defaults: at most 256
  sequences, steps of 15 ms + 0.05 ms per sequence, 32-token answers) driven by a plain aiohttp
  loop with 272 requests in flight (its whole batch plus a queue): its best rows/s;
- **swarm with defaults**: ``prefect-swarm up`` of N such replicas on the local backend, then
  ``prefect-swarm job submit -n NAME --input IN --output OUT`` with no ``--concurrency`` and no
  ``--shards`` (the job sizes itself from the swarm), which waits for the job and commits it. The
  job has ``max(rows, N x rows_per_replica)`` rows, so every N runs for about as long.

- **plain N** (reference): the same plain loop driving N replicas at once (272 in flight to each):
  what this machine gives N simulated replicas, whatever the client.

Two ratios against N x one alone: the request phase (rows ÷ first shard's ledger opening → last
shard's final flush, from the shards' progress files) and the whole job (rows ÷ the submit
command's wall time: validation, shard processes, requests, commit). Goals: ≥ 0.9 and ≥ 0.8.
Replicas are pinned to core 0 and the client (driver, CLI and its job processes) to core 1 with
``taskset`` (the simulated replicas use timers, not CPU, so eight fit on one core). Every run uses
its own ``PREFECT_SWARM_HOME``. Prints one JSON line per run and the medians.

``--capacity C`` gives every simulated replica a batch of C sequences (``--max-num-seqs C``) that
the swarm's config does not declare (no ``engine.capacity``): the job finds it from the replicas'
``/metrics``; "one alone" and "plain N" then keep C + C/16 in flight per replica. Without it the
replicas batch 256 and the config declares it.

``--beside``: every measurement (one alone, plain N, the job) with a second job running beside it: a
job with defaults of ``--beside-rows`` rows on a one-replica swarm of its own (the same simulator, on
the replicas' core), its CLI and job process on the client core; cancelled at the end.

``--speed S`` passes ``--speed S`` to every simulated replica (its step times are divided by S): at
``--speed 0.25`` a replica is a GPU four times slower, with the same curve. On a 2-core machine the
client core, not the simulated GPUs, caps what N replicas can be given; a slower replica keeps
N x one alone within what the client core can drive, so the ratios measure the job engine, not the
machine (lower ``--rows-per-replica`` and ``--alone-rows`` by the same factor).

Modes (one row each per N, ``mode`` in the JSON; every row has its own "one alone" and "plain N"):

- ``--backend local`` (the default without ``--flow``): the swarm above, ``--replicas`` values of N.
- ``--backend slurm``: the same job with defaults on N simulated replicas on the single-node Slurm
  (``make slurm``), ``--slurm-replicas`` values of N (default 4; at most the node's GPUs: each
  replica asks for one, as the Slurm tests' swarms do). Slurm places the replicas, the LB and the
  shard steps (no ``taskset``: the job processes run as steps of the LB job, not under the CLI). The
  swarm is brought down at the end and its jobs are cancelled by name whatever happened.
- ``--flow``: the ``batch_inference`` flow with defaults (no ``concurrency``, no ``shards``) on N
  local simulated replicas, ``--flow-replicas`` values of N (default 4). The swarm is brought up
  first with ``prefect-swarm up`` and the flow shares it (what it does with a live swarm of the same
  name), so its time is submit → committed, as for ``job submit``. The flow runs in a process of
  its own on the client core against a throwaway Prefect server (``prefect_test_harness``, on the
  server core, started once, its start-up not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import CLIENT_CPU, SERVER_CPU, dataset, job_beside, wait_healthy  # noqa: E402

CLI = str(Path(sys.executable).with_name("prefect-swarm"))
SIM = "prefect_swarm.testing.gpu_sim"
ALONE_INFLIGHT = 272


async def drive(urls: list[str], n: int, c: int) -> float:
    """``n`` chat requests, ``c`` in flight to each of ``urls`` (the dataset's prompts, no max_tokens); rows/s."""
    import aiohttp

    rows = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker(url: str) -> None:
            for i in rows:
                content = f"question {i:08d} about a topic"
                body = {"model": "stub-model", "messages": [{"role": "user", "content": content}]}
                for _ in range(5):  # a loaded machine drops a connection now and then: ask again
                    try:
                        async with session.post(url + "/v1/chat/completions", json=body) as resp:
                            resp.raise_for_status()
                            await resp.read()
                        break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.1)

        t0 = time.monotonic()
        await asyncio.gather(*(worker(url) for url in urls for _ in range(c)))
        return n / (time.monotonic() - t0)


CAPACITY: int | None = None
"""``--capacity``: every replica's batch, not declared to the job (None: 256, declared)."""


def inflight() -> int:
    """What the plain loop keeps in flight to one replica: its whole batch plus a queue."""
    return ALONE_INFLIGHT if CAPACITY is None else CAPACITY + max(8, CAPACITY // 16)


def sim_args(speed: float) -> list[str]:
    """The simulator's options of every replica in one run (the same in both drives)."""
    return ["--speed", str(speed), *(["--max-num-seqs", str(CAPACITY)] if CAPACITY else [])]


def plain_loop(replicas: int, n: int, env: dict[str, str], speed: float) -> float:
    """``replicas`` simulated replicas on the server core, driven from the client core by a plain loop
    with :func:`inflight` to each (one replica: "one alone"; N: what this machine gives N replicas)."""
    from prefect_swarm.testing import free_port_block

    base = free_port_block(replicas)
    sims = [
        subprocess.Popen(
            ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", SIM, "--port", str(base + i), *sim_args(speed)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for i in range(replicas)
    ]
    try:
        wait_healthy([f"http://127.0.0.1:{base + i}" for i in range(replicas)])
        urls = ",".join(f"http://127.0.0.1:{base + i}" for i in range(replicas))
        out = subprocess.run(
            ["taskset", "-c", str(CLIENT_CPU), sys.executable, __file__, "--drive", urls, str(n), str(inflight())],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode:
            raise RuntimeError(f"the plain loop failed: {out.stderr[-2000:]}")
        return float(out.stdout.strip())
    finally:
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.wait()


def swarm_config(name: str, replicas: int, port: int, speed: float) -> dict[str, Any]:
    """N simulated replicas on the local backend, pinned to the server core."""
    command = ["taskset", "-c", str(SERVER_CPU), "{python}", "-m", SIM]
    command += ["--host", "{host}", "--port", "{port}", "--model", "{served_model_name}", *sim_args(speed)]
    engine: dict[str, Any] = {"kind": "command", "command": command, "startup_timeout_s": 60}
    if CAPACITY is None:
        engine["capacity"] = 256
    return {
        "name": name,
        "model": "stub-model",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": port,
        "ready_timeout_s": 60,
        "engine": engine,
        "backend": {"type": "local"},
    }


def slurm_config(name: str, replicas: int, speed: float) -> tuple[Any, dict[str, Any]]:
    """N simulated replicas on the single-node Slurm: the Slurm tests' stub swarm (one CPU and one GPU
    per replica, an LB job, a generated API key) running the simulator; (SwarmConfig, its YAML data)."""
    kit = str(ROOT / "tests" / "slurm")
    if kit not in sys.path:
        sys.path.insert(0, kit)
    from _slurmkit import stub_config

    from prefect_swarm.testing.stub_engine import engine_command

    engine: dict[str, Any] = {"command": [*engine_command(module=SIM), *sim_args(speed)], "startup_timeout_s": 60}
    if CAPACITY is None:
        engine["capacity"] = 256
    cfg = stub_config(name, replicas=replicas, engine=engine, backend={"queue_timeout_s": 600})
    return cfg, cfg.redacted()


def sweep_slurm(cfg: Any) -> str:
    """Cancel whatever Slurm job of swarm ``cfg`` is still queued (replicas, LB, shard jobs); return
    the squeue lines of those left (empty when none)."""
    from prefect_swarm.backends.slurm.render import job_names

    names = job_names(cfg)
    listed = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, check=False).stdout

    def ours(line: str) -> bool:
        job = line.split(maxsplit=1)[-1]
        return job in names.all() or job.startswith(names.shard_prefix)

    ids = [line.split()[0] for line in listed.splitlines() if line.strip() and ours(line)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)
    deadline = time.monotonic() + 60
    while True:
        listed = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, check=False).stdout
        left = "\n".join(line for line in listed.splitlines() if line.strip() and ours(line))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def cli(*args: str, env: dict[str, str], cpu: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [CLI, *args]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)


FLOW_JOB = """
import json, sys, time
from prefect_swarm.flows import batch_inference

t0 = time.monotonic()
res = batch_inference(sys.argv[1], "chat", sys.argv[2], sys.argv[3])
print(json.dumps({"flow_s": time.monotonic() - t0, "rows": res["rows"], "ok": res["ok"]}))
"""
"""The flow with defaults on the swarm config at argv[1] (a YAML path), input argv[2], output argv[3]."""


def submit(mode: str, cfg: Path, name: str, src: Path, out: Path, env: dict[str, str]) -> float:
    """Submit the job with defaults and wait for it to be committed; its wall seconds. ``job submit``
    (local and Slurm), or the ``batch_inference`` flow (``flow``, sharing the swarm that is up)."""
    if mode != "flow":
        t0 = time.monotonic()
        cpu = CLIENT_CPU if mode == "local" else None  # on Slurm the shards are job steps: Slurm places them
        sub = cli("job", "submit", "-n", name, "--input", str(src), "--output", str(out), env=env, cpu=cpu)
        assert sub.returncode == 0, sub.stderr[-3000:]
        return time.monotonic() - t0
    argv = ["taskset", "-c", str(CLIENT_CPU), sys.executable, "-c", FLOW_JOB, str(cfg), str(src), str(out)]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    for line in run.stderr.splitlines():  # which swarm the flow used: the one up (shared) or its own
        if "Brought up swarm" in line or "sharing it" in line:
            print(f"flow: {line.strip()}", file=sys.stderr)
    res = json.loads(run.stdout.strip().splitlines()[-1])
    assert res["ok"] == res["rows"], res
    return float(res["flow_s"])  # the flow call itself, not the process's start and its imports


def swarm_run(
    mode: str, tmp: Path, src: Path, rows: int, replicas: int, env: dict[str, str], speed: float
) -> dict[str, Any]:
    """Up, the job with defaults (timed), read the shards' progress, down (and on Slurm: nothing left queued)."""
    import yaml

    from prefect_swarm.testing import free_port_block

    name = f"scale-{mode}-{replicas}-{os.getpid()}"
    slurm = None
    if mode == "slurm":
        slurm, data = slurm_config(name, replicas, speed)
    else:
        data = swarm_config(name, replicas, free_port_block(replicas), speed)
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    try:
        up = cli("up", "-c", str(cfg), env=env)
        assert up.returncode == 0, up.stderr[-2000:]
        whole_s = submit(mode, cfg, name, src, tmp / f"{name}-out.parquet", env)
        progress = [json.loads(p.read_text()) for p in Path(env["PREFECT_SWARM_HOME"]).rglob("shards/*/progress.json")]
        progress = [p for p in progress if p.get("state") == "done"]
        assert sum(int(p["done"]) for p in progress) == rows, progress
        request_s = max(p["updated_at"] for p in progress) - min(p["started_at"] for p in progress)
        return {"shards": len(progress), "whole_s": whole_s, "request_s": request_s}
    finally:
        down = cli("down", name, "--yes", "--force", env=env)
        left = sweep_slurm(slurm) if slurm is not None else ""
        assert down.returncode == 0, down.stderr[-2000:]
        assert not left, f"Slurm jobs of {name} still queued:\n{left}"


def measure(mode: str, n: int, rep: int, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One row: one alone, plain N and the swarm job of ``mode`` with defaults on N replicas."""
    rows = max(a.rows, n * a.rows_per_replica)
    src = dataset(tmp / f"in-{rows}.parquet", rows)
    home = tmp / f"home-{mode}-{rep}-{n}"
    env = {**os.environ, "PREFECT_SWARM_HOME": str(home)}
    alone = plain_loop(1, a.alone_rows, env, a.speed)
    plain = plain_loop(n, n * a.alone_rows, env, a.speed) if n > 1 else alone
    run = swarm_run(mode, tmp, src, rows, n, env, a.speed)
    return {
        "mode": mode,
        "replicas": n,
        "speed": a.speed,
        "capacity": CAPACITY,
        "run": rep,
        "rows": rows,
        "one_alone_rows_s": round(alone, 1),
        "shards": run["shards"],
        "request_rows_s": round(rows / run["request_s"], 1),
        "whole_rows_s": round(rows / run["whole_s"], 1),
        "plain_n_rows_s": round(plain, 1),
        "plain_n_ratio": round(plain / (n * alone), 3),
        "request_ratio": round(rows / run["request_s"] / (n * alone), 3),
        "whole_ratio": round(rows / run["whole_s"] / (n * alone), 3),
        "load_avg": round(os.getloadavg()[0], 1),
        "beside": a.beside,
    }


@contextlib.contextmanager
def prefect_api(wanted: bool) -> Iterator[None]:
    """With ``wanted``: a throwaway Prefect server (``prefect_test_harness``) started on the server core,
    its URL in ``PREFECT_API_URL`` for the flow processes; else nothing."""
    if not wanted:
        yield
        return
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # its heartbeat races the test DB
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {SERVER_CPU})  # the server process is started now and keeps this core
    try:
        harness = prefect_test_harness(server_startup_timeout=180)
        harness.__enter__()
    finally:
        os.sched_setaffinity(0, mask)
    try:
        os.environ["PREFECT_API_URL"] = str(PREFECT_API_URL.value())
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        harness.__exit__(None, None, None)


@contextlib.contextmanager
def beside(a: argparse.Namespace, tmp: Path) -> Iterator[None]:
    """With ``--beside``: a second job with defaults (``--beside-rows`` rows, on a one-replica swarm of its
    own, the same simulator) running on the client core through every measurement; else nothing."""
    if not a.beside:
        yield
        return
    from prefect_swarm.testing import free_port_block

    name = f"beside-{os.getpid()}"
    env = {**os.environ, "PREFECT_SWARM_HOME": str(tmp / "home-beside")}
    with job_beside(cli, name, swarm_config(name, 1, free_port_block(1), a.speed), a.beside_rows, tmp, env):
        yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8], help="N of the local backend")
    ap.add_argument(
        "--backend",
        nargs="+",
        choices=["local", "slurm"],
        default=None,
        help="the `job submit` swarms to measure; default: local, or none with --flow",
    )
    ap.add_argument("--slurm-replicas", type=int, nargs="+", default=[4], help="N on the single-node Slurm")
    ap.add_argument("--flow", action="store_true", help="also the batch_inference flow with defaults")
    ap.add_argument("--flow-replicas", type=int, nargs="+", default=[4], help="N of the flow (local backend)")
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the swarm job (20k+ for the whole-job goal)")
    ap.add_argument("--rows-per-replica", type=int, default=6000, help="... at least this many per replica")
    ap.add_argument("--alone-rows", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--speed", type=float, default=1.0, help="the simulator's --speed (step times divided by it)")
    ap.add_argument("--capacity", type=int, default=None, help="every replica's batch, not declared to the job")
    ap.add_argument("--beside", action="store_true", help="with a second job running beside every measurement")
    ap.add_argument("--beside-rows", type=int, default=2_000_000, help="rows of the job beside (it is cancelled)")
    ap.add_argument("--drive", nargs=3, metavar=("URL", "N", "C"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drive:
        print(asyncio.run(drive(a.drive[0].split(","), int(a.drive[1]), int(a.drive[2]))))
        return
    global CAPACITY
    CAPACITY = a.capacity
    backends = a.backend if a.backend is not None else ([] if a.flow else ["local"])
    modes = [(m, n) for m in backends for n in (a.replicas if m == "local" else a.slurm_replicas)]
    modes += [("flow", n) for n in a.flow_replicas] if a.flow else []
    results: dict[tuple[str, int], list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d, prefect_api(a.flow), beside(a, Path(d)):
        for rep in range(a.repeat):
            for mode, n in modes:
                res = measure(mode, n, rep, a, Path(d))
                results[mode, n].append(res)
                print(json.dumps(res), flush=True)
    for (mode, n), runs in results.items():
        keys = ("one_alone_rows_s", "plain_n_ratio", "request_ratio", "whole_ratio")
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(json.dumps({"mode": mode, "replicas": n, "median_of": len(runs), **med}))


if __name__ == "__main__":
    main()
