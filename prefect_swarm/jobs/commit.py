"""Commit: merge the shard ledgers into the output, atomically, with a manifest and failed rows.

The output holds the input columns (or ``input_columns``), the job's outputs, ``status``,
``error``, ``prompt_tokens`` and ``completion_tokens``: exactly one row per input row, in input
order (the ledger's last write wins). It is streamed shard by shard: memory holds one shard's
ledger and one input batch. ``failed.jsonl`` lists the error rows (id, error); a retry of just
those rows is ``submit_job(..., retry_failed=True)`` (CLI: ``job retry``) followed by a commit.

Committing twice is cheap: when the ledgers have not changed since the manifest, the manifest
is returned as is.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefect_swarm.exceptions import JobError
from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.dataset import InputDataset, shard_range
from prefect_swarm.jobs.fingerprint import job_fingerprint
from prefect_swarm.jobs.ledger import latest_positions, read_ledger
from prefect_swarm.jobs.plan import pending_shards, shard_progress
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import atomic_file, atomic_write_json, read_json

RESULT_COLUMNS = ["status", "error", "prompt_tokens", "completion_tokens"]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ledger_signature(spec: JobSpec, fingerprint: str) -> dict[str, Any]:
    parts = {
        str(i): [[p.name, p.stat().st_size] for p in spec.paths.shard(i).parts()] for i in range(spec.shards)
    }
    return {
        "fingerprint": fingerprint,
        "parts": parts,
        "output": spec.output,
        "format": spec.output_format,
        "input_columns": spec.input_columns,
        "output_columns": spec.output_columns,
    }


def commit_output(spec: JobSpec, *, force: bool = False) -> dict[str, Any]:
    """Merge every shard into ``spec.output``; write the manifest and failed rows; return the manifest.

    Raises JobError naming the shards still pending.
    """
    spec = spec.model_copy(update={"retry_failed": False})
    with _locked(spec.paths.commit_lock):
        pending = pending_shards(spec)
        if pending:
            raise JobError(
                f"cannot commit job {spec.job_id or spec.job_dir}: shards {pending} are not done. "
                "Run them first (`prefect-swarm job wait`, or resubmit: finished shards are skipped)."
            )
        fp = job_fingerprint(spec)
        signature = _ledger_signature(spec, fp)
        old = read_json(spec.paths.manifest)
        if not force and old and old.get("signature") == signature and Path(spec.output).exists():
            return dict(old)
        return _commit(spec, fp, signature)


def _commit(spec: JobSpec, fp: str, signature: dict[str, Any]) -> dict[str, Any]:
    t0 = time.time()
    ds = InputDataset(spec.input)
    job = load_job(spec.job, spec.job_kwargs)
    outputs = [c for c in job.outputs if spec.output_columns is None or c in spec.output_columns]
    keep = spec.input_columns if spec.input_columns is not None else ds.schema.names
    counts = {"rows": 0, "ok": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}
    writer: _Writer = _JsonlWriter() if spec.output_format == "openai-batch" else _ParquetWriter()
    failed_lines: list[str] = []
    with atomic_file(Path(spec.output).expanduser()) as tmp:
        writer.open(tmp)
        for i in range(spec.shards):
            for merged in _merge_shard(spec, ds, i, keep, outputs):
                writer.write(merged)
                _count(merged, counts, failed_lines)
        writer.close()
    if counts["rows"] != ds.num_rows:
        raise JobError(
            f"commit of {spec.output} produced {counts['rows']} rows for {ds.num_rows} input rows."
        )
    _write_failed(spec, failed_lines)
    manifest = {
        "job_id": spec.job_id,
        "output": str(spec.output),
        "format": spec.output_format,
        "fingerprint": fp,
        **counts,
        "shards": [shard_progress(spec, i, ds) for i in range(spec.shards)],
        "failed_rows": str(spec.paths.failed_rows),
        "committed_at": time.time(),
        "commit_seconds": round(time.time() - t0, 3),
        "signature": signature,
    }
    atomic_write_json(spec.paths.manifest, manifest)
    return manifest


def _write_failed(spec: JobSpec, lines: list[str]) -> None:
    with atomic_file(spec.paths.failed_rows) as tmp:
        tmp.write_text("".join(lines))


def _count(merged: pa.RecordBatch, counts: dict[str, int], failed: list[str]) -> None:
    n = merged.num_rows
    status = merged.column("status")
    bad = pc.not_equal(status, "ok")
    nbad = int(pc.sum(bad).as_py() or 0)
    counts["rows"] += n
    counts["failed"] += nbad
    counts["ok"] += n - nbad
    counts["prompt_tokens"] += int(pc.sum(merged.column("prompt_tokens")).as_py() or 0)
    counts["completion_tokens"] += int(pc.sum(merged.column("completion_tokens")).as_py() or 0)
    if nbad:
        rows = merged.filter(bad).select(["_id", "error"]).to_pylist()
        failed.extend(json.dumps({"id": r["_id"], "error": r["error"]}) + "\n" for r in rows)


def _merge_shard(
    spec: JobSpec, ds: InputDataset, i: int, keep: list[str], outputs: list[str]
) -> Iterator[pa.RecordBatch]:
    """The shard's input rows, in order, each joined with its latest ledger row."""
    start, end = shard_range(ds.num_rows, i, spec.shards)
    if start == end:
        return
    extra = ["_id", *outputs, *RESULT_COLUMNS] + (
        ["_response", "http_status"] if spec.output_format == "openai-batch" else []
    )
    ledger = read_ledger(spec.paths.shard(i), ["_row", *extra])  # not latency_ms, attempts, unused outputs
    if ledger is None:
        raise JobError(f"shard {i} of job {spec.job_id} has no ledger in {spec.paths.shard(i).root}.")
    pos = latest_positions(ledger.column("_row").to_numpy(), start, end)
    if (pos < 0).any():
        missing = int(np.nonzero(pos < 0)[0][0]) + start
        raise JobError(f"shard {i} ledger lacks row {missing} (and maybe more); rerun the shard.")
    ledger = ledger.select(extra)
    cols = keep if keep else None
    for first, batch in ds.iter_range(start, end, cols, spec.read_batch_rows):
        taken = ledger.take(pa.array(pos[first - start : first - start + batch.num_rows]))
        arrays = [*batch.columns, *(taken.column(c).combine_chunks() for c in extra)]
        yield pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *extra])


class _Writer:
    def open(self, path: Path) -> None:
        raise NotImplementedError

    def write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _ParquetWriter(_Writer):
    """Parquet output: input columns + outputs + status, error, tokens (``_id`` and internals dropped)."""

    def open(self, path: Path) -> None:
        self.path = path
        self.writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        batch = batch.drop_columns(
            [c for c in ("_id", "_response", "http_status") if c in batch.schema.names]
        )
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, batch.schema, compression="zstd")
        self.writer.write_batch(batch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _JsonlWriter(_Writer):
    """OpenAI Batch output format: ``{id, custom_id, response: {status_code, request_id, body}, error}``."""

    def open(self, path: Path) -> None:
        self.fh = open(path, "w")  # noqa: SIM115 - closed in close()

    def write(self, batch: pa.RecordBatch) -> None:
        cols = {
            c: batch.column(c).to_pylist() for c in ("_id", "status", "error", "_response", "http_status")
        }
        lines = []
        for k, cid in enumerate(cols["_id"]):
            ok = cols["status"][k] == "ok"
            raw = cols["_response"][k]
            body = json.loads(raw) if ok and raw else None
            lines.append(
                json.dumps(
                    {
                        "id": f"batch_req_{cid}",
                        "custom_id": cid,
                        "response": {
                            "status_code": 200,
                            "request_id": (body or {}).get("id", ""),
                            "body": body,
                        }
                        if ok
                        else None,
                        "error": None
                        if ok
                        else {"code": str(cols["http_status"][k] or "error"), "message": cols["error"][k]},
                    }
                )
            )
        self.fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self.fh.close()
