"""Fixtures of the metrics tests: a small dataset and a spec for a job against a stub engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def make_spec(tmp_path: Path) -> Any:
    """``make_spec(n, endpoints, **fields)`` -> a spec file of a chat job over ``n`` rows (row 7's prompt null)."""

    def make(n: int, endpoints: list[str], **fields: Any) -> Path:
        prompts: list[str | None] = [f"question {i} about topic {i % 7}" for i in range(n)]
        prompts[7] = None
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": prompts}), src)
        job_dir = tmp_path / "job"
        job_dir.mkdir(exist_ok=True)
        spec = {
            "input": str(src),
            "output": str(tmp_path / "out.parquet"),
            "job_dir": str(job_dir),
            "id_column": "id",
            "model": "stub-model",
            "endpoints": endpoints,
            "concurrency": 8,
            "checkpoint_every": 50,
            "job_kwargs": {"sampling": {"max_tokens": 8}},
            **fields,
        }
        path = job_dir / "spec.json"
        path.write_text(json.dumps(spec))
        return path

    return make
