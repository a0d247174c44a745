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
import os
import queue
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from prefect_swarm.exceptions import ConfigError, FingerprintMismatch
from prefect_swarm.jobs import storage
from prefect_swarm.jobs.fingerprint import describe_changes
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import (
    ShardPaths,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
)

STATUS_OK, STATUS_ERROR = "ok", "error"
MAX_PENDING_WRITES = 2
"""Parts queued for the writer thread at most (each ``checkpoint_every`` rows or fewer)."""


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


BASE_FIELDS: list[tuple[str, pa.DataType]] = [
    ("_row", pa.int64()),
    ("_id", pa.string()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("http_status", pa.int16()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("latency_ms", pa.float32()),
    ("attempts", pa.int16()),
]
RAW_COLUMN = "_response"
"""Ledger column of the raw response body (kept for the OpenAI Batch output)."""
RESERVED_COLUMNS: tuple[str, ...] = (*(name for name, _ in BASE_FIELDS), RAW_COLUMN)
"""Names the ledger and the output own: no job output, response schema field or kept input column may
use one (refused before any request, with this list)."""


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
        self.paths.root.mkdir(parents=True, exist_ok=True)
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


def discard_ledger(spec: JobSpec) -> None:
    """Delete the checkpoint files of every shard on the object store (``--overwrite``; only the
    ledger's own names, nothing else under the prefix). A local ledger is removed with the job folder."""
    if not spec.ledger:
        return
    for i in range(spec.shards):
        store = shard_store(spec, i)
        files = [store.paths.progress, store.paths.fingerprint, store.paths.done_marker]
        store.delete([*(p.name for p in store.parts()), *(p.name for p in files)])


def _store(where: ShardPaths | ShardStore) -> ShardStore:
    return LocalShard(where) if isinstance(where, ShardPaths) else where


def read_ledger(where: ShardPaths | ShardStore, columns: list[str] | None = None) -> pa.Table | None:
    """Every part of a shard as one table, in part order (None when there is none)."""
    parts = _store(where).parts()
    if not parts:
        return None
    return pa.concat_tables(
        [pq.read_table(part_source(p), columns=columns) for p in parts], promote_options="permissive"
    )


def latest_positions(rows: np.ndarray, start: int, end: int) -> np.ndarray:
    """For each row in ``[start, end)``, the index of its last occurrence in ``rows`` (-1 if none)."""
    pos = np.full(end - start, -1, dtype=np.int64)
    rel = rows - start
    keep = (rel >= 0) & (rel < end - start)
    pos[rel[keep]] = np.nonzero(keep)[0]  # numpy assigns in order: the last write wins
    return pos


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


class ShardBusy(ConfigError):
    """Another live process holds the shard's lock: one process per shard (exit 2, nothing touched)."""


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
        self.paths.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
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
    ) -> None:
        """``store``: where the ledger lives (default: ``paths``, the shard's folder in the job folder)."""
        self.paths, self.shard, self.nshards = paths, shard, nshards
        self.store: ShardStore = store or LocalShard(paths)
        self.start, self.end = start, end
        self.fingerprint, self.details = fingerprint, details
        self.outputs = list(outputs)
        self.schema = ledger_schema(outputs, keep_raw)
        self.keep_raw = keep_raw
        self.buf: list[RowResult] = []  # finished rows (see add); turned into columns at flush
        self._writer: threading.Thread | None = None
        self._queue: queue.Queue[tuple[list[RowResult], int | None, dict[str, Any]] | None] | None = None
        self._write_error: BaseException | None = None
        self.done = np.zeros(end - start, dtype=bool)  # rows to skip on this run
        self.seen = np.zeros(end - start, dtype=bool)  # rows in the ledger
        self.err = np.zeros(end - start, dtype=bool)  # rows whose latest status is error
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
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.store.prepare()  # drops temp files left by a kill -9 mid-write
        if overwrite:
            self.discard()
        self._check_fingerprint()
        self.store.write_json(self.paths.fingerprint.name, self._stamp())
        self._load(retry_failed)

    def discard(self) -> None:
        """Remove every part, the progress, the fingerprint and the DONE marker."""
        files = [self.paths.progress, self.paths.fingerprint, self.paths.done_marker]
        self.store.delete([*(p.name for p in self.store.parts()), *(p.name for p in files)])

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
        table = read_ledger(self.store, ["_row", "status", "prompt_tokens", "completion_tokens"])
        self.seq = self.store.next_seq()
        if table is None:
            return
        rows = table.column("_row").to_numpy()
        pos = latest_positions(rows, self.start, self.end)
        seen = pos >= 0
        ok = np.zeros_like(seen)
        status = np.asarray(table.column("status").to_numpy(zero_copy_only=False) == STATUS_OK)
        ok[seen] = status[pos[seen]]
        self.seen, self.err = seen, seen & ~ok
        self.done = ok if retry_failed else seen.copy()
        self.n_done = int(seen.sum())
        self.n_failed = int(self.err.sum())
        self.prompt_tokens = int(np.nansum(table.column("prompt_tokens").to_numpy(zero_copy_only=False)))
        self.completion_tokens = int(np.nansum(table.column("completion_tokens").to_numpy(zero_copy_only=False)))

    @property
    def total(self) -> int:
        """Rows this shard owns."""
        return self.end - self.start

    @property
    def complete(self) -> bool:
        """Every row of the shard is in the ledger (ok, or error unless retrying errors)."""
        return bool(self.done.all())

    # ------------------------------------------------------------------ write
    def add(self, result: RowResult) -> None:
        """Buffer one finished row (flushed by :meth:`flush`)."""
        self.buf.append(result)
        rel = result.row - self.start
        self.done[rel] = True
        if not self.seen[rel]:
            self.seen[rel] = True
            self.n_done += 1
        is_err = result.status != STATUS_OK
        if is_err != self.err[rel]:
            self.err[rel] = is_err
            self.n_failed += 1 if is_err else -1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.rows_this_run += 1

    @property
    def buffered(self) -> int:
        """Rows finished but not yet flushed."""
        return len(self.buf)

    def flush(self, state: str = "running") -> None:
        """Write buffered rows as one part (temp + rename), then the progress file; return when written."""
        self.join()
        rows, seq, progress = self._cut(state)
        try:
            self._write_part(rows, seq)
        except BaseException:  # keep the rows for the next flush, as if this one had not happened
            self.buf[:0] = rows
            self.seq = self.seq if seq is None else seq
            raise
        self.store.write_json(self.paths.progress.name, progress)

    def flush_in_background(self, state: str = "running") -> None:
        """Like :meth:`flush`, but the write is queued for the writer thread (parts keep their order).

        Waits only when ``MAX_PENDING_WRITES`` parts are already queued (a disk slower than the
        requests), so memory stays bounded; raises the error of an earlier failed write.
        """
        if self._write_error is not None:
            raise self._write_error
        if self._writer is None:
            self._queue = queue.Queue(maxsize=MAX_PENDING_WRITES)
            self._writer = threading.Thread(target=self._write_loop, name=f"ledger-{self.shard}", daemon=True)
            self._writer.start()
        assert self._queue is not None
        self._queue.put(self._cut(state))

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
                    rows, seq, progress = cut
                    self._write_part(rows, seq)
                    self.store.write_json(self.paths.progress.name, progress)
                except BaseException as exc:  # the part's rows are not on disk
                    self._write_error = exc

    def _cut(self, state: str) -> tuple[list[RowResult], int | None, dict[str, Any]]:
        """Take the buffer, a part number for it (None when empty) and the progress as of now."""
        rows, self.buf = self.buf, []
        seq = None
        if rows:
            seq, self.seq = self.seq, self.seq + 1
        self.last_flush = time.monotonic()
        return rows, seq, self._progress(state)

    def _write_part(self, rows: list[RowResult], seq: int | None) -> None:
        if rows and seq is not None:
            sink = io.BytesIO()
            pq.write_table(self._table(rows), sink, compression="zstd")
            self.store.write_part(seq, sink.getvalue())

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
            "failed": self.n_failed,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "rows_this_run": self.rows_this_run,
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
