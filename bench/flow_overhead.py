"""Flow overhead: `batch_inference` (8 shards, local backend, stub at 50 ms) vs the bare runner.

    python bench/flow_overhead.py [--rows 16000] [--shards 8] [--concurrency 16] [--repeat 2]

Bare: start the stub engine, wait for /health, run the 8 shard processes
(`python -m prefect_swarm.jobs.run --spec ... --shard-id i --nshards 8`) in parallel, commit.
Flow: `batch_inference` on the same rows with a stub-engine swarm on the local backend (swarm up,
readiness, 8 shard tasks through the compute backend, commit, artifacts, teardown), against a
throwaway Prefect API (`prefect_test_harness`, its start-up not counted). Goal: flow / bare <= 1.25.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "prefect"))

from _common import dataset  # noqa: E402
from helpers import stub_swarm  # noqa: E402

from prefect_swarm.jobs.rows.commit import commit_output  # noqa: E402
from prefect_swarm.jobs.spec import JobSpec  # noqa: E402
from prefect_swarm.testing import free_port  # noqa: E402
from prefect_swarm.testing.stub_engine import StubEngine  # noqa: E402

LATENCY_MS = 50


def options(concurrency: int) -> dict[str, object]:
    """Job options shared by both sides."""
    return {
        "job": "chat",
        "id_column": "id",
        "concurrency": concurrency,
        "checkpoint_every": 2000,
        "job_kwargs": {"sampling": {"max_tokens": 8}},
    }


def bare(tmp: Path, src: Path, shards: int, concurrency: int) -> float:
    """Stub up + shard processes + commit, no Prefect."""
    t0 = time.monotonic()
    with StubEngine(free_port(), latency_ms=LATENCY_MS, model="stub-model") as stub:
        spec = JobSpec(
            input=str(src),
            output=str(tmp / "bare.parquet"),
            job_dir=str(tmp / "bare-job"),
            shards=shards,
            endpoints=[stub.url],
            model="stub-model",
            auto_commit=False,
            **options(concurrency),
        )  # type: ignore[arg-type]
        spec.paths.ensure()
        path = spec.save()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "prefect_swarm.jobs.run",
                    "--spec",
                    str(path),
                    "--shard-id",
                    str(i),
                    "--nshards",
                    str(shards),
                ],
                stderr=subprocess.DEVNULL,
            )
            for i in range(shards)
        ]
        codes = [p.wait() for p in procs]
        assert codes == [0] * shards, codes
        manifest = commit_output(spec)
        assert manifest["ok"] == manifest["rows"], manifest
    return time.monotonic() - t0


def flow(tmp: Path, src: Path, shards: int, concurrency: int, run: int) -> float:
    """The whole flow, in this process."""
    from prefect_swarm.flows import batch_inference

    cfg = stub_swarm(f"bench-{run}", latency_ms=LATENCY_MS)
    t0 = time.monotonic()
    res = batch_inference(cfg, options(concurrency), str(src), str(tmp / f"flow-{run}.parquet"), shards=shards)
    took = time.monotonic() - t0
    assert res["ok"] == res["rows"], res
    return took


def main() -> None:
    """Measure both, alternating, and print a Markdown row."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flow-overhead-"))
    os.environ["PREFECT_SWARM_HOME"] = str(tmp / "home")
    src = dataset(tmp / "in.parquet", a.rows)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        bares, flows = [], []
        for run in range(a.repeat):
            bares.append(bare(tmp / f"b{run}", src, a.shards, a.concurrency))
            flows.append(flow(tmp, src, a.shards, a.concurrency, run))
            print(f"run {run}: bare {bares[-1]:.2f} s, flow {flows[-1]:.2f} s", file=sys.stderr)
    b, f = statistics.median(bares), statistics.median(flows)
    print(f"| {a.rows} | {a.shards} | {a.concurrency} | {LATENCY_MS} ms | {b:.2f} s | {f:.2f} s | {f / b:.2f} |")


if __name__ == "__main__":
    main()
