"""A DataFrameJob: build prompts from several columns with pandas, then score the answers with pandas.

    python examples/dataframe_job.py [--rows 200] [--out tickets-out.parquet]

``prepare`` runs on each input batch before any request (here: drop empty tickets, build the
prompt from two columns); ``finish`` runs on each output batch at commit (here: a ``words``
count and an ``urgent`` flag). Neither ever sees the whole dataset, so memory stays flat at any
size (bench/bench_dataframe_memory.py measures it). The example brings up two stub engines on this
machine (no GPU). With a real swarm the same job is::

    prefect-swarm job submit -n SWARM --input tickets.parquet --output out.parquet \\
        --job dataframe_job:TicketTriage

(``dataframe_job`` importable in the job processes: installed, or its folder on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.jobs.dataframe import DataFrameJob

HERE = Path(__file__).resolve().parent


class TicketTriage(DataFrameJob):
    """One chat completion per non-empty support ticket; the answer scored with pandas."""

    path = "/v1/chat/completions"
    outputs = {"text": pa.string()}

    def columns(self) -> dict[str, str]:
        """The input columns ``prepare`` reads."""
        return {"subject": "string", "body": "string"}

    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        """Drop empty tickets (no request for them); build the prompt from subject and body."""
        df = df[df["body"].str.strip() != ""]
        return df.assign(prompt="Triage this ticket. Subject: " + df["subject"] + ". Body: " + df["body"])

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        """A chat request from the prepared prompt."""
        return {"messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": 16, **self.sampling}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer's text."""
        return {"text": body["choices"][0]["message"]["content"]}

    def finish(self, df: pd.DataFrame) -> pd.DataFrame:
        """Score each answer: its word count, and whether the ticket reads urgent."""
        words = df["text"].fillna("").str.split().str.len()
        urgent = df["subject"].str.contains("down|outage|urgent", case=False)
        return df.assign(words=words.astype("int64"), urgent=urgent)


def tickets(n: int) -> pa.Table:
    """``n`` tickets; every 10th has an empty body."""
    subjects = ["login fails", "site down", "invoice question", "urgent: data loss", "feature idea"]
    return pa.table(
        {
            "ticket": list(range(n)),
            "subject": [subjects[i % len(subjects)] for i in range(n)],
            "body": ["" if i % 10 == 9 else f"details of ticket {i}, seen since monday" for i in range(n)],
        }
    )


def main() -> None:
    """Run the example (see the module doc)."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import submit_job
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dataframe-job-"))
    out = args.out or work / "tickets-out.parquet"
    pq.write_table(tickets(args.rows), work / "tickets.parquet")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    cfg = SwarmConfig.model_validate(stub_swarm_config("dataframe-example", replicas=2))
    spec = JobSpec(
        input=str(work / "tickets.parquet"),
        output=str(out),
        id_column="ticket",
        job="dataframe_job:TicketTriage",
        read_batch_rows=64,
    )
    with Swarm(cfg) as swarm:
        rec = submit_job(swarm, spec, detach=False)
    df = pd.read_parquet(out)
    sent = int(df["text"].notna().sum())
    print(f"job {rec.id}: {rec.status}; {len(df)} rows ({sent} sent, {len(df) - sent} dropped by prepare) -> {out}")
    print(df[["ticket", "subject", "words", "urgent"]].head(5).to_string(index=False))


if __name__ == "__main__":
    main()
