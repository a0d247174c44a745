"""What a capped swarm spends: token-priced caps (never passed) and GPU-hour caps (passed by the time
from the cap to the swarm's stop), measured the way the provider or the scheduler bills it.

    python bench/budget.py tokens [--backend external|local|slurm] [--rows 400] [--cap 0.5] [--max-tokens 0]
                                  [--only all|jobs|flows]
    python bench/budget.py gpu --backend local|slurm [--cap-gpu-s 24] [--repeat 1]

``tokens``: a swarm priced per token (the issue's case: 100 / 400 $ per 1M prompt / completion tokens, 600
requests a minute, ``max_cost_usd`` CAP, ROWS rows): an external swarm in front of the stub engine, or a
local or Slurm swarm of 2 stub replicas with the same prices; one job, two jobs at once, a detached job,
each on a swarm brought up afresh (a fresh account); then a ``batch_inference`` run and a one-stage
``pipeline`` whose stage has its own cap (its swarm's is twice it), each bringing its swarm up and down
itself, on Prefect's temporary server. The bill is the tokens the stub engines served (their
/stats), at the prices: it must stay at or under the cap. ``--max-tokens N`` sets the job's ``max_tokens`` (each
request is then reserved at N completion tokens, not the default 256: the job stops nearer the cap).

``gpu``: a swarm of 2 stub replicas holding 1 GPU each, ``max_gpu_hours`` = CAP_GPU_S GPU-seconds; three
cases: kept up with no job (its sidecar stops it: local watchdogs every 1 s, the Slurm LB job every 5 s),
a job waited on by `job submit` (the waiter stops it), a detached job (its processes stop issuing 5 s
before the cap; the sidecar stops the swarm). The overshoot is the GPU-seconds the swarm held past the
cap: local, each replica's engine process from its start to its exit (psutil); Slurm, sacct's elapsed x
GPUs of the swarm's jobs (what the cluster bills).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from prefect_swarm.paths import SwarmPaths

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "external"))

PRICES = {"input_usd_per_million": 100.0, "output_usd_per_million": 400.0}
KEY, KEY_ENV = "sk-bench-budget-0001", "BENCH_BUDGET_KEY"


def cli(home: Path, *args: str, wait: bool = True) -> Any:
    """``prefect-swarm ARGS`` with its own PREFECT_SWARM_HOME."""
    env = {**os.environ, "PREFECT_SWARM_HOME": str(home), "PREFECT_API_URL": "", KEY_ENV: KEY, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "prefect_swarm.cli.main", *args]
    if not wait:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------------------------------- tokens
def tokens(rows: int, cap: float, max_tokens: int, backend: str, only: str = "all") -> None:
    from external_kit import dataset

    from prefect_swarm.testing import free_port
    from prefect_swarm.testing.stub_engine import StubEngine

    kwargs = ["--job-kwargs", json.dumps({"sampling": {"max_tokens": max_tokens}})] if max_tokens else []
    print(f"token cap ${cap} on a {backend} swarm, {rows} rows, 600 requests/min, max_tokens {max_tokens or 'unset'}")
    print(f"{'case':<22} {'requests':>8} {'bill at exit':>13} {'of the cap':>10}")
    with tempfile.TemporaryDirectory() as tmp, StubEngine(free_port(), api_key=KEY, model="tiny") as stub:
        work = Path(tmp)
        spec = work / "limits.json"
        spec.write_text(json.dumps({"requests_per_minute": 600}))
        job_cases = (("one job", 1, False), ("two jobs at once", 2, False), ("detached job", 1, True))
        for case, jobs, detach in job_cases if only in ("all", "jobs") else ():
            home = work / case.replace(" ", "-")
            config, name, stats = _token_swarm(backend, stub, cap, work / case.replace(" ", "-"))
            assert cli(home, "up", "-c", str(config)).returncode == 0
            since = stats()
            procs = []
            for j in range(jobs):
                src = dataset(work / f"{case}-{j}.parquet".replace(" ", "-"), rows)
                out = str(src).replace(".parquet", "-out.parquet")
                args = ["job", "submit", "-n", name, "--input", str(src), "--output", out, "--id-column", "id"]
                args += ["--spec", str(spec), *kwargs, *(["--detach"] if detach else [])]
                procs.append(cli(home, *args, wait=False))
            said = [p.communicate()[0] for p in procs]
            if detach:
                _wait_detached(home, said[0].strip())
            sent, bill = _bill(since, stats())
            print(f"{case:<22} {sent:>8} {'$' + format(bill, '.4f'):>13} {bill / cap:>9.1%}")
            cli(home, "down", name, "-y", "--force")
        # a flow brings its swarm up (a fresh account) and down itself
        for case in ("flow run", "pipeline stage") if only in ("all", "flows") else ():
            home = work / case.replace(" ", "-")
            swarm_cap = cap if case == "flow run" else 2 * cap  # a stage's own cap below its swarm's: the stage's wins
            config, name, stats = _token_swarm(backend, stub, swarm_cap, home)
            src = dataset(work / f"{case}.parquet".replace(" ", "-"), rows)
            since = stats()
            said = _flow(home, case, config, src, cap, max_tokens)
            sent, bill = _bill(since, stats())
            print(f"{case:<22} {sent:>8} {'$' + format(bill, '.4f'):>13} {bill / cap:>9.1%}   {said}")
            cli(home, "down", name, "-y", "--force")


def _bill(since: dict[str, int], now: dict[str, int]) -> tuple[int, float]:
    """Requests the engines served between two /stats readings, and their bill at :data:`PRICES`."""
    pt = now["prompt_tokens"] - since.get("prompt_tokens", 0)
    ct = now["generation_tokens"] - since.get("generation_tokens", 0)
    bill = (PRICES["input_usd_per_million"] * pt + PRICES["output_usd_per_million"] * ct) / 1e6
    return now["requests"] - since.get("requests", 0), bill


FLOW = """
import json, sys
from prefect_swarm.flows import batch_inference, pipeline
case, config, src, cap, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
sampling = {"max_tokens": max_tokens} if max_tokens else {}
job = {"job": "chat", "id_column": "id", "requests_per_minute": 600,
       "job_kwargs": {"prompt_column": "prompt", "sampling": sampling}}
out = src.replace(".parquet", "-out.parquet")
if case == "flow run":
    state = batch_inference(config, job, src, out, return_state=True)
else:  # the stage's own cap (its swarm's is twice it)
    stage = {"name": "generate", "swarm": config, "job": job, "max_cost_usd": cap}
    state = pipeline([stage], src, out, return_state=True)
print(json.dumps((state.message or "").splitlines()[0]))
"""


def _flow(home: Path, case: str, config: Path, src: Path, cap: float, max_tokens: int) -> str:
    """A ``batch_inference`` run (or a one-stage pipeline) on Prefect's temporary server: its state message."""
    env = {**os.environ, "PREFECT_SWARM_HOME": str(home), "PREFECT_API_URL": "", KEY_ENV: KEY}
    env.pop("PREFECT_HOME", None)  # the run's own Prefect files go under its swarm home
    argv = [sys.executable, "-c", FLOW, case, str(config), str(src), str(cap), str(max_tokens)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or not out.stdout.strip():
        return out.stderr[-300:]
    return str(json.loads(out.stdout.strip().splitlines()[-1]))


def _token_swarm(backend: str, stub: Any, cap: float, work: Path) -> tuple[Path, str, Any]:
    """A swarm config priced per token with cap ``cap`` and a reader of its engines' summed /stats."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    cost = {**PRICES, "max_cost_usd": cap}
    if backend == "external":
        backend_cfg = {"type": "external", "url": stub.url + "/v1", "api_key_env": KEY_ENV, "cost": cost}
        data: dict[str, Any] = {"name": "ext", "model": "tiny", "backend": {**backend_cfg, "requests_per_minute": 600}}
        stats = stub.stats
    else:
        data = _swarm_config(backend, f"tok-{os.getpid()}", cost, work)

        run_dir = data["backend"].get("run_dir")
        key = SwarmPaths.of(str(data["name"]), run_dir).api_key_file if run_dir else None
        stats = _Sampler([int(data["port"]) + i for i in range(int(data["replicas"]))], key).last

    config = work / "swarm.yaml"
    config.write_text(yaml.safe_dump(data))
    return config, str(data["name"]), stats


class _Sampler:
    """The summed /stats of a swarm's stub replicas, read every 50 ms: the swarm goes down with its
    replicas when a waited-on job stops at the cap, so the last reading is kept (taken after the job's
    processes exited, before the replicas were stopped)."""

    def __init__(self, ports: list[int], key_file: Path | None) -> None:
        self.ports, self.key_file = ports, key_file
        self.per_port: dict[int, dict[str, int]] = {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        import httpx

        headers: dict[str, str] = {}
        while True:
            if self.key_file is not None and not headers and self.key_file.exists():
                headers["Authorization"] = f"Bearer {self.key_file.read_text().strip()}"  # the swarm's generated key
            for port in self.ports:
                with contextlib.suppress(httpx.HTTPError):  # not up yet, or stopped: its last reading stands
                    got = httpx.get(f"http://127.0.0.1:{port}/stats", headers=headers, timeout=2)
                    if got.status_code == 200:
                        self.per_port[port] = got.json()
            time.sleep(0.05)

    def last(self) -> dict[str, int]:
        time.sleep(0.2)
        out: dict[str, int] = {}
        for one in list(self.per_port.values()):
            for k, v in one.items():
                out[k] = out.get(k, 0) + int(v)
        return out


def _wait_detached(home: Path, job_id: str) -> None:
    while True:
        doc = json.loads(cli(home, "job", "status", job_id, "--refresh", "-o", "json").stdout)
        if doc["status"] not in ("RUNNING", "PENDING"):
            return
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------- gpu
class Held:
    """GPU-seconds the local replicas held: each engine process from its start to its exit."""

    def __init__(self, pids: list[int], gpus_each: int) -> None:
        import psutil

        self.start = {p: psutil.Process(p).create_time() for p in pids}
        self.end: dict[int, float] = {}
        self.gpus_each = gpus_each
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import psutil

        while len(self.end) < len(self.start):
            for pid in self.start:
                if pid not in self.end:
                    try:
                        gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                    except psutil.NoSuchProcess:
                        gone = True
                    if gone:
                        self.end[pid] = time.time()
            time.sleep(0.02)

    def seconds(self, timeout_s: float = 300) -> float:
        self.thread.join(timeout_s)
        return sum(self.end[p] - self.start[p] for p in self.start) * self.gpus_each


def gpu(backend: str, cap_gpu_s: float, repeat: int) -> None:
    print(f"GPU-hour cap of {cap_gpu_s:g} GPU-seconds, 2 replicas x 1 GPU, {backend}")
    print(f"{'case':<26} {'GPU-s held':>10} {'overshoot':>14}")
    for _ in range(repeat):
        for case in ("kept up, no job", "job waited on", "detached job"):
            with tempfile.TemporaryDirectory() as tmp:
                held = _gpu_case(backend, case, cap_gpu_s, Path(tmp))
            print(f"{case:<26} {held:>10.1f} {held - cap_gpu_s:>+8.1f} GPU-s")


def _gpu_case(backend: str, case: str, cap_gpu_s: float, work: Path) -> float:
    import yaml
    from _common import dataset

    config, name = work / "swarm.yaml", f"cap-{os.getpid()}"
    config.write_text(yaml.safe_dump(_swarm_config(backend, name, {"max_gpu_hours": cap_gpu_s / 3600}, work)))
    home = work / "home"
    up = cli(home, "up", "-c", str(config), "--keep", "-o", "json")
    assert up.returncode == 0, up.stderr
    replicas = json.loads(up.stdout)["status"]["replicas"]
    watch = Held([int(r["external_id"]) for r in replicas], 1) if backend == "local" else None
    src = dataset(work / "in.parquet", 200_000)
    job = ["job", "submit", "-n", name, "--input", str(src), "--output", str(work / "out.parquet"), "--id-column", "id"]
    job += ["--concurrency", "4"]
    if case == "job waited on":
        cli(home, *job)
    elif case == "detached job":
        cli(home, *job, "--detach")
    try:
        if watch is not None:
            return watch.seconds()
        return _slurm_held(home, name)
    finally:
        cli(home, "down", name, "-y", "--force")


def _swarm_config(backend: str, name: str, cost: dict[str, Any], work: Path) -> dict[str, Any]:
    """2 stub replicas x 1 GPU on ``backend`` (local or Slurm) with ``cost``."""
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    if backend == "local":
        data = stub_swarm_config(name, replicas=2, latency_ms=20, backend={"cost": cost})
        data["gpus_per_replica"] = 1
        return data
    sys.path.insert(0, str(ROOT / "tests" / "slurm"))
    from _slurmkit import stub_config

    return stub_config(name, replicas=2, backend={"cost": cost, "run_dir": str(work / "run")}).redacted()


def _slurm_held(home: Path, name: str) -> float:
    """The swarm's GPU-seconds once Slurm has ended its jobs: sacct's figure, what the cluster bills."""
    os.environ["PREFECT_SWARM_HOME"] = str(home)
    from prefect_swarm.holding import Holding

    names = f"psw-{name}-replicas,psw-{name}-lb"
    deadline = time.monotonic() + 300
    while subprocess.run(["squeue", "-h", "-n", names], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise TimeoutError("the swarm's Slurm jobs still run 300 s on")
        time.sleep(0.5)
    swarm = Holding().attach(name)
    assert swarm.handle is not None
    time.sleep(2)  # sacct's elapsed of a job that just ended settles within its accounting poll
    used = swarm.backends.serving.gpu_usage(swarm.handle)
    return float(used.gpu_hours or 0.0) * 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--rows", type=int, default=400)
    t.add_argument("--cap", type=float, default=0.5)
    t.add_argument("--max-tokens", type=int, default=0)
    t.add_argument("--backend", choices=("external", "local", "slurm"), default="external")
    t.add_argument("--only", choices=("all", "jobs", "flows"), default="all", help="jobs: the CLI's; flows: run, stage")
    g = sub.add_parser("gpu")
    g.add_argument("--backend", choices=("local", "slurm"), default="local")
    g.add_argument("--cap-gpu-s", type=float, default=24.0)
    g.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.what == "tokens":
        tokens(args.rows, args.cap, args.max_tokens, args.backend, args.only)
    else:
        gpu(args.backend, args.cap_gpu_s, args.repeat)


if __name__ == "__main__":
    main()
