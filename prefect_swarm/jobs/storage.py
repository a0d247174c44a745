"""Where a job's input and output live: a local path, ``file://``, ``s3://`` or ``gs://``.

This module alone turns a location (a spec field's value) into a filesystem and a path, and
owns the rule by which an output appears on an object store. :func:`parse` validates the text
before any request is made: an unknown scheme, a missing bucket, or credentials written into
the URI (``s3://KEY:SECRET@bucket/...``, ``?access_key=``) are refused with a
:class:`~prefect_swarm.exceptions.ConfigError` naming the field (exit 2).

Credentials never come from the spec: pyarrow's S3 filesystem reads the standard AWS chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and
``~/.aws``, instance metadata); ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` points it at an
S3-compatible store (MinIO, moto, ...), ``AWS_REGION``/``AWS_DEFAULT_REGION`` picks the region.
GCS uses Google's default credentials. Job processes inherit these variables from the environment
they are started in (a Prefect credentials block would hand them over the same way).

Publish rule (object stores have no rename): an output is written to a unique temporary key
beside it (``.<name>.<uuid>.tmp``), then server-side copied to its final key in one request (an
object appears whole or not at all) and the temporary key deleted; a crash leaves at most a
temporary key (removed by the next commit), never a half output under the final name. The
job's manifest, written after the output, is read as the truth (see :mod:`prefect_swarm.jobs.commit`).
Local paths keep their write-to-temp-then-rename (:func:`prefect_swarm.paths.atomic_file`).

The job folder (spec, manifest, locks, logs, exit files) stays on a POSIX filesystem (local
disk, or a shared one for Slurm): its shard lock is an ``flock`` and its logs are appended by the
compute backend. An ``s3://``/``gs://`` ``job_dir`` is refused with that reason; the shards'
checkpoints go to an object store with the spec's ``ledger`` (see :mod:`prefect_swarm.jobs.ledger`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import TEMP_SUFFIX, atomic_file

OBJECT_SCHEMES = ("s3", "gs")
"""Schemes of object stores (``gcs://`` is read as ``gs://``)."""
_SECRET_PARAMS = ("access_key", "secret_key", "session_token", "credentials", "token", "password")


@dataclass(frozen=True)
class Location:
    """A parsed location: ``scheme`` ('' for a local path), and ``path`` as its filesystem names it
    (``bucket/key`` on an object store, the expanded path for a local one)."""

    text: str
    scheme: str
    path: str

    @property
    def remote(self) -> bool:
        """On an object store (no rename, no flock)."""
        return self.scheme in OBJECT_SCHEMES

    @property
    def local_path(self) -> Path:
        """The local path (only for a local location)."""
        assert not self.remote, self.text
        return Path(self.path)

    @property
    def uri(self) -> str:
        """The canonical text: ``s3://bucket/key``, or the absolute local path."""
        return f"{self.scheme}://{self.path}" if self.remote else str(Path(self.path).resolve())

    @property
    def fs(self) -> pafs.FileSystem:
        """The filesystem holding it (credentials from the environment, see the module doc)."""
        if not self.remote:
            return pafs.LocalFileSystem()
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return _filesystem(self.scheme, endpoint if self.scheme == "s3" else None)

    def child(self, name: str) -> Location:
        """The location ``name`` inside this folder."""
        return Location(f"{self.text.rstrip('/')}/{name}", self.scheme, f"{self.path.rstrip('/')}/{name}")

    @property
    def name(self) -> str:
        """The last component of the path."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def info(self) -> pafs.FileInfo:
        """One request: its type (file, folder, missing), size and mtime."""
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        """It exists (a file or a folder)."""
        if not self.remote:
            return self.local_path.exists()
        return bool(self.info().type != pafs.FileType.NotFound)


def is_remote(text: str | os.PathLike[str]) -> bool:
    """``text`` names an object-store location (validated or not)."""
    scheme = urlsplit(str(text)).scheme.lower() if "://" in str(text) else ""
    return scheme in (*OBJECT_SCHEMES, "gcs")


def parse(text: str | os.PathLike[str], field: str, *, remote_ok: bool = True) -> Location:
    """Validate ``text`` (the value of spec field ``field``) and parse it; no request is made.

    Accepts a plain path (``~`` expanded), ``file:///abs/path``, ``s3://bucket/key`` and
    ``gs://bucket/key``. With ``remote_ok=False`` an object store is refused (the job folder).
    """
    raw = str(text)
    if "://" not in raw:
        return Location(raw, "", str(Path(raw).expanduser()))
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    scheme = "gs" if scheme == "gcs" else scheme
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"{field} {raw}: a file:// URI names a local path (file:///abs/path), not a host.")
        return Location(raw, "", parts.path or "/")
    if scheme not in OBJECT_SCHEMES:
        raise ConfigError(
            f"{field} {raw}: scheme '{parts.scheme}' is not supported. Use a local path, file://, s3:// or gs://."
        )
    if "@" in parts.netloc or any(p.lower() in _SECRET_PARAMS for p in parse_qs(parts.query)):
        raise ConfigError(
            f"{field} {_redact(raw)}: credentials may not be written into the URI (they would land in the "
            "spec, logs and state). Set them in the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS) or a credentials block."
        )
    if parts.query or parts.fragment:
        raise ConfigError(
            f"{field} {raw}: query parameters are not read; set the endpoint and region in the "
            "environment (AWS_ENDPOINT_URL, AWS_REGION)."
        )
    if not parts.netloc:
        raise ConfigError(f"{field} {raw}: the bucket is missing; write {scheme}://BUCKET/KEY.")
    key = parts.path.lstrip("/")
    if not remote_ok:
        raise ConfigError(
            f"{field} {raw}: the job folder (ledger: shard parts, progress, locks, logs) must be on a "
            "POSIX filesystem (local disk, or a shared one on a cluster): its shard lock is an flock. "
            "Keep job_dir local; input, output and the ledger (the shard checkpoints: set ledger) may be "
            "on the object store."
        )
    return Location(raw, scheme, f"{parts.netloc}/{key}" if key else parts.netloc)


def _redact(raw: str) -> str:
    parts = urlsplit(raw)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://***@{host}{parts.path}" + ("?***" if parts.query else "")


@cache
def _filesystem(scheme: str, endpoint: str | None) -> pafs.FileSystem:
    if scheme == "gs":
        return pafs.GcsFileSystem()
    if not endpoint:
        return pafs.S3FileSystem()
    url = urlsplit(endpoint)
    return pafs.S3FileSystem(endpoint_override=url.netloc or url.path, scheme=url.scheme or "https")


# ---------------------------------------------------------------------------------------- publish
@contextmanager
def publish(loc: Location) -> Iterator[Path | pa.NativeFile]:
    """Yield where to write ``loc``'s new content; on success it replaces ``loc`` whole, on error nothing changes.

    Local: a temp path beside it, fsynced and renamed (:func:`prefect_swarm.paths.atomic_file`).
    Object store: a stream to a unique temporary key, then copied to the final key (see the module doc).
    """
    if not loc.remote:
        with atomic_file(loc.local_path) as local_tmp:
            yield local_tmp
        return
    fs = loc.fs
    parent, _, name = loc.path.rpartition("/")
    tmp = f"{parent}/.{name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
    try:
        with fs.open_output_stream(tmp, compression=None) as sink:
            yield sink
        fs.copy_file(tmp, loc.path)
    finally:
        with suppress(OSError, pa.ArrowException):
            fs.delete_file(tmp)


def remove_stale_temps(loc: Location) -> None:
    """Delete temporary keys left beside ``loc`` by a commit killed mid-write (object stores)."""
    if not loc.remote:
        return
    parent, _, name = loc.path.rpartition("/")
    try:
        found = loc.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except (OSError, pa.ArrowException):
        return
    for info in found:
        if info.base_name.startswith(f".{name}.") and info.base_name.endswith(TEMP_SUFFIX):
            loc.fs.delete_file(info.path)
