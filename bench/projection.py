"""How well the cost and time preview predicts a job, on simulated GPU replicas.

    python bench/projection.py [--profile short long-tail slow-steps] [--replicas 1] [--pilot 1000]
        [--repeat 1] [--rows N]

A local swarm of ``replicas`` GPU-like simulated engines (``prefect_swarm.testing.gpu_sim``: 256
sequences batched) runs a job's rows twice over: first the pilot (:func:`prefect_swarm.launch.pilot_job`,
what ``validate --estimate PILOT`` runs: the first PILOT rows, projected to the whole input), then
the job itself (``job submit`` with defaults, waited on as the CLI waits, keeping every running
projection `job status` would show). Reported, per profile and repeat: the pilot's projected wall
time, every running projection, the job's real wall time (its shards' first start to last progress
write, what a running projection is about) and submit → committed (what the pilot projects: the
processes' start to the last answer, plus the commit), and the errors (projected ÷ real - 1; beside
them the error of projecting the rows at the whole pilot's rate, ramp and tail counted per row).

Profiles (each a job of about a minute on one replica; ``--rows`` overrides):

- ``short``: 32-token answers (12,000 rows);
- ``long-tail``: 32-token answers, 5 % of them 8 x as long (10,000 rows);
- ``slow-steps``: 32-token answers, every engine step 4 x as long (``--speed 0.25``; 4,000 rows).
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

PROFILES: dict[str, tuple[dict[str, Any], int]] = {
    "short": ({}, 12_000),
    "long-tail": ({"long_tail": 0.05, "long_tail_x": 8}, 10_000),
    "slow-steps": ({"speed": 0.25}, 4_000),
}
"""Profile -> (the simulator's knobs, rows of a job of about a minute)."""


def error(projected: float, real: float) -> float:
    return round(projected / real - 1, 3)


def measure(profile: str, replicas: int, rows: int, pilot: int, work: Path) -> dict[str, Any]:
    """One pilot and one job on a fresh swarm; the figures above."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import pilot_job, submit_job, wait_job
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing import gpu_sim
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    src = dataset(work / f"in-{rows}.parquet", rows)
    cfg = stub_swarm_config("projection", replicas=replicas, module=gpu_sim.MODULE, **PROFILES[profile][0])
    with Swarm(SwarmConfig.model_validate(cfg)) as swarm:
        out = work / f"out-{time.monotonic_ns()}.parquet"
        sampling = {"sampling": {"max_tokens": 1024}}
        spec = JobSpec(input=str(src), output=str(out), id_column="id", job_kwargs=sampling)
        est = pilot_job(spec, swarm, pilot)
        rec = submit_job(swarm, spec, detach=True)
        t0, seen = time.monotonic(), []
        doc = wait_job(rec.id, on_progress=lambda d: seen.append((time.monotonic() - t0, d.get("projection"))))
        total_s = time.monotonic() - t0
    running = sorted({(round(t, 1), p["wall_s"]) for t, p in seen if p and p.get("ready")})
    real = float(doc["cost"]["wall_s"])
    errors = [error(wall, real) for _, wall in running]
    return {
        "profile": profile,
        "status": doc["status"],
        "rows": rows,
        "pilot_rows": est["pilot_rows"],
        "pilot_rows_s": est["pilot_rate_rows_s"],
        "pilot_steady_rows_s": est.get("steady_rate_rows_s"),
        "pilot_start_and_tail_s": est.get("start_and_tail_s"),
        "pilot_projected_wall_s": est["projection"]["wall_s"],
        "running_projections": running,
        "job_wall_s": real,
        "submit_to_committed_s": round(total_s, 1),
        "pilot_error": error(est["projection"]["wall_s"], total_s),
        # the whole pilot's rate, ramp and tail counted per row (the estimate before the steady rate)
        "whole_pilot_rate_error": error(rows / est["pilot_rate_rows_s"], total_s),
        "running_errors": errors,
        "worst_running_error": max(errors, key=abs) if errors else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--rows", type=int, default=None, help="rows of the job (default: the profile's)")
    ap.add_argument("--pilot", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-projection-") as tmp:
        os.environ.setdefault("PREFECT_SWARM_HOME", str(Path(tmp) / "home"))
        for _ in range(args.repeat):
            for profile in args.profile:
                rows = args.rows or PROFILES[profile][1]
                print(json.dumps(measure(profile, args.replicas, rows, args.pilot, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
