"""How well the cost and time preview predicts a job, on simulated GPU replicas.

    python bench/projection.py [--replicas 1] [--rows 12000] [--pilot 1000] [--repeat 1]

A local swarm of ``replicas`` GPU-like simulated engines (``prefect_swarm.testing.gpu_sim``: 256
sequences batched, 32 tokens an answer) runs ``rows`` rows twice over: first the pilot
(:func:`prefect_swarm.launch.pilot_job`, what ``validate --estimate PILOT`` runs: the first PILOT
rows, projected to the whole input), then the job itself (``job submit`` with defaults, waited on as
the CLI waits, keeping every running projection `job status` would show). Reported, per repeat: the
pilot's projected wall time, the first and last running projections, and the job's real wall time
(its shards' first start to last progress write, what the projection is about) and submit → committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import dataset  # noqa: E402


def measure(replicas: int, rows: int, pilot: int, work: Path) -> dict[str, Any]:
    """One pilot and one job on a fresh swarm; the figures above."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import pilot_job, submit_job, wait_job
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing import gpu_sim
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    src = dataset(work / f"in-{rows}.parquet", rows)
    cfg = stub_swarm_config("projection", replicas=replicas, module=gpu_sim.MODULE)
    with Swarm(SwarmConfig.model_validate(cfg)) as swarm:
        out = work / f"out-{time.monotonic_ns()}.parquet"
        spec = JobSpec(input=str(src), output=str(out), id_column="id", job_kwargs={"sampling": {"max_tokens": 32}})
        est = pilot_job(spec, swarm, pilot)
        rec = submit_job(swarm, spec, detach=True)
        t0, seen = time.monotonic(), []
        doc = wait_job(rec.id, on_progress=lambda d: seen.append((time.monotonic() - t0, d.get("projection"))))
        total_s = time.monotonic() - t0
    running = [(round(t, 1), p["wall_s"]) for t, p in seen if p and p.get("ready")]
    return {
        "status": doc["status"],
        "pilot_rows": est["pilot_rows"],
        "pilot_rows_s": est["pilot_rate_rows_s"],
        "pilot_projected_wall_s": est["projection"]["wall_s"],
        "first_running_projection": running[0] if running else None,
        "last_running_projection": running[-1] if running else None,
        "job_wall_s": doc["cost"]["wall_s"],
        "submit_to_committed_s": round(total_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--pilot", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-projection-") as tmp:
        os.environ.setdefault("PREFECT_SWARM_HOME", str(Path(tmp) / "home"))
        for _ in range(args.repeat):
            print(json.dumps(measure(args.replicas, args.rows, args.pilot, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
