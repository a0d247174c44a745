"""The input dataset: open, validate before any request, and stream a row range by record batches.

Parquet (a file or a folder of ``*.parquet``, its pages compressed or not) is read with pyarrow
one row group at a time, so memory stays bounded whatever the input size. JSONL in the OpenAI
Batch input format (``custom_id``, ``method``, ``url``, ``body``), plain or gzip-compressed
(``.jsonl.gz``, or gzip bytes whatever the name), is read line by line into batches with columns
``custom_id``, ``method``, ``url`` and ``body`` (the body as JSON text). Other compressions of a
whole file (zstd, bzip2, xz, gzip around a parquet file) are refused with that reason.

Every problem raises :class:`DatasetError` naming the file and, where it applies, the column,
the line or the row group; a file damaged behind an intact footer is found while streaming and
raises the same error then. :func:`prefect_swarm.jobs.rows.output.check_output_location` refuses an output that would
overwrite or be read back as input, or that cannot be written, before any request.

The input's metadata (files, rows per file, schema, identity, and for a plain JSONL file the byte
offset of every ``JSONL_OFFSET_EVERY``-th line) is read once per job and kept in the job folder
(:func:`open_input`, ``<job_dir>/input.json``): later opens (each shard, `job status`, `wait`, the
flow's watch) check only the files' sizes and mtimes (a stat each, one listing on an object store)
and read no footer; a shard then opens only the files holding its rows, and a JSONL shard seeks to
the indexed line before its first row instead of reading from line 0 (gzip cannot seek: a gzip JSONL
shard still decompresses the lines before its own, without parsing them).
"""

from __future__ import annotations

import base64
import bisect
import gzip
import json
import logging
import os
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from prefect_swarm.exceptions import DatasetError
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.spec import JobSpec, is_jsonl
from prefect_swarm.paths import atomic_write_json, read_json

log = logging.getLogger(__name__)

_BATCH_COLUMNS = ("custom_id", "method", "url", "body")
_BATCH_SCHEMA = pa.schema([(c, pa.string()) for c in _BATCH_COLUMNS])
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The ``url`` values an OpenAI Batch line may have: the engine routes a swarm serves for a batch
(a line without ``url`` goes to the first). Anything else is refused before any request."""
_NOT_PLAIN = ("//", "..", "\\", "?", "#", "%")
_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSIONS = {
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}
_READ_ERRORS = (OSError, EOFError, zlib.error)
"""What reading a damaged gzip stream raises (BadGzipFile is an OSError)."""
INDEX_VERSION = 1
"""Version of the kept input metadata (``input.json``); another version is read afresh."""
JSONL_OFFSET_EVERY = 65_536
"""A plain JSONL input's index keeps the byte offset of every this many rows (~15k offsets per 1e9 rows)."""
ID_PARTITION_ROWS = 4_000_000
"""The id check holds at most about this many 8-byte id hashes at once (32 MB): a larger input's hashes
are spread over partitions (temp files) by hash, and each partition is checked alone."""


def _magic(path: Path | str, fs: pafs.FileSystem | None = None) -> bytes:
    if fs is not None:
        with fs.open_input_stream(str(path), compression=None) as stream:
            return bytes(stream.read(8))
    with open(path, "rb") as fh:
        return fh.read(8)


def _whole_file_compression(path: Path | str, fs: pafs.FileSystem | None = None) -> str | None:
    """``gzip``, ``zstd``, ``bzip2``, ``xz`` or ``zip`` when the file's bytes are one of those; else None."""
    head = _magic(path, fs)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    return next((name for magic, name in _OTHER_COMPRESSIONS.items() if head.startswith(magic)), None)


@dataclass(frozen=True)
class InputFile:
    """One input file and the global index of its first row."""

    path: Path
    """The file (on an object store: its ``bucket/key`` as a path, read through the dataset's filesystem)."""
    first_row: int
    num_rows: int


def shard_range(total: int, shard_id: int, nshards: int) -> tuple[int, int]:
    """Rows ``[start, end)`` owned by shard ``shard_id`` of ``nshards``: contiguous and balanced."""
    if not 0 <= shard_id < nshards:
        raise DatasetError(f"shard id {shard_id} is out of range for {nshards} shards.")
    return total * shard_id // nshards, total * (shard_id + 1) // nshards


class InputDataset:
    """A parquet file/folder or an OpenAI Batch JSONL file, opened for validation and streaming."""

    def __init__(
        self, path: str | Path, *, kept: Mapping[str, Any] | None = None, offset_every: int = JSONL_OFFSET_EVERY
    ) -> None:
        """Open the input at ``path``, reading its metadata (footers; a JSONL file whole); with ``kept``
        (:meth:`record` of an earlier open), take the metadata from there instead (see :meth:`for_job`).
        A plain JSONL file's byte offset is indexed every ``offset_every`` rows."""
        self.source = str(path)
        self.offset_every = offset_every
        self.location = storage.parse(path, "input")
        self.fs: pafs.FileSystem | None = self.location.fs if self.location.remote else None
        """The object store's filesystem (None for a local input: read with plain file calls)."""
        self.path = Path(self.location.path)
        self.where = self.location.text if self.fs is not None else str(self.path)
        """The input as named in messages."""
        self.kind = "jsonl" if is_jsonl(str(path)) else "parquet"
        self.compression: str | None = None
        """``gzip`` for a gzip-compressed JSONL file."""
        self.line_offsets: list[tuple[int, int, int]] = []
        """A plain JSONL file's index: (row, byte offset, line number) of every ``offset_every``-th row."""
        self._identity: list[dict[str, Any]] | None = None
        if kept is not None:
            self._restore(kept)
            return
        if self.fs is not None:
            with storage.refusing(self.location, "input", "read"):  # bad keys, endpoint: one message
                self.files = self._open_remote()
        else:
            self.files = self._open_jsonl() if self.kind == "jsonl" else self._open_parquet()
        self.num_rows = sum(f.num_rows for f in self.files)
        if self.num_rows == 0:
            raise DatasetError(f"input {self.where} has no rows. Nothing to run: check the file.")

    # ------------------------------------------------------------------ open
    def _missing(self) -> str:
        return (
            f"input {self.where} does not exist. Give the job's input (the `input` parameter, `--input`) "
            "as an existing parquet file or folder, or a JSONL file; a relative path is taken from the "
            "working folder of the process that runs the job (a Prefect worker's is temporary: use an "
            "absolute path or a URL)."
        )

    def _open_parquet(self) -> list[InputFile]:
        if not self.path.exists():
            raise DatasetError(self._missing())
        paths = sorted(self.path.glob("*.parquet")) if self.path.is_dir() else [self.path]
        return self._parquet_files(paths)

    def _parquet_files(self, paths: list[Path]) -> list[InputFile]:
        if not paths:
            raise DatasetError(f"input folder {self.where} holds no *.parquet file.")
        files, first, schema = [], 0, None
        for p in paths:
            meta = self._meta(p)
            if schema is not None and not meta.schema.to_arrow_schema().equals(schema):
                raise DatasetError(
                    f"input file {self._name(p)} has a different schema from {self._name(paths[0])}:\n"
                    f"{meta.schema.to_arrow_schema()}"
                )
            schema = meta.schema.to_arrow_schema()
            files.append(InputFile(p, first, meta.num_rows))
            first += meta.num_rows
        self.schema: pa.Schema = schema.remove_metadata()  # type: ignore[union-attr]
        return files

    def _open_remote(self) -> list[InputFile]:
        """The input on an object store: one file, or (parquet) a folder of ``*.parquet`` keys."""
        assert self.fs is not None
        info = self.location.info()
        if info.type == pafs.FileType.NotFound:
            raise DatasetError(
                f"input {self.where} does not exist (or the credentials in the environment cannot see it)."
            )
        if self.kind == "jsonl":
            is_file = info.type == pafs.FileType.File
            return self._jsonl_file(is_file, _whole_file_compression(self.path, self.fs) if is_file else None)
        if info.type == pafs.FileType.Directory:
            found = self.fs.get_file_info(pafs.FileSelector(self.location.path))
            paths = sorted(Path(i.path) for i in found if i.is_file and i.path.endswith(".parquet"))
        else:
            paths = [self.path]
        return self._parquet_files(paths)

    def _meta(self, path: Path) -> pq.FileMetaData:
        try:
            return pq.read_metadata(str(path), filesystem=self.fs) if self.fs is not None else pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            if self.fs is not None:
                packed = _whole_file_compression(path, self.fs)
            else:
                packed = _whole_file_compression(path) if path.is_file() else None
            if packed:
                raise DatasetError(
                    f"input file {self._name(path)} is a {packed}-compressed file, not a parquet file. Parquet "
                    "compresses its pages itself: decompress the file (a .parquet file is read "
                    "whatever its page compression), or give a JSONL input a .jsonl or .jsonl.gz name."
                ) from exc
            raise DatasetError(
                f"input file {self._name(path)} is not a readable parquet file ({exc}). "
                "Check that it was written completely."
            ) from exc

    def _open_jsonl(self) -> list[InputFile]:
        if not self.path.exists():
            raise DatasetError(self._missing())
        is_file = self.path.is_file()
        return self._jsonl_file(is_file, _whole_file_compression(self.path) if is_file else None)

    def _jsonl_file(self, is_file: bool, compression: str | None) -> list[InputFile]:
        """The one file of a JSONL input (local or remote), plain or gzip-compressed."""
        if not is_file:
            raise DatasetError(f"input {self.where} is not a file: a JSONL input is one file.")
        self.compression = compression
        if compression not in (None, "gzip"):
            raise DatasetError(
                f"input {self.where} is {compression}-compressed; JSONL inputs are read plain or "
                "gzip-compressed (.jsonl.gz). Decompress it, or recompress it with gzip."
            )
        self.schema = _BATCH_SCHEMA
        return [InputFile(self.path, 0, self._count_lines())]

    def _count_lines(self) -> int:
        """Rows (non-empty lines) of the JSONL file, in one pass that also indexes a plain file's line offsets."""
        n, lineno, pos = 0, 0, 0
        offsets: list[tuple[int, int, int]] = []
        plain = self.compression is None
        with self._open_lines() as fh:
            try:
                for lineno, line in enumerate(fh, 1):
                    if line.strip():
                        if plain and n % self.offset_every == 0:
                            offsets.append((n, pos, lineno))
                        n += 1
                    pos += len(line)
            except _READ_ERRORS as exc:
                raise self._damaged(lineno + 1, exc) from exc
        self.line_offsets = offsets
        return n

    def _name(self, path: Path) -> str:
        """A file of the input as named in messages (``s3://bucket/key`` on an object store)."""
        return f"{self.location.scheme}://{path}" if self.fs is not None else str(path)

    def _open_parquet_file(self, path: Path) -> pq.ParquetFile:
        if self.fs is not None:
            return pq.ParquetFile(self.fs.open_input_file(str(path)))
        return pq.ParquetFile(path)

    def _open_lines(self, offset: int = 0) -> BinaryIO:
        """The JSONL file's bytes, decompressed when they are gzip; a plain file from byte ``offset``."""
        if offset:
            if self.fs is not None:
                fh = cast(BinaryIO, self.fs.open_input_file(str(self.path)))
            else:
                fh = open(self.path, "rb")  # noqa: SIM115 - the caller's with-block closes it
            fh.seek(offset)
            return fh
        if self.fs is not None:
            stream = cast(BinaryIO, self.fs.open_input_stream(str(self.path), compression=None))
            return cast(BinaryIO, gzip.GzipFile(fileobj=stream)) if self.compression == "gzip" else stream
        if self.compression == "gzip":
            return cast(BinaryIO, gzip.open(self.path, "rb"))
        return open(self.path, "rb")

    def _damaged(self, lineno: int, exc: BaseException) -> DatasetError:
        return DatasetError(
            f"input {self.where}: the gzip stream is damaged at line {lineno} "
            f"({type(exc).__name__}: {exc}). Check that the file was written and copied completely."
        )

    # ------------------------------------------------------------------ identity
    def identity(self) -> list[dict[str, Any]]:
        """What identifies this input for fingerprints: each file's path, size and mtime (looked up once
        per open: a stat per file, one listing for a folder on an object store)."""
        if self._identity is None:
            self._identity = self._current_identity()
        return self._identity

    def _current_identity(self) -> list[dict[str, Any]]:
        out = []
        if self.fs is not None:
            if len(self.files) > 1:  # a folder: one listing, not a request per file
                found = self.fs.get_file_info(pafs.FileSelector(self.location.path))
                infos = {i.path: i for i in found if i.is_file}
            else:
                infos = {str(self.files[0].path): self.fs.get_file_info(str(self.files[0].path))}
            for f in self.files:
                info = infos.get(str(f.path))
                size, mtime = (info.size, info.mtime_ns) if info is not None and info.is_file else (None, None)
                out.append({"path": self._name(f.path), "size": size, "mtime_ns": mtime})
            return out
        for f in self.files:
            try:
                st = os.stat(f.path)
            except FileNotFoundError:
                out.append({"path": str(f.path.resolve()), "size": None, "mtime_ns": None})
                continue
            out.append({"path": str(f.path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        return out

    # ------------------------------------------------------------------ kept metadata
    def record(self) -> dict[str, Any]:
        """The metadata a later open takes instead of reading footers (see :meth:`for_job`)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema):
            pass
        return {
            "version": INDEX_VERSION,
            "input": self.source,
            "kind": self.kind,
            "compression": self.compression,
            "num_rows": self.num_rows,
            "files": [[str(f.path), f.first_row, f.num_rows] for f in self.files],
            "schema": base64.b64encode(sink.getvalue().to_pybytes()).decode(),
            "identity": self.identity(),
            "line_offsets": [list(o) for o in self.line_offsets],
        }

    def _restore(self, kept: Mapping[str, Any]) -> None:
        schema_bytes = base64.b64decode(kept["schema"])
        self.schema = pa.ipc.open_stream(schema_bytes).schema
        self.compression = kept.get("compression")
        self.files = [InputFile(Path(p), int(first), int(n)) for p, first, n in kept["files"]]
        self.num_rows = int(kept["num_rows"])
        self.line_offsets = [(int(r), int(b), int(ln)) for r, b, ln in kept.get("line_offsets") or []]

    @classmethod
    def for_job(cls, path: str | Path, kept_at: Path | None, *, offset_every: int = JSONL_OFFSET_EVERY) -> InputDataset:
        """The input with its metadata read once per job: taken from ``kept_at`` (``<job_dir>/input.json``)
        when that describes this input and its files still have the sizes and mtimes it recorded (no
        footer read); else opened afresh (``offset_every``: see the constructor) and recorded there
        (when the job folder exists)."""
        kept = read_json(kept_at) if kept_at is not None else None
        if isinstance(kept, dict) and kept.get("version") == INDEX_VERSION and kept.get("input") == str(path):
            try:
                ds = cls(path, kept=kept)
            except (KeyError, TypeError, ValueError, pa.ArrowException):
                ds = None  # an unreadable record: read the input afresh
            if ds is not None and ds.identity() == kept.get("identity"):
                return ds
        ds = cls(path, offset_every=offset_every)
        if kept_at is not None and kept_at.parent.is_dir():
            with suppress(OSError):
                atomic_write_json(kept_at, ds.record())
        return ds

    # ------------------------------------------------------------------ validate
    def check_columns(self, needed: Mapping[str, str], id_column: str | None, keep: list[str] | None = None) -> None:
        """Refuse missing columns and columns of the wrong kind (see :data:`ColumnKind`)."""
        names = self.schema.names
        for col in [*needed, *([id_column] if id_column else []), *(keep or [])]:
            if col not in names:
                raise DatasetError(
                    f"input {self.where}: column '{col}' is missing (columns: {', '.join(names)}). "
                    "Rename the column or point the job at another one (job_kwargs / id_column)."
                )
        for col, kind in needed.items():
            typ = self.schema.field(col).type
            if not _kind_ok(kind, typ):
                raise DatasetError(
                    f"input {self.where}: column '{col}' has type {typ}, but the job needs {kind} ({_KIND_HELP[kind]})."
                )
        if id_column:
            typ = self.schema.field(id_column).type
            if not (pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                raise DatasetError(
                    f"input {self.where}: id column '{id_column}' has type {typ}; use integers or strings."
                )

    def check_has_values(self, columns: list[str]) -> None:
        """Refuse a column the job needs whose every value is null (a row with a null is an error row)."""
        if self.kind == "jsonl":
            return  # every line has its url and body (checked line by line)
        for col in columns:
            if self.null_count(col) >= self.num_rows:
                raise DatasetError(
                    f"input {self.where}: column '{col}' is empty: every one of its {self.num_rows} values "
                    "is null, so no row has anything to send. Fill the column, or point the job at "
                    "another one (job_kwargs)."
                )

    def null_count(self, column: str) -> int:
        """Null values of ``column``: from the files' statistics when they have them, else by a scan."""
        total = 0
        for f in self.files:
            counted = _stats_null_count(self._meta(f.path), column)
            if counted is None:
                break
            total += counted
        else:
            return total
        return sum(b.column(0).null_count for _, b in self.iter_range(0, self.num_rows, [column], 65536))

    def check_unique_ids(self, id_column: str | None, partition_rows: int = ID_PARTITION_ROWS) -> None:
        """Refuse null or duplicate ids, streaming the id column in bounded memory.

        Ids are reduced to 64-bit hashes, and only the values behind equal hashes are compared. Up to
        ``partition_rows`` rows the hashes are sorted in memory (8 bytes per row); a larger input's
        hashes go to ``ceil(rows / partition_rows)`` temp files by hash (equal ids, equal hash, same
        file), each sorted alone, so memory stays ~8 bytes x ``partition_rows`` at any size.
        """
        if not id_column:
            return
        nparts = -(-self.num_rows // max(1, partition_rows))
        if nparts <= 1:
            hashes, pos = np.empty(self.num_rows, dtype=np.int64), 0
            for batch in self._id_hash_batches(id_column):
                hashes[pos : pos + batch.size] = batch
                pos += batch.size
            suspects, sizes = _equal_hashes(hashes), [hashes.size]
        else:
            suspects, sizes = self._partitioned_suspects(id_column, nparts)
        log.debug(
            "checked %d ids of %s in %d partition(s), at most %d in memory at once",
            sum(sizes),
            self.where,
            len(sizes),
            max(sizes),
        )
        if suspects:
            self._confirm_duplicates(id_column, suspects)

    def _id_hash_batches(self, id_column: str) -> Iterator[np.ndarray]:
        for _, batch in self.iter_range(0, self.num_rows, [id_column], 65536):
            arr = batch.column(0)
            if arr.null_count:
                raise DatasetError(f"input {self.where}: id column '{id_column}' has empty (null) values.")
            yield _id_hashes(arr)

    def _partitioned_suspects(self, id_column: str, nparts: int) -> tuple[set[int], list[int]]:
        """Hashes seen more than once, from ``nparts`` temp files the hashes are spread over by value;
        and how many hashes each file held (each sorted alone: what was in memory at once)."""
        suspects: set[int] = set()
        sizes: list[int] = []
        with tempfile.TemporaryDirectory(prefix="prefect-swarm-ids-") as tmp:
            files = [open(Path(tmp) / f"{k}.i8", "wb") for k in range(nparts)]  # noqa: SIM115 - closed below
            try:
                for hashes in self._id_hash_batches(id_column):
                    which = (hashes.view(np.uint64) % np.uint64(nparts)).astype(np.int64)
                    order = np.argsort(which, kind="stable")
                    bounds = np.searchsorted(which[order], np.arange(nparts + 1))
                    for k in range(nparts):
                        if bounds[k] < bounds[k + 1]:
                            hashes[order[bounds[k] : bounds[k + 1]]].tofile(files[k])
            finally:
                for fh in files:
                    fh.close()
            for k in range(nparts):
                hashes = np.fromfile(Path(tmp) / f"{k}.i8", dtype=np.int64)
                sizes.append(hashes.size)
                suspects |= _equal_hashes(hashes)
        return suspects, sizes

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
                f"input {self.where}: id column '{id_column}' has {len(dups)} duplicated values "
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
        pf = self._open_parquet_file(f.path)
        meta, first = pf.metadata, f.first_row
        for rg in range(meta.num_row_groups):
            rg_rows = meta.row_group(rg).num_rows
            rg_lo, rg_hi = first, first + rg_rows
            first = rg_hi
            if rg_hi <= lo or rg_lo >= hi:
                continue
            pos = rg_lo
            batches = pf.iter_batches(batch_size=batch_rows, row_groups=[rg], columns=columns)
            while True:
                try:
                    batch = next(batches, None)
                except (pa.ArrowException, OSError) as exc:
                    raise DatasetError(
                        f"input file {self._name(f.path)}: row group {rg} (rows {rg_lo}..{rg_hi - 1}) cannot be read: "
                        f"{type(exc).__name__}: {exc}. The file is damaged; rewrite it from its source. "
                        "Rows answered before this one are kept in the ledger."
                    ) from exc
                if batch is None:
                    break
                b_lo, b_hi = max(pos, lo), min(pos + batch.num_rows, hi)
                if b_lo < b_hi:
                    yield b_lo, batch.slice(b_lo - pos, b_hi - b_lo)
                pos += batch.num_rows

    def _iter_jsonl(
        self, start: int, end: int, columns: list[str] | None, batch_rows: int
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        cols = list(columns or _BATCH_COLUMNS)
        rows: dict[str, list[Any]] = {c: [] for c in cols}
        first, idx, lineno, offset = start, 0, 0, 0
        k = bisect.bisect_right(self.line_offsets, (start, 1 << 62, 0)) - 1
        if k >= 0:  # seek to the indexed row at or before ``start``
            idx, offset, lineno = self.line_offsets[k][0], self.line_offsets[k][1], self.line_offsets[k][2] - 1
        with self._open_lines(offset) as fh:
            lines = iter(fh)
            while True:
                try:
                    line = next(lines, None)
                except _READ_ERRORS as exc:
                    raise self._damaged(lineno + 1, exc) from exc
                lineno += 1
                if line is None or idx >= end:
                    break
                if not line.strip():
                    continue
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
        """One line as the row it becomes; a line that is not a valid OpenAI Batch line (no JSON, no
        ``custom_id`` string, no ``body`` object, a method other than POST, a ``url`` that is not one of
        :data:`BATCH_URLS`) raises DatasetError naming the line: nothing of the input is sent."""
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"input {self.where} line {lineno} is not JSON ({exc}).") from exc
        if not isinstance(rec, dict) or "custom_id" not in rec or not isinstance(rec.get("body"), dict):
            raise DatasetError(
                f"input {self.where} line {lineno}: an OpenAI Batch line needs 'custom_id' and a 'body' object."
            )
        problem = batch_line_problem(rec)
        if problem:
            raise DatasetError(f"input {self.where} line {lineno}: {problem}")
        return {
            "custom_id": rec["custom_id"],
            "method": "POST",
            "url": rec.get("url", BATCH_URLS[0]),
            "body": json.dumps(rec["body"], separators=(",", ":")),
        }


def batch_line_problem(rec: Mapping[str, Any]) -> str | None:
    """Why an OpenAI Batch line cannot be sent as it is (None: it can): its ``custom_id`` is not a
    non-empty string, its ``method`` is not POST, or its ``url`` is not one of :data:`BATCH_URLS`."""
    cid = rec.get("custom_id")
    if not isinstance(cid, str) or not cid.strip():
        got = "null" if cid is None else f"{type(cid).__name__} {_short(cid)}"
        return f"'custom_id' must be a non-empty string (got {got}). Give every line a unique string id."
    return batch_method_problem(rec.get("method", "POST")) or batch_url_problem(rec.get("url", BATCH_URLS[0]))


def batch_method_problem(method: object) -> str | None:
    """Why ``method`` is not a batch line's method (None for POST, in any case)."""
    if isinstance(method, str) and method.upper() == "POST":
        return None
    return (
        f"'method' {_short(method)} is not supported: a batch line is sent as a POST (the only method of "
        'the OpenAI Batch format). Set "method": "POST".'
    )


def batch_url_problem(url: object) -> str | None:
    """Why ``url`` is not a batch line's url (None when it is one of :data:`BATCH_URLS`).

    Requests only ever go to the swarm: a url is a path among the routes it serves, never an
    absolute URL, a host (``@host:port/...``) or a path that walks elsewhere (``//``, ``..``)."""
    if isinstance(url, str) and url in BATCH_URLS:
        return None
    if not isinstance(url, str):
        why = "is not a path"
    elif "://" in url or "@" in url:
        why = "names a host (an absolute URL, or '@'); requests only go to the swarm, so the url is a path on it"
    elif not url.startswith("/"):
        why = "does not start with '/'"
    elif any(c in url for c in _NOT_PLAIN) or not url.isprintable() or " " in url:
        why = "is not a plain path (no '//', '..', query, escape or space)"
    else:
        why = "is not a route the swarm serves for batch lines"
    return f"'url' {_short(url)} {why}. Use one of {', '.join(BATCH_URLS)}."


def _short(value: object, n: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _stats_null_count(meta: pq.FileMetaData, column: str) -> int | None:
    """Nulls of a top-level flat column from a file's row-group statistics (None when unknown)."""
    names = [meta.schema.column(j).path for j in range(meta.num_columns)]
    if column not in names:  # nested (a list of structs...): leaf statistics do not count rows
        return None
    j, total = names.index(column), 0
    for rg in range(meta.num_row_groups):
        stats = meta.row_group(rg).column(j).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def _id_hashes(arr: pa.Array) -> np.ndarray:
    """64-bit hashes of ids: integers as they are, strings by Python's hash (stable within a process)."""
    if pa.types.is_integer(arr.type):
        return np.asarray(arr.cast(pa.int64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.fromiter((hash(v) for v in arr.to_pylist()), dtype=np.int64, count=len(arr))


def _equal_hashes(hashes: np.ndarray) -> set[int]:
    """Values occurring more than once in ``hashes`` (sorted in place)."""
    hashes.sort()
    return set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())


def open_input(spec: JobSpec) -> InputDataset:
    """``spec``'s input, its metadata kept with the job (``<job_dir>/input.json``, see
    :meth:`InputDataset.for_job`); read afresh when the spec has no job folder yet."""
    return InputDataset.for_job(spec.input, spec.paths.input_index if spec.job_dir else None)


def input_rows(spec: JobSpec) -> int:
    """Rows of ``spec``'s input as its kept metadata records them (no file of the input is touched; what
    `job status`, `wait` and the flow's watch read on every poll); the input is opened when none is kept."""
    kept = read_json(spec.paths.input_index) if spec.job_dir else None
    if isinstance(kept, dict) and kept.get("version") == INDEX_VERSION and kept.get("input") == str(spec.input):
        with suppress(KeyError, TypeError, ValueError):
            return int(kept["num_rows"])
    return open_input(spec).num_rows


def _jsonl_batch(rows: dict[str, list[Any]], cols: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(rows[c], type=pa.string()) for c in cols], names=cols)


def _kind_ok(kind: str, typ: pa.DataType) -> bool:
    is_str = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if kind == "string":
        return is_str
    if kind == "messages":
        return is_str or ((pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_struct(typ.value_type))
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
