"""(a) rows/s of the job runner / a plain aiohttp loop, same concurrency, against the stub engine.

    python bench/bench_throughput.py [--rows 60000] [--repeat 5] [--scrape-s 1]

Server pinned to core 0, client to core 1; runs alternate (plain, ours) so drift hits both.
The job process always serves its ``/metrics`` (on 127.0.0.1: the stub is on loopback, see
``JobSpec.metrics_host``); with ``--scrape-s S`` a thread of this script also reads it every S
seconds while the job runs, as Prometheus would. Each side's figure is the median of ``--repeat`` runs.
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
import threading
import urllib.request
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


def ours(tmp: Path, src: Path, url: str, c: int, scrape_s: float = 0.0) -> float:
    """Runner rows/s (its /metrics scraped every ``scrape_s`` seconds when > 0)."""
    job = tmp / "job"
    shutil.rmtree(job, ignore_errors=True)
    spec = spec_file(job, src, url, concurrency=c, auto_commit=False)
    stop = threading.Event()
    scraper = threading.Thread(target=scrape, args=(job / "shards/00000/progress.json", scrape_s, stop))
    if scrape_s > 0:
        scraper.start()
    try:
        code, _, _ = run_pinned(job_argv(spec))
    finally:
        stop.set()
        if scraper.is_alive():
            scraper.join()
    assert code == 0, code
    return float(json.loads((job / "shards/00000/progress.json").read_text())["rate_rows_s"])


def scrape(progress: Path, every_s: float, stop: threading.Event) -> None:
    """Read the job's ``metrics_url`` (progress.json) every ``every_s`` seconds until ``stop``."""
    while not stop.wait(every_s):
        try:
            url = json.loads(progress.read_text()).get("metrics_url")
            if url:
                urllib.request.urlopen(url, timeout=2).read()
        except (OSError, ValueError):
            continue  # not written yet, or the job is ending


def main() -> None:
    """Run and print a markdown table row per latency."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--rows-50ms", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--scrape-s", type=float, default=0.0, help="scrape the job's /metrics every S seconds")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for latency, n in ((0, a.rows), (50, a.rows_50ms)):
            src = dataset(tmp / f"in-{n}.parquet", n)
            p, o = [], []
            with StubEngine(free_port(), latency_ms=latency, cpu=0) as stub:
                for _ in range(a.repeat):
                    p.append(plain(stub.url, n, a.concurrency))
                    o.append(ours(tmp, src, stub.url, a.concurrency, a.scrape_s))
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
