"""The input dataset: open, validate before any request, and stream a row range by record batches.

Parquet (a file or a folder of ``*.parquet``) is read with pyarrow one row group at a time, so
memory stays bounded whatever the input size. JSONL in the OpenAI Batch input format
(``custom_id``, ``method``, ``url``, ``body``) is read line by line into batches with columns
``custom_id``, ``method``, ``url`` and ``body`` (the body as JSON text).

Every problem raises :class:`DatasetError` naming the file and, where it applies, the column.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.exceptions import DatasetError
from prefect_swarm.jobs.spec import is_jsonl

_BATCH_COLUMNS = ("custom_id", "method", "url", "body")
_BATCH_SCHEMA = pa.schema([(c, pa.string()) for c in _BATCH_COLUMNS])


@dataclass(frozen=True)
class InputFile:
    """One input file and the global index of its first row."""

    path: Path
    first_row: int
    num_rows: int


def shard_range(total: int, shard_id: int, nshards: int) -> tuple[int, int]:
    """Rows ``[start, end)`` owned by shard ``shard_id`` of ``nshards``: contiguous and balanced."""
    if not 0 <= shard_id < nshards:
        raise DatasetError(f"shard id {shard_id} is out of range for {nshards} shards.")
    return total * shard_id // nshards, total * (shard_id + 1) // nshards


class InputDataset:
    """A parquet file/folder or an OpenAI Batch JSONL file, opened for validation and streaming."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.kind = "jsonl" if is_jsonl(str(path)) else "parquet"
        self.files = self._open_jsonl() if self.kind == "jsonl" else self._open_parquet()
        self.num_rows = sum(f.num_rows for f in self.files)
        if self.num_rows == 0:
            raise DatasetError(f"input {self.path} has no rows. Nothing to run: check the file.")

    # ------------------------------------------------------------------ open
    def _open_parquet(self) -> list[InputFile]:
        if not self.path.exists():
            raise DatasetError(f"input {self.path} does not exist.")
        paths = sorted(self.path.glob("*.parquet")) if self.path.is_dir() else [self.path]
        if not paths:
            raise DatasetError(f"input folder {self.path} holds no *.parquet file.")
        files, first, schema = [], 0, None
        for p in paths:
            meta = self._meta(p)
            if schema is not None and not meta.schema.to_arrow_schema().equals(schema):
                raise DatasetError(
                    f"input file {p} has a different schema from {paths[0]}:\n{meta.schema.to_arrow_schema()}"
                )
            schema = meta.schema.to_arrow_schema()
            files.append(InputFile(p, first, meta.num_rows))
            first += meta.num_rows
        self.schema: pa.Schema = schema.remove_metadata()  # type: ignore[union-attr]
        return files

    @staticmethod
    def _meta(path: Path) -> pq.FileMetaData:
        try:
            return pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(
                f"input file {path} is not a readable parquet file ({exc}). "
                "Check that it was written completely."
            ) from exc

    def _open_jsonl(self) -> list[InputFile]:
        if not self.path.is_file():
            raise DatasetError(f"input {self.path} does not exist.")
        with open(self.path, "rb") as fh:
            n = sum(1 for line in fh if line.strip())
        self.schema = _BATCH_SCHEMA
        return [InputFile(self.path, 0, n)]

    # ------------------------------------------------------------------ identity
    def identity(self) -> list[dict[str, Any]]:
        """What identifies this input for fingerprints: each file's path, size and mtime."""
        out = []
        for f in self.files:
            st = os.stat(f.path)
            out.append({"path": str(f.path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        return out

    # ------------------------------------------------------------------ validate
    def check_columns(
        self, needed: Mapping[str, str], id_column: str | None, keep: list[str] | None = None
    ) -> None:
        """Refuse missing columns and columns of the wrong kind (see :data:`ColumnKind`)."""
        names = self.schema.names
        for col in [*needed, *([id_column] if id_column else []), *(keep or [])]:
            if col not in names:
                raise DatasetError(
                    f"input {self.path}: column '{col}' is missing (columns: {', '.join(names)}). "
                    "Rename the column or point the job at another one (job_kwargs / id_column)."
                )
        for col, kind in needed.items():
            typ = self.schema.field(col).type
            if not _kind_ok(kind, typ):
                raise DatasetError(
                    f"input {self.path}: column '{col}' has type {typ}, but the job needs {kind} "
                    f"({_KIND_HELP[kind]})."
                )
        if id_column:
            typ = self.schema.field(id_column).type
            if not (pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                raise DatasetError(
                    f"input {self.path}: id column '{id_column}' has type {typ}; use integers or strings."
                )

    def check_unique_ids(self, id_column: str | None) -> None:
        """Refuse null or duplicate ids, streaming the id column (memory: 8 bytes per row).

        Ids are reduced to 64-bit hashes, sorted, and only the values behind equal hashes are
        compared, so a 2M-row input costs ~16 MB, not a hash table of every id.
        """
        if not id_column:
            return
        hashes = np.empty(self.num_rows, dtype=np.int64)
        pos = 0
        for _, batch in self.iter_range(0, self.num_rows, [id_column], 65536):
            arr = batch.column(0)
            if arr.null_count:
                raise DatasetError(f"input {self.path}: id column '{id_column}' has empty (null) values.")
            hashes[pos : pos + len(arr)] = _id_hashes(arr)
            pos += len(arr)
        hashes.sort()
        same = hashes[1:][hashes[1:] == hashes[:-1]]
        if same.size:
            self._confirm_duplicates(id_column, set(same.tolist()))

    def _confirm_duplicates(self, id_column: str, suspects: set[int]) -> None:
        seen: set[object] = set()
        dups: set[object] = set()
        for _, batch in self.iter_range(0, self.num_rows, [id_column], 65536):
            arr = batch.column(0)
            for h, v in zip(_id_hashes(arr).tolist(), arr.to_pylist(), strict=True):
                if h in suspects:
                    (dups if v in seen else seen).add(v)
        if dups:
            example = min(dups, key=str)
            raise DatasetError(
                f"input {self.path}: id column '{id_column}' has {len(dups)} duplicated values "
                f"(e.g. {example!r}). Ids must be unique: dedupe the input, "
                "or drop id_column to use row numbers."
            )

    # ------------------------------------------------------------------ stream
    def iter_range(
        self, start: int, end: int, columns: list[str] | None, batch_rows: int
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Yield ``(global index of first row, batch)`` covering rows ``[start, end)`` in order."""
        if self.kind == "jsonl":
            yield from self._iter_jsonl(start, end, columns, batch_rows)
            return
        for f in self.files:
            lo, hi = max(start, f.first_row), min(end, f.first_row + f.num_rows)
            if lo < hi:
                yield from self._iter_parquet(f, lo, hi, columns, batch_rows)

    def _iter_parquet(
        self, f: InputFile, lo: int, hi: int, columns: list[str] | None, batch_rows: int
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        pf = pq.ParquetFile(f.path)
        meta, first = pf.metadata, f.first_row
        for rg in range(meta.num_row_groups):
            rg_rows = meta.row_group(rg).num_rows
            rg_lo, rg_hi = first, first + rg_rows
            first = rg_hi
            if rg_hi <= lo or rg_lo >= hi:
                continue
            pos = rg_lo
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[rg], columns=columns):
                b_lo, b_hi = max(pos, lo), min(pos + batch.num_rows, hi)
                if b_lo < b_hi:
                    yield b_lo, batch.slice(b_lo - pos, b_hi - b_lo)
                pos += batch.num_rows

    def _iter_jsonl(
        self, start: int, end: int, columns: list[str] | None, batch_rows: int
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        cols = list(columns or _BATCH_COLUMNS)
        rows: dict[str, list[Any]] = {c: [] for c in cols}
        first, idx = start, 0
        with open(self.path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                if idx >= end:
                    break
                if idx >= start:
                    rec = self._parse_line(line, lineno)
                    for c in cols:
                        rows[c].append(rec[c])
                    if len(rows[cols[0]]) >= batch_rows:
                        yield first, _jsonl_batch(rows, cols)
                        first += len(rows[cols[0]])
                        rows = {c: [] for c in cols}
                idx += 1
        if rows[cols[0]]:
            yield first, _jsonl_batch(rows, cols)

    def _parse_line(self, line: bytes, lineno: int) -> dict[str, Any]:
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"input {self.path} line {lineno} is not JSON ({exc}).") from exc
        if not isinstance(rec, dict) or "custom_id" not in rec or not isinstance(rec.get("body"), dict):
            raise DatasetError(
                f"input {self.path} line {lineno}: an OpenAI Batch line needs "
                "'custom_id' and a 'body' object."
            )
        return {
            "custom_id": str(rec["custom_id"]),
            "method": str(rec.get("method") or "POST"),
            "url": str(rec.get("url") or "/v1/chat/completions"),
            "body": json.dumps(rec["body"], separators=(",", ":")),
        }


def _id_hashes(arr: pa.Array) -> np.ndarray:
    """64-bit hashes of ids: integers as they are, strings by Python's hash (stable within a process)."""
    if pa.types.is_integer(arr.type):
        return np.asarray(arr.cast(pa.int64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.fromiter((hash(v) for v in arr.to_pylist()), dtype=np.int64, count=len(arr))


def _jsonl_batch(rows: dict[str, list[Any]], cols: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(rows[c], type=pa.string()) for c in cols], names=cols)


def _kind_ok(kind: str, typ: pa.DataType) -> bool:
    is_str = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if kind == "string":
        return is_str
    if kind == "messages":
        return is_str or (
            (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_struct(typ.value_type)
        )
    if kind == "json":
        return is_str or pa.types.is_struct(typ) or pa.types.is_map(typ)
    if kind == "number":
        return pa.types.is_integer(typ) or pa.types.is_floating(typ)
    return True


_KIND_HELP = {
    "string": "a string column",
    "messages": "a list of {role, content} structs, or a string holding that list as JSON",
    "json": "a struct/map, or a string holding a JSON object",
    "number": "an integer or float column",
    "any": "any type",
}
