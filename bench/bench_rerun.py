"""(c) rerun of a finished 1M-row job: requests sent (goal 0) and seconds (goal: a few).

    python bench/bench_rerun.py [--rows 1000000] [--repeat 3]

Runs the job once to the end (auto-commit on), then reruns the same spec ``--repeat`` times,
timing each rerun process from start to exit and counting the stub's requests.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _common import dataset, job_argv, median, run_pinned, spec_file

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine


def main() -> None:
    """Print the first run and the reruns as JSON lines."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, StubEngine(free_port(), cpu=0) as stub:
        tmp = Path(d)
        src = dataset(tmp / "in.parquet", a.rows)
        spec = spec_file(tmp / "job", src, stub.url)
        code, secs, _ = run_pinned(job_argv(spec))
        assert code == 0, code
        first = stub.stats().get("requests", 0)
        print(json.dumps({"first_run_s": round(secs, 1), "requests": first}), flush=True)
        times, sent = [], []
        for _ in range(a.repeat):
            code, secs, _ = run_pinned(job_argv(spec))
            assert code == 0, code
            times.append(round(secs, 2))
            sent.append(stub.stats().get("requests", 0) - first)
        print(json.dumps({"rerun_s": times, "median_rerun_s": median(times), "rerun_requests": sent}))


if __name__ == "__main__":
    main()
