"""One shard's ledger (its checkpoint): part files of finished rows, progress, fingerprint, DONE.

Each flush writes ``part-<seq>.parquet`` to a temp name and renames it (atomic), then rewrites
``progress.json``. A part holds, per finished row: ``_row`` (global row index, the join key),
``_id`` (the row's id as text), the job's outputs, ``status`` (ok|error), ``error``,
``http_status``, ``prompt_tokens``, ``completion_tokens``, ``latency_ms``, ``attempts`` (and
``_response``, the raw body, when the output format is openai-batch). A row may appear in
several parts (a retry of an error row, a rerun after a crash between flush and exit): the
last write wins, in part order.

A kill -9 loses only rows finished since the last completed flush (a part still being written
is not one); they are redone on resume.

Resume reads a compact progress index, not every part: after each part, ``index.json`` records
the rows done as a position k (every row before it is done), the done rows past k (a few: those
that finished out of order), the rows whose latest answer is an error, the token sums and the
first part number it does not cover. A resume loads the index and replays only the parts written
after it (one or two, those a kill -9 left behind the index), so its first request goes out in
seconds at any size, and its memory holds no per-row array. Without a usable index (another
fingerprint or row range, a ledger written before the index existed) every part is replayed,
one at a time.

Parts are compacted so their number stays bounded, size-tiered: a part's level is its rows in
powers of ``COMPACT_EVERY`` above ``COMPACT_BASE_ROWS``; once ``COMPACT_EVERY`` parts of one level
end the ledger, they are merged (the latest write of each row kept, streamed batch by batch) into
one part under the last one's number, written whole (atomic rename, or one object), and then the
merged ones are deleted; a kill -9 in between leaves rows twice, which the part order resolves
(the last write wins). A part of ``COMPACT_PART_ROWS`` rows or more is left as it is. So a shard
of R rows keeps at most about R / ``COMPACT_PART_ROWS`` + ``COMPACT_EVERY`` x levels parts (~60 at
1e8 rows, not ~10^5), and each row is rewritten about once per level. Merged parts are all before
the index's first uncovered part, so a resume never re-reads them.

While requests run, :meth:`ShardLedger.flush_in_background` hands the write (parquet encoding,
fsync, rename, progress) to a writer thread so the event loop keeps serving responses (an fsync
on a busy disk took up to 0.5 s); at most ``MAX_PENDING_WRITES`` parts wait for it (the next
flush then waits), parts are written in order, nothing is written after a failed write, and its
error is re-raised by every later flush, so no DONE marker can follow a lost part.

Where the ledger lives (:func:`shard_store`): by default in the job folder (:class:`LocalShard`,
the files above); with the spec's ``ledger`` set, on an object store (:class:`ObjectShard`,
``<ledger>/<shard>/``): every part is one object written under its final key in one upload (an
object store shows an upload whole or not at all, so a kill -9 mid-write leaves nothing), the
progress, fingerprint and DONE marker are objects overwritten whole, parts are found by listing
the prefix. The shard's lock and logs stay in the job folder either way (see :class:`ShardLock`).
"""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from prefect_swarm.exceptions import FingerprintMismatch, ShardBusy
from prefect_swarm.jobs.checkpoint.fingerprint import describe_changes
from prefect_swarm.jobs.columns import BASE_FIELDS, RAW_COLUMN
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import (
    ShardPaths,
    atomic_file,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    private_dir,
    read_json,
)

STATUS_OK, STATUS_ERROR = "ok", "error"
EARLIER_ERRORS = " | earlier: "
"""Joins a retried row's new error to the error it had before (``job retry``, the flow's
``retry_failed``): a row failing again keeps every run's reason, newest first, in its one ``error``
(the output's and the failed-rows file's); a row answered on the retry has none (status ok)."""
RECOVERED_REASONS = 20
"""Distinct reasons counted for rows answered on a retry after failing before (the rest: ``OTHER_REASONS``)."""
OTHER_REASONS = "other reasons"
MAX_PENDING_WRITES = 2
"""Parts queued for the writer thread at most (each ``checkpoint_every`` rows or fewer)."""
_Cut = tuple[list["RowResult"], int | None, dict[str, Any] | None, dict[str, Any]]
"""What the writer thread writes: rows, their part number, the index, the progress (no index: the progress only)."""
PROGRESS_EVERY_S = 2.0
"""Seconds between two progress files a running shard writes between its checkpoints (see
``Ledger.progress_in_background``): progress is not a checkpoint; `job status` and the flow's progress
artifact move this often."""
COMPACT_EVERY = 16
"""This many parts of one level at the end of the ledger are merged into one (see the module's docstring)."""
COMPACT_BASE_ROWS = 50_000
"""Parts under this many rows are level 0; each level above holds ``COMPACT_EVERY`` times more."""
COMPACT_PART_ROWS = 1_000_000
"""A part of this many rows or more is never merged again (a merge holds 8 bytes per merged row)."""


@dataclass(slots=True)
class RowResult:
    """What became of one row: the record :meth:`ShardLedger.add` buffers (one ledger line)."""

    row: int
    """Global row index (the join key of the commit)."""
    rid: str
    """The row's id as text."""
    status: str
    """``ok`` or ``error``."""
    error: str | None = None
    """Why the row failed (None when ok)."""
    http_status: int = 0
    """Status of the last answer (0: none, e.g. a connection error or no request sent)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    """Latency of the last attempt."""
    attempts: int = 0
    """Requests sent for the row."""
    outputs: Mapping[str, Any] | None = None
    """The job's output values (None for an error row)."""
    raw: str | None = None
    """The raw response body (kept only for the OpenAI Batch output format)."""

    @classmethod
    def refused(cls, row: int, rid: str, error: str) -> RowResult:
        """An error row for which no request was sent."""
        return cls(row, rid, STATUS_ERROR, error)


def ledger_schema(outputs: Mapping[str, pa.DataType], keep_raw: bool) -> pa.Schema:
    """Schema of a part file for a job with ``outputs``."""
    fields = [*BASE_FIELDS, *outputs.items()]
    if keep_raw:
        fields.append((RAW_COLUMN, pa.string()))
    return pa.schema(fields)


@dataclass(frozen=True)
class ObjectPart:
    """A committed part on an object store (what :meth:`ObjectShard.parts` lists)."""

    fs: pafs.FileSystem
    path: str
    size: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rsplit("/", 1)[0]


Part = Path | ObjectPart
"""A committed part file: a local path, or an object."""


def part_source(part: Part) -> Path | pa.NativeFile:
    """What pyarrow reads ``part`` from."""
    return part if isinstance(part, Path) else part.fs.open_input_file(part.path)


def part_size(part: Part) -> int:
    """Bytes of ``part``."""
    return part.stat().st_size if isinstance(part, Path) else part.size


class LocalShard:
    """A shard's ledger in the job folder (the default): files written to a temp name and renamed."""

    def __init__(self, paths: ShardPaths) -> None:
        self.paths = paths

    @property
    def where(self) -> str:
        return str(self.paths.root)

    def parts(self) -> list[Path]:
        return self.paths.parts()

    def next_seq(self) -> int:
        return self.paths.next_seq()

    def prepare(self) -> None:
        """Create the folder; remove temp files left by a kill -9 mid-write."""
        private_dir(self.paths.root)
        for tmp in self.paths.temp_files():
            tmp.unlink(missing_ok=True)

    def read_json(self, name: str) -> Any:
        return read_json(self.paths.root / name)

    def read_text(self, name: str) -> str | None:
        try:
            return (self.paths.root / name).read_text()
        except FileNotFoundError:
            return None

    def write_json(self, name: str, data: Any) -> None:
        atomic_write_json(self.paths.root / name, data)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.paths.root / name, text)

    def write_part(self, seq: int, data: bytes) -> None:
        atomic_write_bytes(self.paths.part(seq), data)

    @contextmanager
    def part_file(self, seq: int) -> Iterator[Path]:
        """A temp file to write part ``seq`` into; renamed into place when the block ends without error."""
        with atomic_file(self.paths.part(seq)) as tmp:
            yield tmp

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.paths.root / name).unlink(missing_ok=True)


class ObjectShard:
    """A shard's ledger on an object store (``<ledger>/<shard>/``): one object per file, one upload each.

    Names are those of :class:`~prefect_swarm.paths.ShardPaths`; ``paths`` (the shard's folder in the
    job folder) keeps the lock and logs.
    """

    def __init__(self, loc: storage.Location, paths: ShardPaths) -> None:
        self.loc, self.paths, self.fs = loc, paths, loc.fs

    @property
    def where(self) -> str:
        return self.loc.uri

    def _key(self, name: str) -> str:
        return f"{self.loc.path.rstrip('/')}/{name}"

    def parts(self) -> list[ObjectPart]:
        found = self.fs.get_file_info(pafs.FileSelector(self.loc.path, allow_not_found=True))
        names = {Path(i.path).name: i for i in found if i.is_file}
        keep = sorted(n for n in names if Path(n).match(self.paths.parts_glob))
        return [ObjectPart(self.fs, names[n].path, int(names[n].size or 0)) for n in keep]

    def next_seq(self) -> int:
        parts = self.parts()
        return ShardPaths.part_seq(Path(parts[-1].name)) + 1 if parts else 0

    def prepare(self) -> None:
        """A killed upload leaves no object (no folders, no temp keys), but a part bigger than one upload
        part was a multipart upload, left open by a kill -9: abort those under this shard's prefix
        (its own keys only; the shard lock is held)."""
        storage.abort_uploads(self.loc.path.rstrip("/") + "/", self.loc.scheme, lambda _key: True)

    def read_text(self, name: str) -> str | None:
        try:
            with self.fs.open_input_stream(self._key(name), compression=None) as src:
                return bytes(src.read()).decode()
        except FileNotFoundError:
            return None

    def read_json(self, name: str) -> Any:
        text = self.read_text(name)
        try:
            return json.loads(text) if text is not None else None
        except ValueError:
            return None

    def _put(self, name: str, data: bytes) -> None:
        with self.fs.open_output_stream(self._key(name), compression=None) as sink:
            sink.write(data)

    def write_json(self, name: str, data: Any) -> None:
        self._put(name, json.dumps(data, indent=2, sort_keys=True, default=str).encode())

    def write_text(self, name: str, text: str) -> None:
        self._put(name, text.encode())

    def write_part(self, seq: int, data: bytes) -> None:
        self._put(self.paths.part(seq).name, data)

    @contextmanager
    def part_file(self, seq: int) -> Iterator[Path]:
        """A local temp file to write part ``seq`` into; uploaded as the part when the block ends without error."""
        with tempfile.TemporaryDirectory(prefix="prefect-swarm-part-") as tmp:
            path = Path(tmp) / "part.parquet"
            yield path
            with open(path, "rb") as src, self.fs.open_output_stream(self._key(self.paths.part(seq).name)) as sink:
                shutil.copyfileobj(src, sink, 8 << 20)

    def delete(self, names: list[str]) -> None:
        for name in names:
            with suppress(FileNotFoundError):
                self.fs.delete_file(self._key(name))


ShardStore = LocalShard | ObjectShard


def shard_store(spec: JobSpec, i: int) -> ShardStore:
    """Where shard ``i`` of ``spec`` keeps its ledger: the job folder, or ``<spec.ledger>/<shard>/``."""
    paths = spec.paths.shard(i)
    if not spec.ledger:
        return LocalShard(paths)
    return ObjectShard(storage.parse(spec.ledger, "ledger").child(paths.root.name), paths)


def ledger_files(store: ShardStore) -> list[str]:
    """Names of every checkpoint file of ``store``'s shard: its parts, index, progress, fingerprint, DONE."""
    paths = store.paths
    files = [paths.index, paths.progress, paths.fingerprint, paths.done_marker]
    return [*(p.name for p in store.parts()), *(p.name for p in files)]


def discard_ledger(spec: JobSpec) -> None:
    """Delete the checkpoint files of every shard on the object store (``--overwrite``; only the
    ledger's own names, nothing else under the prefix). A local ledger is removed with the job folder."""
    if not spec.ledger:
        return
    for i in range(spec.shards):
        store = shard_store(spec, i)
        store.delete(ledger_files(store))


def _store(where: ShardPaths | ShardStore) -> ShardStore:
    return LocalShard(where) if isinstance(where, ShardPaths) else where


def _level(rows: int, every: int = COMPACT_EVERY) -> int:
    """A part's compaction level: 0 under ``COMPACT_BASE_ROWS`` rows, +1 per ``every`` times more."""
    return 0 if rows < COMPACT_BASE_ROWS else 1 + int(math.log(rows / COMPACT_BASE_ROWS, every))


def _seq_of(part: Part) -> int:
    return ShardPaths.part_seq(Path(part.name))


def read_ledger(where: ShardPaths | ShardStore, columns: list[str] | None = None) -> pa.Table | None:
    """Every part of a shard as one table, in part order (None when there is none)."""
    parts = _store(where).parts()
    if not parts:
        return None
    return pa.concat_tables(
        [pq.read_table(part_source(p), columns=columns) for p in parts], promote_options="permissive"
    )


class _NoPandas:
    """A meta-path finder under which ``import pandas`` fails (see :func:`pyarrow_without_pandas`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def pyarrow_without_pandas() -> bool:
    """Keep pyarrow from importing pandas to build ledger parts; True when it was kept from it.

    The first ``pa.array`` of a Python list imports pandas (~0.3 CPU-s and ~50 MB resident per job
    process) only to ask whether the list is a pandas object; ledger parts are built from lists and
    need no pandas. Called once pandas could not be imported, pyarrow remembers the answer for that
    question, and still imports pandas when asked to convert to or from it (``to_pandas``,
    ``from_pandas``: a DataFrameJob). A process that has imported pandas already is left as it is.
    Only for the job process (:func:`prefect_swarm.jobs.shard.run_shard`): a pandas object passed
    to ``pa.array`` afterwards, before any such conversion, would be read as a plain sequence.
    """
    if "pandas" in sys.modules:
        return False
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([])
    finally:
        sys.meta_path.remove(finder)
    return "pandas" not in sys.modules


def latest_positions(rows: np.ndarray, start: int, end: int) -> np.ndarray:
    """For each row in ``[start, end)``, the index of its last occurrence in ``rows`` (-1 if none)."""
    pos = np.full(end - start, -1, dtype=np.int64)
    rel = rows - start
    keep = (rel >= 0) & (rel < end - start)
    pos[rel[keep]] = np.nonzero(keep)[0]  # numpy assigns in order: the last write wins
    return pos


class DoneRows:
    """Which rows of ``[0, total)`` (shard-relative) are in the ledger, in memory that does not grow with
    the rows done: every row before ``upto`` is, and ``beyond`` holds those done past it (rows finish
    nearly in order, so it stays about as large as the requests in flight)."""

    def __init__(self, total: int, upto: int = 0, beyond: set[int] | None = None) -> None:
        self.total, self.upto, self.beyond = total, upto, beyond or set()

    def __len__(self) -> int:
        return self.upto + len(self.beyond)

    def __contains__(self, rel: int) -> bool:
        return rel < self.upto or rel in self.beyond

    def add(self, rel: int) -> bool:
        """Mark ``rel`` done; True when it was not."""
        if rel < self.upto or rel in self.beyond:
            return False
        if rel != self.upto:
            self.beyond.add(rel)
            return True
        self.upto += 1
        while self.upto in self.beyond:
            self.beyond.remove(self.upto)
            self.upto += 1
        return True

    def add_many(self, rels: np.ndarray) -> int:
        """Mark every row of ``rels`` done; return how many were not (vectorized: a replayed part)."""
        rels = np.unique(rels[rels >= self.upto])
        fresh = rels[~np.isin(rels, np.fromiter(self.beyond, dtype=np.int64, count=len(self.beyond)))]
        merged = np.union1d(fresh, np.fromiter(self.beyond, dtype=np.int64, count=len(self.beyond)))
        run = np.flatnonzero(merged != self.upto + np.arange(merged.size))
        k = int(run[0]) if run.size else int(merged.size)
        self.upto += k
        self.beyond = set(merged[k:].tolist())
        return int(fresh.size)

    def missing(self, lo: int, hi: int) -> np.ndarray:
        """Rows of ``[lo, hi)`` not done, as offsets from ``lo``."""
        if hi <= self.upto:
            return np.empty(0, dtype=np.int64)
        idx = np.arange(max(lo, self.upto), hi, dtype=np.int64)
        if self.beyond:
            idx = idx[~np.isin(idx, np.fromiter(self.beyond, dtype=np.int64, count=len(self.beyond)))]
        return idx - lo


def check_resumable(where: ShardPaths | ShardStore, stamp: dict[str, Any]) -> None:
    """Raise FingerprintMismatch when the checkpoint in ``where`` was written with other settings
    (``stamp``: fingerprint, details, shard, start, end) than the run about to resume it."""
    store = _store(where)
    old = store.read_json(store.paths.fingerprint.name)
    if not old or not store.parts():
        return
    start, end = stamp["start"], stamp["end"]
    same_layout = (old.get("start"), old.get("end")) == (start, end)
    if old.get("fingerprint") == stamp["fingerprint"] and same_layout:
        return
    changes = describe_changes(old.get("details") or {}, stamp["details"])
    if not same_layout:
        changes += f"\n  shard rows: {old.get('start')}..{old.get('end')} -> {start}..{end}"
    raise FingerprintMismatch(
        f"refusing to resume shard {stamp['shard']}: its checkpoint in {store.where} was written with "
        f"different settings:\n{changes}\n"
        "Hint: to discard the checkpoint and start over, submit again with --overwrite "
        "(`prefect-swarm job submit ... --overwrite`, `prefect-swarm job retry ID --overwrite`, or "
        "`python -m prefect_swarm.jobs.run ... --overwrite`); "
        "to keep it, run with the original settings or use another job_dir."
    )


class ShardLock:
    """The one-live-process-per-shard lock: ``flock`` on ``paths.lock``, held for the process's life.

    The lock file holds the holder's pid (for the message). The kernel drops the lock when the
    process ends, however it ends (kill -9 included), so a stale file never blocks a rerun.
    """

    def __init__(self, paths: ShardPaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def acquire(self, what: str) -> None:
        """Take the lock, or raise :class:`ShardBusy` naming ``what`` and the holder's pid."""
        private_dir(self.paths.root)
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ShardBusy(
                f"{what} is already running (pid {pid}); its lock is {self.paths.lock}. "
                "Wait for it (`prefect-swarm job wait`) or stop it (`prefect-swarm job cancel`) first."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the process's exit drops it too)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class ShardLedger:
    """The ledger of shard ``shard`` (rows ``[start, end)``), buffering finished rows until a flush."""

    def __init__(
        self,
        paths: ShardPaths,
        *,
        shard: int,
        nshards: int,
        start: int,
        end: int,
        fingerprint: str,
        details: dict[str, Any],
        outputs: Mapping[str, pa.DataType],
        keep_raw: bool = False,
        store: ShardStore | None = None,
        compact_every: int = COMPACT_EVERY,
    ) -> None:
        """``store``: where the ledger lives (default: ``paths``, the shard's folder in the job folder);
        ``compact_every``: parts of one level merged into one (see the module doc)."""
        self.paths, self.shard, self.nshards = paths, shard, nshards
        self.store: ShardStore = store or LocalShard(paths)
        self.start, self.end = start, end
        self.fingerprint, self.details = fingerprint, details
        self.outputs = list(outputs)
        self.schema = ledger_schema(outputs, keep_raw)
        self.keep_raw = keep_raw
        self.buf: list[RowResult] = []  # finished rows (see add); turned into columns at flush
        self._writer: threading.Thread | None = None
        self._queue: queue.Queue[_Cut | None] | None
        self._queue = None
        self._write_error: BaseException | None = None
        self.seen = DoneRows(end - start)  # rows in the ledger (shard-relative)
        self.errors: set[int] = set()  # rows whose latest status is error
        self.retry: set[int] = set()  # error rows sent again on this run (retry_failed), until answered
        self.earlier: dict[int, str] = {}  # the latest error of each row in retry, kept in its next error
        self.recovered: dict[str, int] = {}
        """Rows answered on a retry after failing before, by the reason they last failed with (every run
        of the ledger; kept in the index and shown in the progress: the output has no column for it)."""
        self._retry_sorted = np.empty(0, dtype=np.int64)
        self._parts: list[tuple[int, int]] = []  # (seq, rows) of the parts on the store, in order
        self.compact_every = compact_every
        self.compactions = 0
        self.replayed = 0
        """Parts read row by row when the ledger was opened (those its index does not cover)."""
        self.n_done = self.n_failed = self.prompt_tokens = self.completion_tokens = 0
        self.requests = 0
        self.seq = 0
        self.started = time.time()
        self.rows_this_run = 0
        self.last_flush = time.monotonic()
        self.progress_extra: dict[str, Any] = {}
        """Added to every progress file (the job process's ``metrics_url``)."""

    # ------------------------------------------------------------------ open
    def open(self, *, overwrite: bool = False, retry_failed: bool = False) -> None:
        """Check the fingerprint, load what is done; with ``overwrite`` discard the old ledger first."""
        private_dir(self.paths.root)
        self.store.prepare()  # drops temp files left by a kill -9 mid-write
        if overwrite:
            self.discard()
        self._check_fingerprint()
        self.store.write_json(self.paths.fingerprint.name, self._stamp())
        self._load(retry_failed)

    def discard(self) -> None:
        """Remove every part, the index, the progress, the fingerprint and the DONE marker."""
        self.store.delete(ledger_files(self.store))

    def _stamp(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "details": self.details,
            "shard": self.shard,
            "nshards": self.nshards,
            "start": self.start,
            "end": self.end,
        }

    def _check_fingerprint(self) -> None:
        check_resumable(self.store, self._stamp())

    def _load(self, retry_failed: bool) -> None:
        """What is done: the index, then the parts it does not cover (every part without one)."""
        parts = self.store.parts()
        self.seq = _seq_of(parts[-1]) + 1 if parts else 0
        first, known = self._load_index() if parts else (0, {})
        if not set(known) <= {_seq_of(part) for part in parts}:  # parts the index counts are gone: replay all
            first, known = 0, {}
            self.seen, self.errors, self.prompt_tokens, self.completion_tokens = DoneRows(self.total), set(), 0, 0
        for part in parts:
            seq = _seq_of(part)
            rows = self._replay(part) if seq >= first else known.get(seq)
            if rows is None:  # a part the index does not list (a merge killed before its deletes)
                rows = pq.read_metadata(part_source(part)).num_rows
            self._parts.append((seq, rows))
        self.n_done, self.n_failed = len(self.seen), len(self.errors)
        if retry_failed:
            self.retry = set(self.errors)
            self._retry_sorted = np.array(sorted(self.retry), dtype=np.int64)
            self.earlier = self._latest_errors() if self.retry else {}

    def _latest_errors(self) -> dict[int, str]:
        """The latest error of each row to retry (shard-relative), from the parts in order (a retry
        reads the ``_row`` and ``error`` columns of every part once; its memory holds the error rows only)."""
        found: dict[int, str] = {}
        for part in self.store.parts():
            table = pq.read_table(part_source(part), columns=["_row", "error"])
            rel = table.column("_row").to_numpy() - self.start
            hit = np.flatnonzero(np.isin(rel, self._retry_sorted))
            errors = table.column("error").take(pa.array(hit)).to_pylist()
            found.update((int(r), e) for r, e in zip(rel[hit].tolist(), errors, strict=True) if e)
        return found

    def _load_index(self) -> tuple[int, dict[int, int]]:
        """Take the state the index records (when written for this fingerprint and row range); return the
        first part number it does not cover (0: replay every part) and the rows of the parts it lists."""
        index = self.store.read_json(self.paths.index.name)
        if not isinstance(index, dict):
            return 0, {}
        if (index.get("fingerprint"), index.get("start"), index.get("end")) != (self.fingerprint, self.start, self.end):
            return 0, {}
        try:
            self.seen = DoneRows(self.total, int(index["upto"]), {int(r) for r in index["beyond"]})
            self.errors = {int(r) for r in index["errors"]}
            self.prompt_tokens, self.completion_tokens = int(index["prompt_tokens"]), int(index["completion_tokens"])
            self.recovered = {str(k): int(v) for k, v in (index.get("recovered") or {}).items()}
            return int(index["next_part"]), {int(seq): int(rows) for seq, rows in index.get("parts") or []}
        except (KeyError, TypeError, ValueError):
            self.seen, self.errors, self.prompt_tokens, self.completion_tokens = DoneRows(self.total), set(), 0, 0
            return 0, {}

    def _replay(self, part: Part) -> int:
        """Apply one part's rows (in order: the last write of a row wins) to the state."""
        self.replayed += 1
        return self._apply(
            pq.read_table(part_source(part), columns=["_row", "status", "prompt_tokens", "completion_tokens"])
        )

    def _apply(self, table: pa.Table) -> int:
        """Apply ``table``'s rows (ledger columns; the last write of a row wins) to the state; return its rows."""
        rel = table.column("_row").to_numpy() - self.start
        ok = np.asarray(table.column("status").to_numpy(zero_copy_only=False) == STATUS_OK)
        keep = (rel >= 0) & (rel < self.total)
        rel, ok = rel[keep], ok[keep]
        self.seen.add_many(rel)
        last = rel.size - 1 - np.unique(rel[::-1], return_index=True)[1]  # each row's last write
        self.errors.difference_update(rel[last][ok[last]].tolist())
        self.errors.update(rel[last][~ok[last]].tolist())
        self.prompt_tokens += int(np.nansum(table.column("prompt_tokens").to_numpy(zero_copy_only=False)))
        self.completion_tokens += int(np.nansum(table.column("completion_tokens").to_numpy(zero_copy_only=False)))
        return table.num_rows

    def is_done(self, rel: int) -> bool:
        """Row ``rel`` (shard-relative) needs nothing on this run."""
        return rel in self.seen and rel not in self.retry

    def pending(self, lo: int, hi: int) -> np.ndarray:
        """Rows of ``[lo, hi)`` (shard-relative) still to run, as offsets from ``lo``."""
        todo = self.seen.missing(lo, hi)
        if self.retry:
            s = self._retry_sorted
            again = s[np.searchsorted(s, lo) : np.searchsorted(s, hi)]
            again = np.array([r for r in again.tolist() if r in self.retry], dtype=np.int64) - lo
            if again.size:
                todo = np.union1d(todo, again)
        return todo

    def first_pending(self) -> int:
        """The first row (shard-relative) this run may still send: every row before it is done."""
        return min(self.seen.upto, min(self.retry, default=self.total))

    @property
    def n_left(self) -> int:
        """Rows this run still has to send."""
        return self.total - len(self.seen) + len(self.retry)

    @property
    def total(self) -> int:
        """Rows this shard owns."""
        return self.end - self.start

    @property
    def complete(self) -> bool:
        """Every row of the shard is in the ledger (ok, or error unless retrying errors)."""
        return len(self.seen) == self.total and not self.retry

    # ------------------------------------------------------------------ write
    def add(self, result: RowResult) -> None:
        """Buffer one finished row (flushed by :meth:`flush`)."""
        self.buf.append(result)
        rel = result.row - self.start
        earlier = self.earlier.pop(rel, None)
        if earlier and result.status != STATUS_OK:  # an earlier run's reason is kept, never overwritten
            result.error = f"{result.error or 'error'}{EARLIER_ERRORS}{earlier}"
        elif earlier:  # answered now: its output has no error, the reason it had is counted
            self._recovered(earlier)
        self.retry.discard(rel)
        if self.seen.add(rel):
            self.n_done += 1
        if result.status != STATUS_OK:
            if rel not in self.errors:
                self.errors.add(rel)
                self.n_failed += 1
        elif rel in self.errors:
            self.errors.discard(rel)
            self.n_failed -= 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.rows_this_run += 1

    def _recovered(self, earlier: str) -> None:
        reason = earlier.split(EARLIER_ERRORS, 1)[0].strip()[:160] or "error"
        if reason not in self.recovered and len(self.recovered) >= RECOVERED_REASONS:
            reason = OTHER_REASONS
        self.recovered[reason] = self.recovered.get(reason, 0) + 1

    @property
    def buffered(self) -> int:
        """Rows finished but not yet flushed."""
        return len(self.buf)

    def flush(self, state: str = "running") -> None:
        """Write buffered rows as one part (temp + rename), then the progress file; return when written."""
        self.join()
        rows, seq, index, progress = self._cut(state)
        try:
            self._write_part(rows, seq)
        except BaseException:  # keep the rows for the next flush, as if this one had not happened
            self.buf[:0] = rows
            self.seq = self.seq if seq is None else seq
            raise
        self._after_part(index, progress)

    def _after_part(self, index: dict[str, Any] | None, progress: dict[str, Any]) -> None:
        """Once a part is written: the index, the progress, then a compaction when one is due (and the
        index again, listing the parts that are left). Runs where the part was written (the writer thread)."""
        if index is None:  # a progress file between checkpoints (progress_in_background)
            self.store.write_json(self.paths.progress.name, progress)
            return
        self.store.write_json(self.paths.index.name, {**index, "parts": [list(p) for p in self._parts]})
        self.store.write_json(self.paths.progress.name, progress)
        if self._maybe_compact():
            self.store.write_json(self.paths.index.name, {**index, "parts": [list(p) for p in self._parts]})

    def flush_in_background(self, state: str = "running") -> None:
        """Like :meth:`flush`, but the write is queued for the writer thread (parts keep their order).

        Waits only when ``MAX_PENDING_WRITES`` parts are already queued (a disk slower than the
        requests), so memory stays bounded; raises the error of an earlier failed write.
        """
        self._writes().put(self._cut(state))

    def progress_in_background(self) -> None:
        """Queue a progress file of the rows answered so far, the buffered ones included (``checkpointed``:
        the rows in the ledger's parts). Not a checkpoint: the buffer stays; queued behind the parts, so
        the file never goes back."""
        self._writes().put(([], None, None, self._progress("running")))

    def _writes(self) -> queue.Queue[_Cut | None]:
        """The writer thread's queue (the thread started on first use); raises an earlier failed write's error."""
        if self._write_error is not None:
            raise self._write_error
        if self._writer is None:
            self._queue = queue.Queue(maxsize=MAX_PENDING_WRITES)
            self._writer = threading.Thread(target=self._write_loop, name=f"ledger-{self.shard}", daemon=True)
            self._writer.start()
        assert self._queue is not None
        return self._queue

    def join(self) -> None:
        """Wait until every queued write is on disk; raise a failed one's error (then, and on every later call)."""
        if self._writer is not None and self._queue is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = self._queue = None
        if self._write_error is not None:
            raise self._write_error

    def _write_loop(self) -> None:
        assert self._queue is not None
        q = self._queue
        while (cut := q.get()) is not None:
            if self._write_error is None:  # after a failure nothing more is written: join() reports it
                try:
                    rows, seq, index, progress = cut
                    self._write_part(rows, seq)
                    self._after_part(index, progress)
                except BaseException as exc:  # the part's rows are not on disk
                    self._write_error = exc

    def _cut(self, state: str) -> tuple[list[RowResult], int | None, dict[str, Any], dict[str, Any]]:
        """Take the buffer, a part number for it (None when empty), the index and the progress as of now."""
        rows, self.buf = self.buf, []
        seq = None
        if rows:
            seq, self.seq = self.seq, self.seq + 1
        self.last_flush = time.monotonic()
        return rows, seq, self._index(), self._progress(state)

    def _index(self) -> dict[str, Any]:
        """The progress index as of now: what the parts before ``next_part`` hold (see the module's docstring)."""
        return {
            "fingerprint": self.fingerprint,
            "start": self.start,
            "end": self.end,
            "upto": self.seen.upto,
            "beyond": sorted(self.seen.beyond),
            "errors": sorted(self.errors),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "next_part": self.seq,
            "recovered": dict(self.recovered),
        }

    def _write_part(self, rows: list[RowResult], seq: int | None) -> None:
        if rows and seq is not None:
            sink = io.BytesIO()
            pq.write_table(self._table(rows), sink, compression="zstd")
            self.store.write_part(seq, sink.getvalue())
            self._parts.append((seq, len(rows)))

    def append_part(self, table: pa.Table, *, index: bool = True) -> None:
        """Write ``table`` (rows in the ledger's schema) as the next part, as a flush of those rows would:
        the state, the part, then (``index``) the index, the progress and a due compaction. A bulk path
        for rows made elsewhere (benchmarks build a synthetic ledger with it); ``index=False`` leaves the
        index one part behind, as a kill -9 between a part and its index does."""
        self.join()
        seq, self.seq = self.seq, self.seq + 1
        sink = io.BytesIO()
        pq.write_table(table.cast(self.schema), sink, compression="zstd")
        self.store.write_part(seq, sink.getvalue())
        self._parts.append((seq, table.num_rows))
        self._apply(table)
        self.n_done, self.n_failed = len(self.seen), len(self.errors)
        if index:
            self._after_part(self._index(), self._progress("running"))

    def _maybe_compact(self) -> bool:
        """Merge the parts that end the ledger while ``compact_every`` of them share a level (cascading);
        True when a merge happened."""
        merged = False
        while self._parts and self._parts[-1][1] < COMPACT_PART_ROWS:
            level = _level(self._parts[-1][1], self.compact_every)
            run = 0
            while run < len(self._parts) and self._parts[-1 - run][1] < COMPACT_PART_ROWS:
                if _level(self._parts[-1 - run][1], self.compact_every) != level:
                    break
                run += 1
            if run < self.compact_every:
                break
            self.compact(run)
            merged = True
        return merged

    def compact(self, count: int) -> None:
        """Merge the last ``count`` parts into one under the last one's number (each row's latest write
        kept), then delete the others. Memory: the merged rows' ``_row`` (8 bytes each) and one batch."""
        group = self._parts[-count:]
        names = {p.name: p for p in self.store.parts()}
        parts = [names[self.paths.part(seq).name] for seq, _ in group]
        rows = [pq.read_table(part_source(p), columns=["_row"]).column("_row").to_numpy() for p in parts]
        allrows = np.concatenate(rows)
        keep = np.zeros(allrows.size, dtype=bool)
        keep[allrows.size - 1 - np.unique(allrows[::-1], return_index=True)[1]] = True
        last, offset = group[-1][0], 0
        with self.store.part_file(last) as tmp, pq.ParquetWriter(tmp, self.schema, compression="zstd") as writer:
            for part in parts:  # the merged part replaces the last one whole (rename, or one upload)
                for batch in pq.ParquetFile(part_source(part)).iter_batches(batch_size=65_536):
                    mask = pa.array(keep[offset : offset + batch.num_rows])
                    offset += batch.num_rows
                    writer.write_table(pa.Table.from_batches([batch]).filter(mask).cast(self.schema))
        self.store.delete([self.paths.part(seq).name for seq, _ in group[:-1]])
        self._parts[-count:] = [(last, int(keep.sum()))]
        self.compactions += 1

    def _table(self, rows: list[RowResult]) -> pa.Table:
        data: dict[str, Any] = {
            "_row": [r.row for r in rows],
            "_id": [r.rid for r in rows],
            "status": [r.status for r in rows],
            "error": [r.error for r in rows],
            "http_status": [r.http_status for r in rows],
            "prompt_tokens": [r.prompt_tokens for r in rows],
            "completion_tokens": [r.completion_tokens for r in rows],
            "latency_ms": [r.latency_ms for r in rows],
            "attempts": [r.attempts for r in rows],
        }
        for name in self.outputs:
            data[name] = [r.outputs.get(name) if r.outputs else None for r in rows]
        if self.keep_raw:
            data[RAW_COLUMN] = [r.raw for r in rows]
        return pa.Table.from_pydict(data, schema=self.schema)

    def write_progress(self, state: str) -> None:
        """Rewrite ``progress.json`` (what `job status` and the Prefect task show)."""
        self.join()
        self.store.write_json(self.paths.progress.name, self._progress(state))

    def _progress(self, state: str) -> dict[str, Any]:
        elapsed = max(time.time() - self.started, 1e-9)
        return {
            "shard": self.shard,
            "nshards": self.nshards,
            "state": state,
            "pid": os.getpid(),
            "total": self.total,
            "done": self.n_done,
            "checkpointed": self.n_done - len(self.buf),  # the rest is answered, not yet in the ledger
            "failed": self.n_failed,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "rows_this_run": self.rows_this_run,
            "recovered": sum(self.recovered.values()),
            "recovered_reasons": dict(self.recovered),
            "requests": self.requests,
            "rate_rows_s": round(self.rows_this_run / elapsed, 2),
            "started_at": self.started,
            "updated_at": time.time(),
            **self.progress_extra,
        }

    def mark_done(self) -> None:
        """Write the DONE marker (holding the fingerprint it is valid for)."""
        self.join()
        self.store.write_text(self.paths.done_marker.name, self.fingerprint)
