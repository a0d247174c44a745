"""Helpers of the external-backend tests: a config file aimed at a server the test started, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "EXTERNAL_API_KEY"


def external_config(tmp: Path, url: str, *, name: str = "ext", model: str = "tiny", **backend: Any) -> Path:
    """examples/external.yaml aimed at ``url`` (the server the test started), with ``backend`` overrides."""
    data = yaml.safe_load((REPO / "examples" / "external.yaml").read_text())
    data.update(name=name, model=model)
    data["backend"].update(url=url, **backend)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def dataset(path: Path, n: int) -> Path:
    """``id`` and ``prompt`` columns, every prompt different."""
    pq.write_table(pa.table({"id": [f"r{i:04d}" for i in range(n)], "prompt": [f"say {i}" for i in range(n)]}), path)
    return path


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``prefect-swarm ARGS`` in a subprocess with this test's environment (+ ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PREFECT_API_URL": "", **(env or {})},
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def popen_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``prefect-swarm ARGS`` started, not waited for."""
    return subprocess.Popen(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PREFECT_API_URL": "", **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def files_holding(root: Path, secret: str) -> list[Path]:
    """Every file under ``root`` whose bytes contain ``secret`` (state.db, specs, logs, configs)."""
    needle = secret.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
