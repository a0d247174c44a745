"""Requests resent after SIGKILLs: a job killed (kill -9) at random moments, then run to its end.

    python bench/bench_sigkill.py [--rows 20000] [--kills 10] [--concurrency 8]
                                  [--checkpoint-every 500] [--checkpoint-seconds 1] [--latency-ms 10]

Each run of the job process is killed 0.2-2 s after its first request; after ``--kills`` kills
one last run finishes the job. Per killed run it counts
the requests the stub received and the rows that run left in the ledger; the difference is what
a rerun sends again. The bound per kill is what a kill can lose: the requests in flight
(concurrency) plus the rows answered but not yet on disk — those since the last checkpoint (at
most ``checkpoint_every``, and at most ``checkpoint_seconds`` plus one tick of answers) and the
parts handed to the writer thread but not yet written (``MAX_PENDING_WRITES`` + 1). Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from _common import dataset, job_argv, spec_file

from prefect_swarm.jobs.checkpoint.ledger import MAX_PENDING_WRITES
from prefect_swarm.paths import JobPaths
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine


def ledger_rows(job: Path) -> int:
    """Distinct rows in shard 0's ledger."""
    parts = JobPaths(job).shard(0).parts()
    return len({r for p in parts for r in pq.read_table(p, columns=["_row"]).column("_row").to_pylist()})


def main() -> None:
    """Kill, count, finish; print the figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=500)
    ap.add_argument("--checkpoint-seconds", type=float, default=1.0)
    ap.add_argument("--latency-ms", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as d, StubEngine(free_port(), latency_ms=a.latency_ms) as stub:
        tmp = Path(d)
        src = dataset(tmp / "in.parquet", a.rows)
        job = tmp / "job"
        spec = spec_file(
            job,
            src,
            stub.url,
            concurrency=a.concurrency,
            checkpoint_every=a.checkpoint_every,
            checkpoint_seconds=a.checkpoint_seconds,
        )
        start = int(stub.stats().get("requests", 0))
        per_kill, rates = [], []
        for _ in range(a.kills):
            before_req, before_rows = int(stub.stats().get("requests", 0)), ledger_rows(job)
            proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
            while int(stub.stats().get("requests", 0)) == before_req and proc.poll() is None:
                time.sleep(0.01)  # start-up (imports, validation) is not what is measured
            t0 = time.monotonic()
            time.sleep(rng.uniform(0.2, 2.0))
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            sent = int(stub.stats().get("requests", 0)) - before_req
            kept = ledger_rows(job) - before_rows
            per_kill.append(sent - kept)
            rates.append(sent / (time.monotonic() - t0))
        proc = subprocess.run(job_argv(spec), stderr=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.returncode
        total = int(stub.stats().get("requests", 0)) - start
        assert ledger_rows(job) == a.rows
    resent = total - a.rows
    bound = a.concurrency + a.checkpoint_every * (MAX_PENDING_WRITES + 2)
    print(
        json.dumps(
            {
                "rows": a.rows,
                "kills": len(per_kill),
                "concurrency": a.concurrency,
                "checkpoint_every": a.checkpoint_every,
                "checkpoint_seconds": a.checkpoint_seconds,
                "latency_ms": a.latency_ms,
                "requests": total,
                "resent": resent,
                "resent_pct_of_rows": round(100 * resent / a.rows, 2),
                "resent_per_kill": per_kill,
                "max_per_kill": max(per_kill, default=0),
                "bound_per_kill": bound,
                "client_rows_s_per_killed_run": [round(r) for r in rates],
            }
        )
    )


if __name__ == "__main__":
    main()
