"""(a) rows/s of the job runner / a plain aiohttp loop, same concurrency, against the stub engine.

    python bench/bench_throughput.py [--rows 60000] [--repeat 3] [--latencies 0,50]

Server pinned to core 0, client to core 1; runs alternate (plain, ours) so drift hits both.
Our rows/s is the job process's own figure (progress.json: rows / seconds from the ledger's
opening to the last flush: reading, requests, parsing, checkpoints), the baseline's is first
request to last answer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import CLIENT_CPU, ROOT, dataset, job_argv, median, run_pinned, spec_file

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine


def plain(url: str, n: int, c: int) -> float:
    """Baseline rows/s."""
    out = subprocess.run(
        [
            "taskset",
            "-c",
            str(CLIENT_CPU),
            sys.executable,
            str(ROOT / "bench/plain_aiohttp.py"),
            "--url",
            url,
            "--n",
            str(n),
            "--concurrency",
            str(c),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout)["rows_s"])


def ours(tmp: Path, src: Path, url: str, c: int) -> float:
    """Runner rows/s."""
    job = tmp / "job"
    shutil.rmtree(job, ignore_errors=True)
    spec = spec_file(job, src, url, concurrency=c, auto_commit=False)
    code, _, _ = run_pinned(job_argv(spec))
    assert code == 0, code
    return float(json.loads((job / "shards/00000/progress.json").read_text())["rate_rows_s"])


def main() -> None:
    """Run and print a markdown table row per latency."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--rows-50ms", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=256)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for latency, n in ((0, a.rows), (50, a.rows_50ms)):
            src = dataset(tmp / f"in-{n}.parquet", n)
            p, o = [], []
            with StubEngine(free_port(), latency_ms=latency, cpu=0) as stub:
                for _ in range(a.repeat):
                    p.append(plain(stub.url, n, a.concurrency))
                    o.append(ours(tmp, src, stub.url, a.concurrency))
            print(
                json.dumps(
                    {
                        "latency_ms": latency,
                        "rows": n,
                        "c": a.concurrency,
                        "plain_rows_s": p,
                        "ours_rows_s": o,
                        "plain_median": median(p),
                        "ours_median": median(o),
                        "ratio": round(median(o) / median(p), 3),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
