"""Structured output: every answer follows a pydantic model; each field becomes a typed column.

    python examples/structured_output.py [--rows 40] [--out reviews.parquet]

Brings up a swarm of two stub engines on this machine (no GPU: the stub answers ``response_format``
requests with JSON that follows the schema, and breaks it for ``--invalid-rate`` of the answers, so
the retries show), runs a chat job with ``response_schema="structured_output:Review"`` and prints a
few rows. With a real swarm the same job is::

    prefect-swarm job submit -n SWARM --input reviews.parquet --output out.parquet \\
        --job-kwargs '{"prompt_column": "review"}' --response-schema structured_output:Review

(``structured_output`` importable in the job processes: installed, or its folder on PYTHONPATH).
The output holds the input columns, ``text`` (the raw answer), one column per field of ``Review``
(``sentiment`` string, ``stars`` int64, ``topics`` list<string>), ``schema_error`` (why an earlier
answer was refused, for rows that needed a retry), and the usual status, error and tokens.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

HERE = Path(__file__).resolve().parent


class Review(BaseModel):
    """What the model must answer for each review."""

    sentiment: Literal["positive", "negative", "mixed"]
    stars: int = Field(ge=1, le=5)
    topics: list[str]


def main() -> None:
    """Run the example (see the module doc)."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import submit_job
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--invalid-rate", type=float, default=0.3, help="share of stub answers that break the schema")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="structured-"))
    out = args.out or work / "reviews-out.parquet"
    verdicts = ["lasts", "dies"]
    reviews = [f"review {i}: the battery {verdicts[i % 2]} and the screen is fine" for i in range(args.rows)]
    pq.write_table(pa.table({"id": list(range(args.rows)), "review": reviews}), work / "reviews.parquet")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    cfg = SwarmConfig.model_validate(
        stub_swarm_config("structured-example", replicas=2, invalid_json_rate=args.invalid_rate, seed=3)
    )
    spec = JobSpec(
        input=str(work / "reviews.parquet"),
        output=str(out),
        id_column="id",
        job_kwargs={
            "prompt_column": "review",
            "response_schema": "structured_output:Review",
            "schema_retries": 3,
            "sampling": {"max_tokens": 128, "temperature": 0},
        },
    )
    with Swarm(cfg) as swarm:
        rec = submit_job(swarm, spec, detach=False)
    rows = pq.read_table(out).to_pylist()
    print(f"job {rec.id}: {rec.status}; {len(rows)} rows -> {out}")
    for r in rows[:3]:
        print(f"  {r['id']}: sentiment={r['sentiment']} stars={r['stars']} topics={r['topics']}")
    retried = sum(1 for r in rows if r["schema_error"])
    print(f"rows answered validly after a retry: {retried}; error rows: {sum(r['status'] != 'ok' for r in rows)}")


if __name__ == "__main__":
    main()
