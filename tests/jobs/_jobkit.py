"""Helpers of the job engine tests: datasets, specs, job processes (imported as ``_jobkit``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.jobs.dispatch.runner import Item
from prefect_swarm.testing.stub_engine import StubEngine

MODEL = "stub-model"
CHAT_PATH = "/v1/chat/completions"


def chat_rows(n: int) -> Iterator[Item]:
    """``n`` chat rows for a :class:`~prefect_swarm.jobs.dispatch.runner.Runner` (ids ``"0"``...), each a
    different question."""
    for i in range(n):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"question {i} about a topic"}]}
        yield Item(i, str(i), CHAT_PATH, json.dumps(body).encode())


def make_dataset(path: Path, n: int, *, row_group: int = 1000, ids: list[Any] | None = None) -> Path:
    """A parquet file with ``id`` and ``prompt`` columns (prompts differ per row)."""
    table = pa.table(
        {
            "id": ids if ids is not None else [f"r{i:06d}" for i in range(n)],
            "prompt": [f"question number {i} about topic {i % 17}" for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_spec(tmp: Path, name: str = "job", **fields: Any) -> Path:
    """A spec file in ``tmp/name``; fields override the defaults."""
    job_dir = tmp / name
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "input": str(tmp / "in.parquet"),
        "output": str(tmp / f"{name}-out.parquet"),
        "job_dir": str(job_dir),
        "id_column": "id",
        "model": MODEL,
        "concurrency": 32,
        "checkpoint_every": 200,
        "job_kwargs": {"sampling": {"max_tokens": 8, "temperature": 0}},
        **fields,
    }
    path = job_dir / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def run_job(
    spec: Path,
    shard: int = 0,
    nshards: int = 1,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run one job process to its end."""
    return subprocess.run(
        job_argv(spec, shard, nshards, *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def job_argv(spec: Path, shard: int = 0, nshards: int = 1, *extra: str) -> list[str]:
    """argv of one job process."""
    return [
        sys.executable,
        "-m",
        "prefect_swarm.jobs.run",
        "--spec",
        str(spec),
        "--shard-id",
        str(shard),
        "--nshards",
        str(nshards),
        *extra,
    ]


def requests(stub: StubEngine) -> int:
    """Completion requests the stub has received so far."""
    return int(stub.stats().get("requests", 0))


def run_openai_batch(tmp: Path, stub: StubEngine, src: Path) -> list[dict[str, Any]]:
    """Run an OpenAI Batch JSONL input through the job process against ``stub``; return the output lines."""
    out = tmp / "out.jsonl"
    spec = write_spec(
        tmp,
        input=str(src),
        output=str(out),
        id_column=None,
        endpoints=[stub.url],
        output_format="openai-batch",
        job="chat",
    )
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()]


class ConnectionCounter:
    """A loopback listener that counts every connection made to it (and answers none): a request
    that leaves the swarm for another address shows up here."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        """Stop listening (a shutdown wakes the blocked accept)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ConnectionCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_ledger(root: Path, start: int, end: int, *, retry_failed: bool = False, **kw: Any) -> Any:
    """Shard 0 of 1's ledger over rows ``[start, end)`` in ``root``, opened (fingerprint "fp", one
    string output ``text``): the ledger alone, without a job process. ``kw`` go to ShardLedger
    (``store``, ``compact_every``)."""
    from prefect_swarm.jobs.checkpoint.ledger import ShardLedger
    from prefect_swarm.paths import ShardPaths

    led = ShardLedger(
        ShardPaths(root),
        shard=0,
        nshards=1,
        start=start,
        end=end,
        fingerprint="fp",
        details={},
        outputs={"text": pa.string()},
        **kw,
    )
    led.open(retry_failed=retry_failed)
    return led


def error_result(row: int, why: str) -> Any:
    """A RowResult of row ``row`` that failed with ``why`` (HTTP 503), as :func:`open_ledger`'s ledger takes it."""
    from prefect_swarm.jobs.checkpoint.ledger import RowResult

    return RowResult(row, f"id{row}", "error", why, 503, 0, 0, 1.0, 1)


def ok_result(row: int) -> Any:
    """A RowResult of row ``row`` answered (output ``text``), as :func:`open_ledger`'s ledger takes it."""
    from prefect_swarm.jobs.checkpoint.ledger import RowResult

    return RowResult(row, f"id{row}", "ok", None, 200, 3, 4, 1.0, 1, {"text": "hi"})
