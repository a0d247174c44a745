"""Commit: merge the shard ledgers into the output, atomically, with a manifest and failed rows.

The output holds the input columns (or ``input_columns``), the job's outputs, ``status``,
``error``, ``prompt_tokens`` and ``completion_tokens``: exactly one row per input row, in input
order (the ledger's last write wins). It is streamed, so memory is bounded whatever the input
or shard size.

Ledger parts are in completion order, so a shard is put in input order by a bucketed external
sort: one pass over its parts appends each ledger row to the temp bucket file of its ``_row``
range (Arrow IPC, in a ``.commit-buckets-*`` folder of the job dir); then, bucket by bucket, a
bucket is loaded, deduped (the last write wins, in part order, as in the ledger), put in ``_row``
order and joined with the input rows of that range, streamed once. Memory holds one bucket (at
most ``bucket_rows`` rows and about ``BUCKET_BYTES``), one ledger part and one input batch. At
most ``MAX_OPEN_BUCKETS`` (``open_buckets``) bucket files are written per pass; a shard with more buckets takes
more passes over its parts.

``failed.jsonl`` (streamed too) lists the error rows (id, error); a retry of just those rows
is ``submit_job(..., retry_failed=True)`` (CLI: ``job retry``) followed by a commit.

Committing twice is cheap: when the ledgers have not changed since the manifest, the manifest
is returned as is. The output and ``failed.jsonl`` get the usual mode of a new file (0666 less
the process umask), not the 0600 of a temp file. :func:`manifest_verdict` says whether a
committed job succeeded (failed fraction at most ``max_failed_fraction``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefect_swarm.exceptions import JobError
from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.checkpoint.failures import failure_summary
from prefect_swarm.jobs.checkpoint.fingerprint import hash_details, job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import Part, latest_positions, part_size, part_source, shard_store
from prefect_swarm.jobs.checkpoint.plan import pending_shards, shard_progress
from prefect_swarm.jobs.columns import RAW_COLUMN
from prefect_swarm.jobs.rows import output as dataset_output
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.input import InputDataset, open_input, shard_range
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import atomic_file, atomic_write_json, file_lock, read_json, user_umask

RESULT_COLUMNS = ["status", "error", "prompt_tokens", "completion_tokens"]
BATCH_COLUMNS = [RAW_COLUMN, "http_status", "attempts"]
"""Ledger columns the OpenAI Batch output needs besides the results."""
BUCKET_BYTES = 128 * 2**20
"""Uncompressed ledger bytes of one bucket, about (fewer rows per bucket when rows are wide)."""
MAX_OPEN_BUCKETS = 256
"""Bucket files written at once; more buckets take more passes over the shard's parts."""


def _ledger_signature(spec: JobSpec, fingerprint: str) -> dict[str, Any]:
    parts = {str(i): [[p.name, part_size(p)] for p in shard_store(spec, i).parts()] for i in range(spec.shards)}
    return {
        "fingerprint": fingerprint,
        "parts": parts,
        "output": spec.output,
        "format": spec.output_format,
        "input_columns": spec.input_columns,
        "output_columns": spec.output_columns,
    }


def commit_output(
    spec: JobSpec,
    *,
    force: bool = False,
    bucket_rows: int | None = None,
    open_buckets: int = MAX_OPEN_BUCKETS,
    parts: dataset_output.PartSizes = dataset_output.PartSizes(),
) -> dict[str, Any]:
    """Merge every shard into ``spec.output``; write the manifest and failed rows; return the manifest.

    ``bucket_rows`` caps the rows the merge holds at once (default: the setting
    ``PREFECT_SWARM_COMMIT_BUCKET_ROWS``), ``open_buckets`` the bucket files written per pass;
    ``parts`` cuts a dataset output's part files. Raises JobError naming the shards still pending.
    """
    spec = spec.model_copy(update={"retry_failed": False})
    with file_lock(spec.paths.commit_lock):
        pending = pending_shards(spec)
        if pending:
            raise JobError(
                f"cannot commit job {spec.job_id or spec.job_dir}: shards {pending} are not done. "
                "Run them first (`prefect-swarm job wait`, or resubmit: finished shards are skipped)."
            )
        for stale in spec.paths.commit_tmp_dirs():  # left by a commit killed mid-merge
            shutil.rmtree(stale, ignore_errors=True)
        fp = job_fingerprint(spec)
        signature = _ledger_signature(spec, fp)
        old = read_json(spec.paths.manifest)
        if not force and old and old.get("signature") == signature and output_present(spec):
            return dict(old)
        sizes = MergeSizes(_bucket_rows(bucket_rows), open_buckets, parts)
        if dataset_output.is_dataset(spec.output):
            return _commit_dataset(spec, fp, signature, sizes, force=force)
        return _commit(spec, fp, signature, sizes)


def output_present(spec: JobSpec) -> bool:
    """The output is there: the file, or a dataset folder's ``_SUCCESS`` (one request on an object store)."""
    loc = storage.parse(spec.output, "output")
    return dataset_output.published(loc) if dataset_output.is_dataset(spec.output) else loc.exists()


def manifest_current(spec: JobSpec, manifest: Mapping[str, Any] | None) -> bool:
    """``manifest`` describes the output of the ledger as it is now (no row was rerun since the commit)."""
    if not manifest or not output_present(spec):
        return False
    spec = spec.model_copy(update={"retry_failed": False})
    return manifest.get("signature") == _ledger_signature(spec, job_fingerprint(spec))


@dataclass(frozen=True)
class MergeSizes:
    """How a commit cuts its work: buckets of at most ``bucket_rows`` rows, ``open_buckets`` bucket
    files written per pass, a dataset output's part files cut by ``parts``."""

    bucket_rows: int
    open_buckets: int = MAX_OPEN_BUCKETS
    parts: dataset_output.PartSizes = field(default_factory=dataset_output.PartSizes)


def _bucket_rows(value: int | None) -> int:
    if value is None:
        from prefect_swarm.settings import get_settings  # pydantic-settings: only when a commit runs

        value = get_settings().commit_bucket_rows
    if value < 1:
        raise JobError(f"commit bucket_rows must be at least 1 (got {value}).")
    return value


def _commit(spec: JobSpec, fp: str, signature: dict[str, Any], sizes: MergeSizes) -> dict[str, Any]:
    t0 = time.time()
    ds = open_input(spec)
    job = load_job(spec.job, spec.job_kwargs)
    outputs = [c for c in job.outputs if spec.output_columns is None or c in spec.output_columns]
    keep = spec.input_columns if spec.input_columns is not None else ds.schema.names
    counts = {"rows": 0, "ok": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}
    gz = str(spec.output).endswith(".gz")
    writer: _Writer = _JsonlWriter(gz) if spec.output_format == "openai-batch" else _ParquetWriter()
    out = storage.parse(spec.output, "output")
    # the store failing now (keys revoked, bucket gone, network) is one message, not a traceback
    store_failed = storage.refusing(out, "output", "write", error=JobError, after=_KEPT)
    with store_failed, atomic_file(spec.paths.failed_rows) as failed_tmp, open(failed_tmp, "w") as failed:
        storage.remove_stale_temps(out)  # left by a commit killed mid-write (object stores)
        with storage.publish_file(out) as tmp:
            writer.open(tmp)
            finish = job.finish_batch if spec.output_format == "parquet" else None
            for i in range(spec.shards):
                for merged in _merge_shard(spec, ds, i, keep, outputs, sizes):
                    _count(merged, counts, failed)
                    writer.write(finish(merged) if finish else merged)
            writer.close()
            if isinstance(tmp, Path):
                _as_new_file(tmp)
        _as_new_file(failed_tmp)
        if counts["rows"] != ds.num_rows:  # failed.jsonl is then left as it was
            raise JobError(f"commit of {spec.output} produced {counts['rows']} rows for {ds.num_rows} input rows.")
    return _write_manifest(spec, ds, fp, signature, t0, counts)


def _commit_dataset(
    spec: JobSpec, fp: str, signature: dict[str, Any], sizes: MergeSizes, *, force: bool = False
) -> dict[str, Any]:
    """Publish the output as a dataset (:mod:`prefect_swarm.jobs.rows.output`): each shard's part files
    (written by the shard as it finished, see :func:`write_shard_output`; else written now), then the
    manifest and ``_SUCCESS``. With every shard's files written, this costs O(files)."""
    t0 = time.time()
    tokens = [shard_token(spec, i, fp) for i in range(spec.shards)]
    commit_id = hash_details({"shards": tokens, "fingerprint": fp})[:12]
    out = storage.parse(spec.output, "output")
    ds = open_input(spec)
    with storage.refusing(out, "output", "write", error=JobError, after=_KEPT):
        current = dataset_output.read_manifest(out)
        if force or not (current and current.get("commit") == commit_id and dataset_output.published(out)):
            stage = dataset_output.prepare(out, commit_id)
            shards = [_shard_output(spec, ds, i, tokens[i], sizes, rewrite=force) for i in range(spec.shards)]
            for i, shard in enumerate(shards):  # a filesystem: hard links into the staging folder
                dataset_output.stage_files(out, stage, tokens[i], [f["path"] for f in shard["files"]])
            current = _dataset_manifest(spec, fp, commit_id, shards)
            if current["rows"] != ds.num_rows:
                raise JobError(f"commit of {spec.output} produced {current['rows']} rows for {ds.num_rows} input rows.")
            dataset_output.publish_dataset(out, stage, current)
        dataset_output.keep_parts(out, tokens)  # a filesystem: drop pre-written files of older ledger states
    with atomic_file(spec.paths.failed_rows) as tmp, open(tmp, "w") as failed:
        for i in range(spec.shards):  # the shards' failed rows, recorded as each was written
            part = spec.paths.shard(i).output_failed(tokens[i])
            if part.exists():
                with open(part) as src:
                    shutil.copyfileobj(src, failed)
        _as_new_file(tmp)
    counts = {k: current[k] for k in ("rows", "ok", "failed", "prompt_tokens", "completion_tokens", "bytes", "commit")}
    return _write_manifest(
        spec, ds, fp, signature, t0, {"layout": dataset_output.LAYOUT, **counts, "files": len(current["files"])}
    )


def _write_manifest(
    spec: JobSpec, ds: InputDataset, fp: str, signature: dict[str, Any], t0: float, counts: dict[str, Any]
) -> dict[str, Any]:
    """The job's manifest (what was committed, from which ledgers, when), written atomically; returned."""
    manifest = {
        "job_id": spec.job_id,
        "output": str(spec.output),
        "format": spec.output_format,
        "fingerprint": fp,
        # where each output row's id came from: the input's id column, else its 0-based row position
        "ids": f"column {spec.id_column}" if spec.id_column else "row position",
        **counts,
        "shards": [shard_progress(spec, i, ds) for i in range(spec.shards)],
        "failed_rows": str(spec.paths.failed_rows),
        # why rows failed: top reasons, counts, example rows (jobs.failures), for every view of the run
        "failure_reasons": failure_summary(spec.paths.failed_rows) if counts.get("failed") else None,
        "committed_at": time.time(),
        "commit_seconds": round(time.time() - t0, 3),
        "signature": signature,
    }
    atomic_write_json(spec.paths.manifest, manifest)
    return manifest


def shard_token(spec: JobSpec, i: int, fp: str) -> str:
    """Shard ``i``'s ledger state as its part of a dataset output sees it (12 hex characters): a
    file written for one token holds that shard's rows as the ledger had them."""
    parts = [[p.name, part_size(p)] for p in shard_store(spec, i).parts()]
    details = {
        "fingerprint": fp,
        "shard": i,
        "shards": spec.shards,
        "parts": parts,
        "output": spec.output,
        "input_columns": spec.input_columns,
        "output_columns": spec.output_columns,
    }
    return hash_details(details)[:12]


def write_shard_output(
    spec: JobSpec, i: int, *, parts: dataset_output.PartSizes = dataset_output.PartSizes()
) -> dict[str, Any] | None:
    """Write finished shard ``i``'s part of a dataset output (its job process calls this once its last
    row is answered, in parallel with the other shards), so the commit only publishes; ``parts`` cuts
    its part files. Returns the record, or None for a single-file output."""
    if not dataset_output.is_dataset(spec.output):
        return None
    spec = spec.model_copy(update={"retry_failed": False})
    ds = open_input(spec)
    token = shard_token(spec, i, job_fingerprint(spec, ds))
    return _shard_output(spec, ds, i, token, MergeSizes(_bucket_rows(None), parts=parts))


def _shard_output(
    spec: JobSpec, ds: InputDataset, i: int, token: str, sizes: MergeSizes, *, rewrite: bool = False
) -> dict[str, Any]:
    """Shard ``i``'s part files for ledger state ``token`` and its failed rows: the record of those
    already written, else written now (under the shard's output lock) and recorded once whole."""
    paths = spec.paths.shard(i)
    record = paths.output_record(token)
    with file_lock(paths.output_lock):
        done = None if rewrite else read_json(record)
        if done:
            return dict(done)
        out = storage.parse(spec.output, "output")
        folder = dataset_output.parts_folder(out, token)
        dataset_output.remove_shard_parts(folder, i, token)  # what a killed write cut short
        job = load_job(spec.job, spec.job_kwargs)
        outputs = [c for c in job.outputs if spec.output_columns is None or c in spec.output_columns]
        keep = spec.input_columns if spec.input_columns is not None else ds.schema.names
        counts = {"rows": 0, "ok": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}
        parts = dataset_output.ShardParts(folder, i, token, shard_range(ds.num_rows, i, spec.shards)[0], sizes.parts)
        with atomic_file(paths.output_failed(token)) as tmp, open(tmp, "w") as failed:
            try:
                for merged in _merge_shard(spec, ds, i, keep, outputs, sizes):
                    _count(merged, counts, failed)
                    parts.write(_output_batch(job.finish_batch(merged)))
                files = parts.close()
            except BaseException:
                parts.abort()
                raise
        for old in paths.root.glob("output-*"):  # records of older ledger states
            if token not in old.name:
                old.unlink(missing_ok=True)
        done = {"shard": i, "token": token, **counts, "files": files}
        atomic_write_json(record, done)
        return done


def _dataset_manifest(spec: JobSpec, fp: str, commit_id: str, shards: list[dict[str, Any]]) -> dict[str, Any]:
    files = [f for s in shards for f in s["files"]]
    sums = {k: sum(int(s[k]) for s in shards) for k in ("rows", "ok", "failed", "prompt_tokens", "completion_tokens")}
    return {
        "layout": dataset_output.LAYOUT,
        "job_id": spec.job_id,
        "fingerprint": fp,
        "commit": commit_id,
        "position_column": dataset_output.POSITION_COLUMN,
        **sums,
        "bytes": sum(int(f["bytes"]) for f in files),
        "files": files,
        "committed_at": time.time(),
    }


def _output_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A merged batch as the parquet output holds it (``_id`` and ledger internals dropped)."""
    return batch.drop_columns([c for c in ("_id", *BATCH_COLUMNS) if c in batch.schema.names])


_KEPT = (
    "The commit published nothing; every answered row is kept in the ledger: fix this and commit again "
    "(a rerun of the job commits without sending its rows again)."
)


def _as_new_file(path: Path) -> None:
    """Give a temp file (0600) the mode a new file of the user's gets: 0666 less the user's umask
    (:func:`~prefect_swarm.paths.user_umask`: prefect-swarm's own processes run with 077)."""
    os.chmod(path, 0o666 & ~user_umask())


@dataclass(frozen=True)
class Verdict:
    """Whether a committed job succeeded: its failed fraction against ``max_failed_fraction``."""

    succeeded: bool
    rows: int
    ok: int
    failed: int
    max_failed_fraction: float
    failed_rows: str | None
    """The failed-rows file (JSONL: id, error)."""

    @property
    def failed_fraction(self) -> float:
        """Failed rows / rows (0 for an empty job)."""
        return self.failed / self.rows if self.rows else 0.0

    def message(self) -> str:
        """One line for people: counts, the threshold, where the failed rows are."""
        counts = f"{self.rows} rows: {self.ok} ok, {self.failed} failed ({self.failed_fraction:.2%})"
        where = f"; failed rows in {self.failed_rows}" if self.failed and self.failed_rows else ""
        if self.succeeded:
            return f"succeeded: {counts}, within max_failed_fraction {self.max_failed_fraction:g}{where}"
        return (
            f"failed: {counts}, more than max_failed_fraction {self.max_failed_fraction:g}{where}. "
            "Rerun only the failed rows (`prefect-swarm job retry JOB_ID`, or the batch_inference flow with "
            "retry_failed=True), or raise max_failed_fraction."
        )


def manifest_verdict(manifest: Mapping[str, Any], max_failed_fraction: float) -> Verdict:
    """The verdict on a commit's manifest: succeeded when failed / rows <= ``max_failed_fraction``."""
    rows, failed = int(manifest.get("rows") or 0), int(manifest.get("failed") or 0)
    ok = int(manifest.get("ok", rows - failed) or 0)
    fraction = failed / rows if rows else 0.0
    return Verdict(
        succeeded=fraction <= max_failed_fraction,
        rows=rows,
        ok=ok,
        failed=failed,
        max_failed_fraction=max_failed_fraction,
        failed_rows=manifest.get("failed_rows"),
    )


def _count(merged: pa.RecordBatch, counts: dict[str, int], failed: TextIO) -> None:
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
        failed.writelines(json.dumps({"id": r["_id"], "error": r["error"]}) + "\n" for r in rows)


def _merge_shard(
    spec: JobSpec, ds: InputDataset, i: int, keep: list[str], outputs: list[str], sizes: MergeSizes
) -> Iterator[pa.RecordBatch]:
    """The shard's input rows, in order, each joined with its latest ledger row."""
    start, end = shard_range(ds.num_rows, i, spec.shards)
    if start == end:
        return
    extra = ["_id", *outputs, *RESULT_COLUMNS] + (BATCH_COLUMNS if spec.output_format == "openai-batch" else [])
    cols = keep if keep else None
    buckets = _ledger_in_order(spec, i, extra, start, end, sizes)
    lo = hi = start
    ledger: pa.Table | None = None
    pos = np.zeros(0, dtype=np.int64)
    try:
        for first, batch in ds.iter_range(start, end, cols, spec.read_batch_rows):
            off = 0
            while off < batch.num_rows:
                row = first + off
                while row >= hi:
                    ledger = None  # drop the last bucket before loading the next one
                    lo, hi, ledger, pos = next(buckets)
                assert ledger is not None
                n = min(batch.num_rows - off, hi - row)
                taken = ledger.take(pa.array(pos[row - lo : row - lo + n]))  # a copy: the bucket can go
                arrays = [*batch.slice(off, n).columns, *(taken.column(c).combine_chunks() for c in extra)]
                yield pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *extra])
                off += n
    finally:
        buckets.close()  # removes the temp bucket files now, also on error


def _ledger_in_order(
    spec: JobSpec, i: int, extra: list[str], start: int, end: int, sizes: MergeSizes
) -> Generator[tuple[int, int, pa.Table, np.ndarray], None, None]:
    """Yield ``(lo, hi, bucket, pos)`` covering ``[start, end)`` in order.

    ``bucket`` holds ``extra`` of ledger rows; ``pos[k]`` is the position of row ``lo + k``'s last write.
    """
    store = shard_store(spec, i)
    parts = store.parts()
    if not parts:
        raise JobError(f"shard {i} of job {spec.job_id} has no ledger in {store.where}.")
    columns = ["_row", *extra]  # not latency_ms, attempts, unused outputs
    schema, row_bytes = _parts_schema(parts, columns)
    size = max(1, min(sizes.bucket_rows, BUCKET_BYTES // max(row_bytes, 1)))
    nbuckets = math.ceil((end - start) / size)
    with tempfile.TemporaryDirectory(prefix=spec.paths.COMMIT_TMP_PREFIX, dir=spec.paths.root) as tmp:
        for g0 in range(0, nbuckets, sizes.open_buckets):
            group = range(g0, min(g0 + sizes.open_buckets, nbuckets))
            files = _split_parts(parts, schema, Path(tmp), start, end, size, group)
            for b in group:
                lo, hi = start + b * size, min(end, start + (b + 1) * size)
                yield (lo, hi, *_load_bucket(files.get(b), i, extra, lo, hi))
                if b in files:
                    files[b].unlink()


def _parts_schema(parts: Sequence[Part], columns: list[str]) -> tuple[pa.Schema, int]:
    """The parts' common schema of ``columns`` (types promoted as when reading the ledger) and bytes per row."""
    schemas, nbytes, nrows = [], 0, 0
    for p in parts:
        with pq.ParquetFile(part_source(p)) as pf:
            meta = pf.metadata
            schemas.append(pf.schema_arrow)
            nrows += meta.num_rows
            for rg in range(meta.num_row_groups):
                group = meta.row_group(rg)
                for c in range(group.num_columns):
                    chunk = group.column(c)
                    if chunk.path_in_schema.split(".")[0] in columns:
                        nbytes += chunk.total_uncompressed_size
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise JobError(f"ledger parts in {parts[0].parent} lack columns {missing}; rerun the shard.")
    return pa.schema([schema.field(c) for c in columns]), math.ceil(nbytes / max(nrows, 1))


def _split_parts(
    parts: Sequence[Part], schema: pa.Schema, tmp: Path, start: int, end: int, size: int, group: range
) -> dict[int, Path]:
    """One pass over the parts, in order: append each row of a bucket in ``group`` to that bucket's file."""
    files: dict[int, Path] = {}
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    try:
        for p in parts:
            table = pq.read_table(part_source(p), columns=schema.names)
            if table.schema != schema:
                table = table.cast(schema)
            rows = table.column("_row").to_numpy()
            bucket = (rows - start) // size
            sel = np.nonzero((rows >= start) & (rows < end) & (bucket >= group.start) & (bucket < group.stop))[0]
            if not len(sel):
                continue
            order = sel[np.argsort(bucket[sel], kind="stable")]  # stable: part order kept within a bucket
            ordered = table.take(pa.array(order))
            keys = bucket[order]
            bounds = np.flatnonzero(np.diff(keys)) + 1
            for lo, hi in zip([0, *bounds], [*bounds, len(keys)], strict=True):
                b = int(keys[lo])
                if b not in writers:
                    files[b] = tmp / f"bucket-{b:08d}.arrow"
                    writers[b] = pa.ipc.new_stream(str(files[b]), schema, options=options)
                writers[b].write_table(ordered.slice(lo, hi - lo))
    finally:
        for w in writers.values():
            w.close()
    return files


def _load_bucket(path: Path | None, i: int, extra: list[str], lo: int, hi: int) -> tuple[pa.Table, np.ndarray]:
    """The bucket file's ``extra`` columns and, for each row of ``[lo, hi)``, the position of its last write."""
    if path is None:
        raise JobError(f"shard {i} ledger lacks row {lo} (and maybe more); rerun the shard.")
    with pa.ipc.open_stream(str(path)) as reader:
        table = reader.read_all()
    pos = latest_positions(table.column("_row").to_numpy(), lo, hi)
    if (pos < 0).any():
        missing = int(np.nonzero(pos < 0)[0][0]) + lo
        raise JobError(f"shard {i} ledger lacks row {missing} (and maybe more); rerun the shard.")
    return table.select(extra), pos


class _Writer(Protocol):
    """An output format: opened on the temp path, fed record batches in input order, closed."""

    def open(self, path: Path | pa.NativeFile) -> None: ...

    def write(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class _ParquetWriter:
    """Parquet output: input columns + outputs + status, error, tokens (``_id`` and internals dropped)."""

    def open(self, path: Path | pa.NativeFile) -> None:
        self.path = path
        self.writer: dataset_output.RowGroupWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        batch = _output_batch(batch)
        if self.writer is None:  # row groups of up to ROW_GROUP_ROWS rows / about ROW_GROUP_BYTES
            self.writer = dataset_output.RowGroupWriter(self.path, batch.schema)
        self.writer.write(batch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _JsonlWriter:
    """OpenAI Batch output, line for line as OpenAI writes it: ``{id, custom_id, response, error}``.

    - an answered request (200 or an HTTP error such as 400/404) has ``response: {status_code,
      request_id, body}`` and ``error: null``; an HTTP error's body is the engine's JSON error as it
      came (shortened as valid JSON past 64 KiB), or ``{"error": {"message": ...}}`` when it was not JSON;
    - a row with no HTTP answer (refused before sending, e.g. ``stream: true``; a connection error;
      an answer that could not be parsed or broke the response schema) has ``response: null`` and
      ``error: {code, message}`` with code ``invalid_request``, ``request_failed`` or ``invalid_response``.

    ``id`` is ``batch_req_<uuid>``, new for each line of each commit (unique per batch run, as
    OpenAI's); ``request_id`` is the engine's response id for a success, else ``req_<uuid>``. A name
    ending in ``.gz`` is written gzip-compressed.
    """

    def __init__(self, gz: bool = False) -> None:
        self.gz = gz

    def open(self, path: Path | pa.NativeFile) -> None:
        if not isinstance(path, Path):  # a stream to an object store (see storage.publish_file)
            self.fh: TextIO | _TextSink = _TextSink(path, self.gz)
            return
        self.fh = (
            gzip.open(path, "wt", encoding="utf-8") if self.gz else open(path, "w", encoding="utf-8")  # noqa: SIM115
        )

    def write(self, batch: pa.RecordBatch) -> None:
        cols = {c: batch.column(c).to_pylist() for c in ("_id", "status", "error", *BATCH_COLUMNS)}
        lines = []
        for k, cid in enumerate(cols["_id"]):
            response, error = batch_line_result(
                ok=cols["status"][k] == "ok",
                raw=cols[RAW_COLUMN][k],
                http_status=int(cols["http_status"][k] or 0),
                attempts=int(cols["attempts"][k] or 0),
                error=cols["error"][k],
            )
            line = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": cid, "response": response, "error": error}
            lines.append(json.dumps(line, separators=(",", ":")))
        self.fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self.fh.close()


class _TextSink:
    """Text written as UTF-8 to a binary stream (gzip-compressed with ``gz``); closing leaves the stream open."""

    def __init__(self, sink: pa.NativeFile, gz: bool) -> None:
        self.sink = sink
        self.gz = gzip.GzipFile(fileobj=sink, mode="wb") if gz else None

    def write(self, text: str) -> None:
        (self.gz or self.sink).write(text.encode("utf-8"))

    def close(self) -> None:
        if self.gz is not None:
            self.gz.close()


def batch_line_result(
    *, ok: bool, raw: str | None, http_status: int, attempts: int, error: str | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(response, error)`` of one OpenAI Batch output line (see :class:`_JsonlWriter`)."""
    if ok:
        body = json.loads(raw) if raw else None
        request_id = (body or {}).get("id") or f"req_{uuid.uuid4().hex}"
        return {"status_code": 200, "request_id": request_id, "body": body}, None
    if http_status and http_status != 200:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": {"message": raw or error, "type": "error", "param": None, "code": http_status}}
        return {"status_code": http_status, "request_id": f"req_{uuid.uuid4().hex}", "body": body}, None
    code = "invalid_response" if http_status == 200 else ("request_failed" if attempts else "invalid_request")
    return None, {"code": code, "message": error}
