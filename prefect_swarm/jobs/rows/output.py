"""A job's output as a dataset: part files, a manifest and ``_SUCCESS`` in a folder or prefix.

An output whose name ends with ``/`` (``out/``, ``s3://bucket/run-7/``) is a dataset; any other
name is one file (see :mod:`prefect_swarm.jobs.rows.commit`). A dataset holds:

- ``part-<shard>-<seq>-<token>.parquet``: shard ``shard``'s rows in input order, ``seq`` counting
  the files of that shard (a file rolls over past ``PART_BYTES`` of uncompressed data); ``token``
  names the shard's ledger state the file was written from (12 hex characters). Row groups hold up
  to ``ROW_GROUP_ROWS`` rows and about ``ROW_GROUP_BYTES``, so a reader opens a small footer whatever
  the size. Each row carries ``row_position`` (int64): its 0-based position in the input, so
  ``ORDER BY row_position`` (or the files in name order) is the input order;
- ``_manifest.json``: the files (name, shard, rows, bytes, sha256, first position), the totals, the
  job id, the job fingerprint and the commit id;
- ``_SUCCESS``: written last, once the folder holds exactly the manifest's files.

pyarrow.dataset, pandas, polars, DuckDB and Spark read the folder as one table (they skip names
starting with ``_`` or ``.``).

Who writes what: each shard's job process writes its own part files as soon as its last row is
answered (:func:`prefect_swarm.jobs.rows.commit.write_shard_output`, the shards in parallel), so the
commit only publishes; a shard whose files are missing or stale (its ledger changed since, a retry)
is written by the commit. A shard's files are recorded in its ledger folder once whole
(``output-<token>.json``), so a killed write is redone from that shard alone, and a killed commit
redoes nothing it had.

Publishing costs O(files), never a rewrite of the bytes. On a filesystem the shards write into a
hidden sibling folder ``.<name>.parts/<token>/``; the commit hard-links the files into a hidden
staging folder ``.<name>.<commit>.tmp`` with the manifest and ``_SUCCESS``, and one rename (Linux:
``renameat2(RENAME_EXCHANGE)``, an atomic swap with the previous output) puts it in place, so a
reader sees the previous complete output or the new one. An object store has no rename: the parts
go straight to their final keys (each object appears whole or not at all; names carry the token, so
the previous commit's files are never overwritten); the commit deletes ``_SUCCESS``, writes
``_manifest.json`` (one PUT: the switch), deletes the files no longer listed and writes
``_SUCCESS``. A reader of the manifest's files sees one complete commit; a reader listing the
prefix should wait for ``_SUCCESS``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.input import InputDataset
from prefect_swarm.paths import PROBE_PREFIX, TEMP_SUFFIX, JobPaths, atomic_write_json, temp_name

MANIFEST = "_manifest.json"
"""The dataset's manifest (inside the output folder)."""
SUCCESS = "_SUCCESS"
"""Written last: the folder holds exactly the manifest's files."""
POSITION_COLUMN = "row_position"
"""Each output row's 0-based position in the input (dataset output)."""
PART_PREFIX = "part-"
LAYOUT = "prefect-swarm-dataset/1"
ROW_GROUP_ROWS = 1_000_000
"""Rows of one row group at most."""
ROW_GROUP_BYTES = 128 * 2**20
"""Uncompressed bytes of one row group, about."""
PART_BYTES = 1024 * 2**20
"""Uncompressed bytes of one part file, about (a shard writes more files past it)."""


def is_dataset(output: str | os.PathLike[str]) -> bool:
    """``output`` names a dataset folder or prefix (its name ends with ``/``)."""
    return storage.is_folder(str(output))


def part_name(shard: int, seq: int, commit: str) -> str:
    """The file name of shard ``shard``'s ``seq``-th part in commit ``commit``."""
    return f"{PART_PREFIX}{shard:05d}-{seq:05d}-{commit}.parquet"


def _ours(name: str) -> bool:
    """A name a dataset output holds (parts, manifest, marker)."""
    return name in (MANIFEST, SUCCESS) or (name.startswith(PART_PREFIX) and name.endswith(".parquet"))


# ------------------------------------------------------------------------------------------ checks
def check_output_location(
    output: str | Path,
    dataset: InputDataset,
    job_dir: str | Path | None = None,
    *,
    fingerprint: str | None = None,
    columns: Iterable[str] = (),
) -> Path:
    """Refuse, before any request, an output that would destroy or be read back as input, or cannot be written.

    Refused with :class:`ConfigError` naming the path: the output is the input (or one of its
    files); the output is inside the input folder (the next run would read it as input) or the
    input inside the output; the output is one of the job folder's own files; the output is an
    existing folder or not a regular file; a parent of the output is a file; the nearest existing
    folder of the output cannot be written (a probe file is created there and removed at once).
    Returns the output path (``~`` expanded). An output or input on an object store gets the
    checks that apply there (:func:`_check_remote_output`). A dataset output (a folder, see the module
    doc) gets :func:`_check_dataset_location`, and with the job's ``fingerprint`` and output ``columns``
    :func:`_check_dataset_content` (another job's dataset there; a column named ``row_position``).
    """
    loc = storage.parse(output, "output")
    if is_dataset(output):
        files = (f.path.resolve() if dataset.fs is None else f.path for f in dataset.files)
        named = [dataset.location.uri, *(dataset._name(p) for p in files)]
        _check_dataset_location(str(output), named, job_dir)
        if fingerprint is not None:
            _check_dataset_content(str(output), fingerprint, columns)
        return Path(loc.path)
    if loc.remote:
        return _check_remote_output(loc, dataset)
    out = Path(loc.path)
    real = out.resolve()
    local_input = dataset.fs is None  # an input on an object store cannot be a local output
    inputs = {dataset.path.resolve(), *(f.path.resolve() for f in dataset.files)} if local_input else set()
    if real in inputs:
        raise ConfigError(
            f"output {out} is the input ({dataset.path}): the commit would overwrite the input. "
            "Choose another output path."
        )
    if local_input and dataset.path.is_dir() and real.is_relative_to(dataset.path.resolve()):
        raise ConfigError(
            f"output {out} is inside the input folder {dataset.path}: the next run would read it back as "
            "input. Write the output outside that folder."
        )
    inside = sorted(str(p) for p in inputs if p.is_relative_to(real))
    if inside:
        raise ConfigError(f"input {inside[0]} is inside the output {out}. Choose an output file elsewhere.")
    if job_dir is not None:
        _refuse_job_file(real, Path(job_dir).expanduser().resolve())
    if out.is_dir():
        raise ConfigError(
            f"output {out} is an existing folder; the output is one file. Give a file path "
            f"(e.g. {out / 'output.parquet'}) or remove the folder."
        )
    if out.exists() and not out.is_file():
        raise ConfigError(f"output {out} exists and is not a regular file. Choose another output path.")
    _probe_writable(out)
    return out


def _check_remote_output(out: storage.Location, dataset: InputDataset) -> Path:
    """An output or input on an object store: not the input, not inside the input folder, not a folder,
    writable (:func:`storage.check_writable`)."""
    name = out.uri
    if out.text.endswith("/"):
        raise ConfigError(f"output {out.text} names a folder; the output is one file: add a file name.")
    inputs = {dataset.location.uri, *(dataset._name(f.path) for f in dataset.files)}
    if name in inputs:
        raise ConfigError(
            f"output {out.text} is the input ({dataset.where}): the commit would overwrite the input. "
            "Choose another output path."
        )
    if dataset.kind == "parquet" and name.startswith(dataset.location.uri.rstrip("/") + "/"):
        raise ConfigError(
            f"output {out.text} is inside the input folder {dataset.where}: the next run would read it back as "
            "input. Write the output outside that folder."
        )
    with storage.refusing(out, "output", "write"):
        is_dir = out.info().type == pafs.FileType.Directory
    if is_dir:
        raise ConfigError(f"output {out.text} is an existing folder; the output is one file. Give a file path.")
    storage.check_writable(out, "output")  # a probe object beside it, created and deleted
    return Path(out.path)


def _refuse_job_file(real: Path, job_dir: Path) -> None:
    paths = JobPaths(job_dir)
    if real in paths.own_files() or real.is_relative_to(paths.shards_root()):
        raise ConfigError(
            f"output {real} is one of the job folder's own files ({job_dir}). Choose an output path "
            "outside the job's ledger."
        )


def _probe_writable(out: Path) -> None:
    folder = out.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(
            f"output {out}: its parent {folder} is a file, not a folder. Choose an output path in a folder."
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, suffix=TEMP_SUFFIX, dir=folder)  # probe_name's rule
    except OSError as exc:
        raise ConfigError(
            f"output {out} cannot be written: creating a file in {folder} fails ({exc.strerror or exc}). "
            "Choose a writable location, or fix the folder's permissions."
        ) from exc
    os.close(fd)
    os.unlink(probe)


def _check_dataset_location(output: str, inputs: Iterable[str], job_dir: str | Path | None) -> None:
    """Refuse, before any request, a dataset output that cannot be one: a file of that name exists;
    the folder holds files that are not a dataset's (the publish replaces the folder whole); the
    input is inside it, or it is inside the input folder or the job folder; it cannot be written.
    ``inputs``: the input folder and files, as canonical locations."""
    loc = storage.parse(output, "output")
    uri = loc.uri.rstrip("/")
    for name in inputs:
        if name.rstrip("/") == uri or name.startswith(uri + "/"):
            raise ConfigError(f"input {name} is inside the output folder {output}. Choose an output folder elsewhere.")
        if uri.startswith(name.rstrip("/") + "/"):
            raise ConfigError(
                f"output {output} is inside the input folder {name}: the next run would read it back as "
                "input. Write the output outside that folder."
            )
    if job_dir is not None and not loc.remote:
        root = Path(job_dir).expanduser().resolve()
        if Path(uri).is_relative_to(root) or root.is_relative_to(Path(uri)):
            raise ConfigError(
                f"output {output} overlaps the job folder {root}. Choose an output folder outside the job's ledger."
            )
    with storage.refusing(loc, "output", "read"):
        info = loc.fs.get_file_info(loc.path.rstrip("/"))
        if info.type == pafs.FileType.File:
            raise ConfigError(
                f"output {output} names a folder, but {loc.text.rstrip('/')} is a file. Remove that file, or "
                "name another folder (or drop the trailing '/' for a single-file output)."
            )
        names = _listing(loc) if info.type == pafs.FileType.Directory else []
    foreign = sorted(n for n in names if not _ours(n) and not n.startswith("."))
    if foreign:
        raise ConfigError(
            f"output {output} is a folder holding files that are not a dataset's ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); a commit replaces the folder whole. Choose an empty or "
            "new folder."
        )
    if loc.remote:
        storage.check_writable(loc, "output", folder=True)
    else:
        _probe_parent(Path(uri))


def _probe_parent(out: Path) -> None:
    folder = out.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"output {out}/: the folder {folder} cannot be written. Choose a writable place.")


def _check_dataset_content(output: str, fingerprint: str, columns: Iterable[str]) -> None:
    """Refuse, before any request, an output folder that already holds another job's dataset (its
    manifest names another fingerprint: the commit would replace it), and an output column named
    ``row_position`` (the dataset's own). Nothing for a single-file output."""
    if not is_dataset(output):
        return
    if POSITION_COLUMN in columns:
        raise ConfigError(
            f"output {output}: column '{POSITION_COLUMN}' would clash with the dataset's own (each row's "
            "position in the input). Rename it, or list the input columns to keep with input_columns."
        )
    loc = storage.parse(output, "output")
    manifest = read_manifest(loc)
    if manifest is None or manifest.get("fingerprint") == fingerprint:
        return
    raise ConfigError(
        f"output {output} holds another job's dataset ({loc.child(MANIFEST).text}: job "
        f"{manifest.get('job_id')}, fingerprint {manifest.get('fingerprint')}; this job's is {fingerprint}). "
        "A commit would replace it: choose another output folder, or remove that one."
    )


def read_manifest(loc: storage.Location) -> dict[str, Any] | None:
    """The dataset manifest in output folder ``loc`` (None when there is none)."""
    with storage.refusing(loc, "output", "read"):
        try:
            with loc.fs.open_input_stream(loc.child(MANIFEST).path) as fh:
                data = json.loads(fh.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and "NotFound" not in str(exc) and "NO_SUCH_KEY" not in str(exc):
                raise
            return None
    return data if isinstance(data, dict) else None


def published(loc: storage.Location) -> bool:
    """The output folder holds a complete dataset (its ``_SUCCESS``)."""
    return loc.child(SUCCESS).exists()


def _listing(loc: storage.Location) -> list[str]:
    selector = pafs.FileSelector(loc.path.rstrip("/"), allow_not_found=True)
    return [i.base_name for i in loc.fs.get_file_info(selector)]


# ------------------------------------------------------------------------------------------ writing
class _HashingSink:
    """A binary sink that hashes (sha256) and counts what goes through it."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.hash, self.size, self.closed = raw, hashlib.sha256(), 0, False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += len(view)
        self.raw.write(view)
        return len(view)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.raw.close()


class RowGroupWriter:
    """A parquet writer whose row groups hold up to ``max_rows`` rows and about ``ROW_GROUP_BYTES``
    (batches are gathered before they are written, so many small batches make few row groups)."""

    def __init__(self, where: Any, schema: pa.Schema, max_rows: int = ROW_GROUP_ROWS) -> None:
        self.writer = pq.ParquetWriter(where, schema, compression="zstd")
        self.max_rows = max_rows
        self.buffer: list[pa.RecordBatch] = []
        self.rows = self.nbytes = self.written_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.buffer.append(batch)
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes
        if self.rows >= self.max_rows or self.nbytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            table = pa.Table.from_batches(self.buffer)
            self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            self.written_bytes += self.nbytes
        self.buffer, self.rows, self.nbytes = [], 0, 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


@dataclass(frozen=True)
class PartSizes:
    """Where a part file rolls over (``part_bytes`` of uncompressed data) and its row groups' most rows."""

    part_bytes: int = PART_BYTES
    row_group_rows: int = ROW_GROUP_ROWS


class ShardParts:
    """Writes one shard's rows as part files into ``folder`` (a Location), cut by ``sizes``; returns their records."""

    def __init__(
        self, folder: storage.Location, shard: int, commit: str, start: int, sizes: PartSizes = PartSizes()
    ) -> None:
        self.folder, self.shard, self.commit, self.position = folder, shard, commit, start
        self.sizes = sizes
        self.files: list[dict[str, Any]] = []
        self.writer: RowGroupWriter | None = None
        self.sink: _HashingSink | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        positions = pa.array(range(self.position, self.position + batch.num_rows), pa.int64())
        batch = batch.append_column(POSITION_COLUMN, positions)
        if self.writer is None:
            self._open(batch.schema)
        assert self.writer is not None
        self.writer.write(batch)
        self.files[-1]["rows"] += batch.num_rows
        self.position += batch.num_rows
        if self.writer.written_bytes + self.writer.nbytes >= self.sizes.part_bytes:
            self._close()

    def _open(self, schema: pa.Schema) -> None:
        name = part_name(self.shard, len(self.files), self.commit)
        path = self.folder.child(name).path
        raw: Any
        if not self.folder.remote:
            raw = open(path, "wb")  # noqa: SIM115
        elif self.folder.scheme == "s3":  # parts that grow with the file; whole at finish, or aborted
            raw = storage.S3Upload(path)
        else:
            raw = self.folder.fs.open_output_stream(path, compression=None)
        self.sink = _HashingSink(raw)
        self.writer = RowGroupWriter(pa.PythonFile(self.sink, mode="w"), schema, self.sizes.row_group_rows)
        self.files.append({"path": name, "shard": self.shard, "first_position": self.position, "rows": 0})

    def _close(self) -> None:
        if self.writer is None or self.sink is None:
            return
        self.writer.close()
        if not self.folder.remote:
            self.sink.raw.flush()
            os.fsync(self.sink.raw.fileno())
        elif isinstance(self.sink.raw, storage.S3Upload):
            self.sink.raw.finish()
        self.sink.close()
        self.files[-1].update(bytes=self.sink.size, sha256=self.sink.hash.hexdigest())
        self.writer = self.sink = None

    def close(self) -> list[dict[str, Any]]:
        self._close()
        return self.files

    def abort(self) -> None:
        """Drop the file being written (an S3 upload is aborted; a rerun removes the rest)."""
        if self.sink is not None and isinstance(self.sink.raw, storage.S3Upload):
            self.sink.raw.abort()
        self.writer = self.sink = None


def remove_shard_parts(folder: storage.Location, shard: int, commit: str) -> None:
    """Delete what a cut write of shard ``shard`` left in ``folder`` (and abort its open uploads)."""
    start = f"{PART_PREFIX}{shard:05d}-"
    if folder.remote:
        prefix = folder.path.rstrip("/")
        storage.abort_uploads(f"{prefix}/{start}", folder.scheme, lambda key: key.endswith(f"-{commit}.parquet"))
    for name in _listing(folder):
        if name.startswith(start) and name.endswith(f"-{commit}.parquet"):
            _delete(folder, name)


def _delete(folder: storage.Location, name: str) -> None:
    if folder.remote:
        storage.delete_object(folder.child(name).path, folder.scheme, folder.fs)
    else:
        Path(folder.child(name).path).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------- publish
def staging(out: storage.Location, commit: str) -> storage.Location:
    """Where commit ``commit`` gathers its files: a hidden sibling folder (filesystem), the output
    prefix itself (object store)."""
    if out.remote:
        return out
    path = Path(out.path.rstrip("/"))
    tmp = path.parent / temp_name(path.name, commit)
    return storage.Location(str(tmp) + "/", "", str(tmp))


def parts_folder(out: storage.Location, token: str) -> storage.Location:
    """Where a shard writes its part files for ledger state ``token``: a hidden sibling folder
    ``.<name>.parts/<token>`` (filesystem: the commit hard-links them into place), the output prefix
    itself (object store: the files' names carry the token)."""
    if out.remote:
        return out
    path = Path(out.path.rstrip("/"))
    folder = path.parent / f".{path.name}.parts" / token
    folder.mkdir(parents=True, exist_ok=True)
    return storage.Location(str(folder) + "/", "", str(folder))


def prepare(out: storage.Location, commit: str) -> storage.Location:
    """The staging folder of ``commit``, made empty (what other commits left is removed); on an
    object store, the previous ``_SUCCESS`` is deleted as the prefix is about to change."""
    stage = staging(out, commit)
    if out.remote:
        if out.child(SUCCESS).exists():
            _delete(out, SUCCESS)
        return stage
    root = Path(out.path.rstrip("/"))
    for old in root.parent.glob(temp_name(root.name, "*")):
        shutil.rmtree(old, ignore_errors=True)
    Path(stage.path).mkdir(parents=True)
    return stage


def stage_files(out: storage.Location, stage: storage.Location, token: str, names: Iterable[str]) -> None:
    """Put a shard's part files (written for ``token``) into the staging folder: hard links, O(files),
    no byte rewritten (a copy only where the filesystem has no hard links). Nothing on an object store."""
    if out.remote:
        return
    src = Path(parts_folder(out, token).path)
    for name in names:
        dst = Path(stage.path) / name
        if not dst.exists():
            try:
                os.link(src / name, dst)
            except OSError:
                shutil.copy2(src / name, dst)


def keep_parts(out: storage.Location, tokens: Iterable[str]) -> None:
    """Drop the pre-written part files of ledger states other than ``tokens`` (filesystem; an object
    store's are deleted by :func:`publish_dataset`, and their unfinished uploads, left by a kill, aborted here)."""
    keep = set(tokens)
    if out.remote:
        prefix = out.path.rstrip("/") + "/" + PART_PREFIX
        storage.abort_uploads(prefix, out.scheme, lambda key: key.removesuffix(".parquet")[-12:] not in keep)
        return
    root = Path(out.path.rstrip("/"))
    for folder in (root.parent / f".{root.name}.parts").glob("*"):
        if folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)


def publish_dataset(out: storage.Location, stage: storage.Location, manifest: dict[str, Any]) -> None:
    """Put commit ``manifest['commit']`` in place: manifest, then ``_SUCCESS`` last; O(files)."""
    if out.remote:
        fs = out.fs
        with fs.open_output_stream(out.child(MANIFEST).path, compression=None) as sink:
            sink.write(json.dumps(manifest, indent=1).encode())
        keep = {f["path"] for f in manifest["files"]} | {MANIFEST}
        for name in _listing(out):
            if _ours(name) and name not in keep:
                _delete(out, name)
        with fs.open_output_stream(out.child(SUCCESS).path, compression=None) as sink:
            sink.write(b"")
        return
    folder = Path(stage.path)
    atomic_write_json(folder / MANIFEST, manifest)
    (folder / SUCCESS).touch()
    _fsync_dir(folder)
    target = Path(out.path.rstrip("/"))
    if target.exists():
        _exchange(folder, target)
        shutil.rmtree(folder, ignore_errors=True)  # the previous output, now at the staging name
    else:
        os.rename(folder, target)
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Swap folders ``a`` and ``b`` atomically (Linux ``renameat2``); elsewhere two renames (a reader
    may then find no output for an instant, never a partial one)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None and fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return
    aside = b.with_name(temp_name(b.name, f"{time.time_ns()}.old"))
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def manifest_files(files: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> dict[str, int]:
    """Totals of a list of file records: files, rows, bytes."""
    files = list(files)
    return {"files": len(files), "bytes": sum(int(f["bytes"]) for f in files)}
