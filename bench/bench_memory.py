"""(b) peak RSS of the job process at 2M rows / at 200k rows (stub engine, 0 ms, c=256).

    python bench/bench_memory.py [--small 200000] [--large 2000000] [--repeat 3] [--large-repeat 1]

Peak RSS is the job process's own ``ru_maxrss`` (os.wait4). The commit (the merge into the
output) is measured separately (``commit`` entries, ``python -c commit_output``), because the job
process here runs with auto_commit off.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from _common import dataset, job_argv, median, run_pinned, spec_file

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

COMMIT = (
    "import sys; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.rows.commit import "
    "commit_output; commit_output(JobSpec.load(sys.argv[1]))"
)


def one(tmp: Path, src: Path, url: str, commit: bool) -> dict[str, float]:
    """One job run: peak RSS (MB) and seconds; with ``commit`` the commit's too."""
    job = tmp / "job"
    shutil.rmtree(job, ignore_errors=True)
    spec = spec_file(job, src, url, auto_commit=False)
    code, secs, rss = run_pinned(job_argv(spec))
    assert code == 0, code
    out = {"job_rss_mb": round(rss / 2**20, 1), "job_s": round(secs, 1)}
    if commit:
        code, secs, rss = run_pinned([sys.executable, "-c", COMMIT, str(spec)])
        assert code == 0, code
        out.update(commit_rss_mb=round(rss / 2**20, 1), commit_s=round(secs, 1))
    return out


def main() -> None:
    """Print one JSON line per size and the ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=200_000)
    ap.add_argument("--large", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--large-repeat", type=int, default=3)
    ap.add_argument("--commit", action="store_true", help="also measure the commit's peak RSS")
    a = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as d, StubEngine(free_port(), cpu=0) as stub:
        tmp = Path(d)
        for n, reps in ((a.small, a.repeat), (a.large, a.large_repeat)):
            src = dataset(tmp / f"in-{n}.parquet", n)
            runs = [one(tmp, src, stub.url, a.commit) for _ in range(reps)]
            res[n] = median([r["job_rss_mb"] for r in runs])
            print(json.dumps({"rows": n, "runs": runs, "median_job_rss_mb": res[n]}), flush=True)
    print(json.dumps({"ratio_large_small": round(res[a.large] / res[a.small], 3)}))


if __name__ == "__main__":
    main()
