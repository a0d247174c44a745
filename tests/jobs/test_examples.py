"""The job examples in examples/ run as documented (each brings up its own stub swarm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(tmp: Path, script: str, *args: str) -> str:
    env = {**os.environ, "PREFECT_SWARM_HOME": str(tmp / "home")}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_structured_output_example(tmp_path: Path) -> None:
    out = tmp_path / "reviews.parquet"
    stdout = _run(tmp_path, "structured_output.py", "--rows", "30", "--out", str(out))
    assert "SUCCEEDED; 30 rows" in stdout
    df = pd.read_parquet(out)
    ok = df[df["status"] == "ok"]
    assert len(ok) >= 28 and set(ok["sentiment"]) <= {"positive", "negative", "mixed"}
    assert ok["stars"].between(1, 5).all() and str(df["stars"].dtype) in ("int64", "float64")
    assert df["schema_error"].notna().any()  # some answers broke the schema and were asked again


def test_dataframe_job_example(tmp_path: Path) -> None:
    out = tmp_path / "tickets.parquet"
    stdout = _run(tmp_path, "dataframe_job.py", "--rows", "200", "--out", str(out))
    assert "SUCCEEDED; 200 rows (180 sent, 20 dropped by prepare)" in stdout, stdout
    df = pd.read_parquet(out)
    assert list(df["ticket"]) == list(range(200)) and (df["status"] == "ok").all()
    sent = df[df["body"] != ""]
    assert sent["text"].notna().all() and (sent["words"] > 0).all()
    assert df[df["body"] == ""]["text"].isna().all()
    assert df["urgent"].sum() == sum(1 for i in range(200) if i % 5 in (1, 3))
    assert str(df["words"].dtype) == "int64"
