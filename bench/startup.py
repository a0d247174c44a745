"""Start and end of a job: `job submit` → the engine's first request, and its last answer → the command's exit.

    python bench/startup.py [--repeat 5] [--rows 2000] [--shards 1] [--beside]

A swarm of one simulated replica (``prefect_swarm.testing.gpu_sim``, its batch not declared) is
brought up on the local backend; then, ``--repeat`` times, ``prefect-swarm job submit -n NAME
--input IN --output OUT`` with defaults (plus ``--shards`` when given) runs a small job to the end
(committed). A thread of this script polls the replica's ``/stats`` every 5 ms: the first poll
that sees a new request dates the job's first request, the first that sees every row answered
dates its last answer. Printed per run and as medians:

- ``first_request_s``: the submit command's start → the replica's first request of the job
  (imports, validation, sizing, fingerprint, the shard processes' start, readiness probes);
- ``request_s``: first request → last answer;
- ``end_s``: last answer → the submit command's exit (the shards' last flush, their exit, the
  commit, the command noticing).

``--beside``: the same, with a second job running beside each (on a second swarm of its own, its
own replica, started before and cancelled after): a busy submit host. The replicas run on core 0,
the commands (and the job processes they start) on core 1, as in ``bench/scale.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import CLIENT_CPU, SERVER_CPU, dataset, job_beside  # noqa: E402

CLI = str(Path(sys.executable).with_name("prefect-swarm"))
SIM = "prefect_swarm.testing.gpu_sim"


def swarm_config(name: str, port: int) -> dict[str, Any]:
    """One simulated replica on the local backend, pinned to the server core, its batch not declared."""
    command = ["taskset", "-c", str(SERVER_CPU), "{python}", "-m", SIM]
    command += ["--host", "{host}", "--port", "{port}", "--model", "{served_model_name}"]
    return {
        "name": name,
        "model": "stub-model",
        "replicas": 1,
        "gpus_per_replica": 0,
        "port": port,
        "ready_timeout_s": 60,
        "engine": {"kind": "command", "command": command, "startup_timeout_s": 60},
        "backend": {"type": "local"},
    }


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = ["taskset", "-c", str(CLIENT_CPU), CLI, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)


class Watch(threading.Thread):
    """Poll a replica's /stats; date the first new request and the answer that makes ``rows`` ok."""

    def __init__(self, url: str, rows: int) -> None:
        import httpx

        super().__init__(daemon=True)
        self.client = httpx.Client(timeout=2)
        self.url, self.rows = url, rows
        base = self.client.get(url + "/stats").json()
        self.requests0, self.ok0 = base.get("requests", 0), base.get("ok", 0)
        self.first: float | None = None
        self.last: float | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set() and self.last is None:
            try:
                stats = self.client.get(self.url + "/stats").json()
            except Exception:
                continue
            now = time.time()
            if self.first is None and stats.get("requests", 0) > self.requests0:
                self.first = now
            if stats.get("ok", 0) - self.ok0 >= self.rows:
                self.last = now
            time.sleep(0.005)


def up(name: str, tmp: Path, env: dict[str, str]) -> str:
    """Bring up swarm ``name``; its replica's URL."""
    import yaml

    from prefect_swarm.testing import free_port

    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(swarm_config(name, port)))
    res = cli("up", "-c", str(cfg), env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return f"http://127.0.0.1:{port}"


def one(
    name: str, url: str, src: Path, out: Path, rows: int, shards: int | None, env: dict[str, str]
) -> dict[str, Any]:
    """One job of ``rows`` rows with defaults, submit to exit; its three times."""
    watch = Watch(url, rows)
    watch.start()
    extra = ["--shards", str(shards)] if shards else []
    t0 = time.time()
    res = cli("job", "submit", "-n", name, "--input", str(src), "--output", str(out), *extra, env=env)
    t1 = time.time()
    watch.halt.set()
    watch.join()
    assert res.returncode == 0, res.stderr[-3000:]
    assert watch.first is not None and watch.last is not None, "the replica did not see the job"
    return {
        "first_request_s": round(watch.first - t0, 3),
        "request_s": round(watch.last - watch.first, 3),
        "end_s": round(t1 - watch.last, 3),
        "load_avg": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=None, help="--shards of the job (default: sized)")
    ap.add_argument("--beside", action="store_true", help="with a second job running beside each")
    ap.add_argument("--beside-rows", type=int, default=2_000_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as d:
        tmp = Path(d)
        env = {**os.environ, "PREFECT_SWARM_HOME": str(tmp / "home")}
        name, other = f"startup-{os.getpid()}", f"beside-{os.getpid()}"
        src = dataset(tmp / "in.parquet", a.rows)
        url = up(name, tmp, env)
        try:
            beside: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
            if a.beside:
                from prefect_swarm.testing import free_port

                beside = job_beside(cli, other, swarm_config(other, free_port()), a.beside_rows, tmp, env)
            with beside:
                runs = []
                for rep in range(a.repeat):
                    res = one(name, url, src, tmp / f"out-{rep}.parquet", a.rows, a.shards, env)
                    res.update(run=rep, rows=a.rows, beside=a.beside)
                    runs.append(res)
                    print(json.dumps(res), flush=True)
            keys = ("first_request_s", "request_s", "end_s")
            med = {k: statistics.median(r[k] for r in runs) for k in keys}
            print(json.dumps({"median_of": len(runs), "beside": a.beside, **med}))
        finally:
            cli("down", name, "--yes", "--force", env=env)


if __name__ == "__main__":
    main()
