"""Where a job's input and output live: a local path, ``file://``, ``s3://`` or ``gs://``.

This module alone turns a location (a spec field's value) into a filesystem and a path, and
owns the rule by which an output appears on an object store. :func:`parse` validates the text
before any request is made: an unknown scheme, a missing bucket, a key with a ``//``, ``./`` or
``../`` segment, or credentials written into the URI (``s3://KEY:SECRET@bucket/...``,
``?access_key=``) are refused with a
:class:`~prefect_swarm.exceptions.ConfigError` naming the field (exit 2).

Credentials never come from the spec: pyarrow's S3 filesystem reads the standard AWS chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and
``~/.aws``, instance metadata); ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` points it at an
S3-compatible store (MinIO, moto, ...), ``AWS_REGION``/``AWS_DEFAULT_REGION`` picks the region.
GCS uses Google's default credentials. Job processes inherit these variables from the environment
they are started in (a Prefect credentials block would hand them over the same way).

Publish rule (object stores have no rename): on S3 an output is uploaded straight to its final
key by a multipart upload whose part size follows the object's size (:func:`upload_part_size`:
8 MiB parts first, doubling every 1,000 parts, so 10,000 parts reach S3's 5 TiB object limit); the
object appears whole when the upload completes, an error aborts it, and a crash leaves an open
upload the next commit aborts, never a half output under the final name. No copy is made, so
S3's 5 GiB CopyObject limit does not apply. On GCS an output is written to a unique temporary key
beside it (``.<name>.<uuid>.tmp``), then copied to its final key (a GCS rewrite has no such limit)
and the temporary key deleted. A dataset output (a name ending with ``/``) is written file by file
to the final keys (see :mod:`prefect_swarm.jobs.rows.output`). The
job's manifest, written after the output, is read as the truth (see :mod:`prefect_swarm.jobs.rows.commit`).
Local paths keep their write-to-temp-then-rename (:func:`prefect_swarm.paths.atomic_file`).

Pre-flight: :func:`check_writable` proves a location writable (a probe object created and deleted
beside it) before any request is sent; :func:`refusing` turns what the store answers (no such
bucket, access denied, unknown key, wrong secret, endpoint unreachable) into one
:class:`ConfigError` naming the location and the setting to fix. Multipart uploads left open by a
killed process (pyarrow uploads an object larger than one part as one) are aborted by
:func:`abort_uploads`: the commit's, beside the output; the ledger's, under the shard's prefix.

The job folder (spec, manifest, locks, logs, exit files) stays on a POSIX filesystem (local
disk, or a shared one for Slurm): its shard lock is an ``flock`` and its logs are appended by the
compute backend. An ``s3://``/``gs://`` ``job_dir`` is refused with that reason; the shards'
checkpoints go to an object store with the spec's ``ledger`` (see :mod:`prefect_swarm.jobs.checkpoint.ledger`).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from prefect_swarm.exceptions import ConfigError, PrefectSwarmError
from prefect_swarm.paths import atomic_file, is_probe, is_temp_of, probe_name, temp_name

log = logging.getLogger("prefect_swarm.jobs")

OBJECT_SCHEMES = ("s3", "gs")
ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Variables naming an S3-compatible endpoint, the first set wins (as in the AWS SDKs)."""
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
        endpoint, _ = _endpoint()
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


def is_folder(text: str | os.PathLike[str]) -> bool:
    """``text`` names a folder or prefix: it ends with ``/`` (an output so named is a dataset, see
    :mod:`prefect_swarm.jobs.rows.output`)."""
    return str(text).endswith(("/", os.sep))


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
    key = parts.path.removeprefix("/")
    _check_segments(raw, field, key)
    if not remote_ok:
        raise ConfigError(
            f"{field} {raw}: the job folder (ledger: shard parts, progress, locks, logs) must be on a "
            "POSIX filesystem (local disk, or a shared one on a cluster): its shard lock is an flock. "
            "Keep job_dir local; input, output and the ledger (the shard checkpoints: set ledger) may be "
            "on the object store."
        )
    return Location(raw, scheme, f"{parts.netloc}/{key}" if key else parts.netloc)


def _check_segments(raw: str, field: str, key: str) -> None:
    """Refuse a key with an empty (``//``), ``.`` or ``..`` segment (a trailing ``/`` is a folder's)."""
    segments = key.rstrip("/").split("/") if key.rstrip("/") else []
    bad = [s for s in segments if s in ("", ".", "..")]
    if bad:
        shown = "'//'" if "" in bad else f"'{bad[0]}/'"
        raise ConfigError(
            f"{field} {raw}: the key has a {shown} segment. An object store keeps such a key as written "
            "(it is not a path that resolves), and pyarrow refuses empty segments. Write the key without "
            "'//', './' or '../' segments."
        )


def _redact(raw: str) -> str:
    parts = urlsplit(raw)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://***@{host}{parts.path}" + ("?***" if parts.query else "")


def _endpoint() -> tuple[str | None, str | None]:
    """The S3 endpoint set in the environment, and the variable that set it."""
    for var in ENDPOINT_VARS:
        if os.environ.get(var):
            return os.environ[var], var
    return None, None


@cache
def _filesystem(scheme: str, endpoint: str | None) -> pafs.FileSystem:
    if scheme == "gs":
        return pafs.GcsFileSystem()
    # allow_delayed_open: an object smaller than one upload part (a ledger part, a probe, a small
    # output) is one PutObject, whole or absent, not a multipart upload a kill -9 would leave behind
    if not endpoint:
        return pafs.S3FileSystem(allow_delayed_open=True)
    url = urlsplit(endpoint)
    return pafs.S3FileSystem(
        endpoint_override=url.netloc or url.path, scheme=url.scheme or "https", allow_delayed_open=True
    )


# ------------------------------------------------------------------------------- errors, pre-flight
_STORE_ERRORS = (  # (pyarrow's name of the AWS error, botocore's), advice
    (("NO_SUCH_BUCKET", "NoSuchBucket"), "bucket '{bucket}' does not exist. Create it, or fix the bucket name"),
    (
        ("INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId"),
        "the store does not know the access key in the environment. Check AWS_ACCESS_KEY_ID (or the "
        "profile named by AWS_PROFILE)",
    ),
    (
        ("SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch"),
        "the secret key does not match the access key. Check AWS_SECRET_ACCESS_KEY (or the profile named by "
        "AWS_PROFILE)",
    ),
    (
        ("ACCESS_DENIED", "AccessDenied"),
        "the credentials in the environment may not {doing} it (access denied). Use credentials that may "
        "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE), or grant them {grant}",
    ),
    (
        ("NETWORK_CONNECTION", "Could not connect to the endpoint"),
        "the object store at {endpoint} cannot be reached. Check {endpoint_var} and the network",
    ),
)
_GRANTS = {
    "read": "s3:GetObject and s3:ListBucket",
    "write": "s3:PutObject, s3:DeleteObject and s3:ListBucket",
    "delete objects in": "s3:DeleteObject",
}


BEFORE_ANY_ROW = "Nothing was sent to the swarm."
"""The end of a pre-flight refusal (:func:`refusing`'s default)."""


def store_error(
    exc: BaseException,
    loc: Location,
    field: str,
    doing: str,
    *,
    error: type[PrefectSwarmError] = ConfigError,
    after: str = BEFORE_ANY_ROW,
) -> PrefectSwarmError:
    """One message (a :class:`ConfigError`, exit 2) for an object-store error met on ``loc`` (spec field
    ``field``) while ``doing`` ("read" or "write") it: what went wrong, in words, and the setting to fix.

    pyarrow raises a plain ``OSError`` whose text carries the AWS error name; that name picks the
    advice. An access denied on a HEAD (no body, so no reason) is looked at once more with a listing,
    whose answer names the reason (an unknown key, a wrong secret).
    """
    text = str(exc)
    if "ACCESS_DENIED" in text and "HeadObject" in text:
        try:
            loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        except (OSError, pa.ArrowException) as sharper:
            text = str(sharper)
    endpoint, var = _endpoint()
    values = {
        "bucket": loc.path.split("/", 1)[0],
        "doing": doing,
        "grant": _GRANTS.get(doing, "access"),
        "endpoint": endpoint or f"{loc.scheme}://",
        "endpoint_var": var or "AWS_ENDPOINT_URL/AWS_REGION",
    }
    advice = next((msg.format(**values) for codes, msg in _STORE_ERRORS if any(c in text for c in codes)), None)
    reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if advice is None:
        advice = f"the object store refused to {doing} it ({reason}). Check the location and the credentials"
    return error(f"{field} {loc.text}: {advice}. {after}")


@contextmanager
def refusing(
    loc: Location,
    field: str,
    doing: str,
    *,
    error: type[PrefectSwarmError] = ConfigError,
    after: str = BEFORE_ANY_ROW,
) -> Iterator[None]:
    """Run object-store calls on ``loc``; their errors become one :func:`store_error` message
    (an ``error``, a ConfigError by default: the pre-flight's; ``after`` ends it)."""
    try:
        yield
    except OSError as exc:  # pyarrow's S3/GCS errors (a parquet parse error is not one)
        if not loc.remote or isinstance(exc, FileNotFoundError):
            raise
        raise store_error(exc, loc, field, doing, error=error, after=after) from exc


def check_writable(loc: Location, field: str, *, folder: bool = False) -> None:
    """Prove ``loc`` (spec field ``field``) can be written before any request: create and delete a
    probe object next to it (inside it, for a ``folder``). Object stores only; a failure is one
    :class:`ConfigError` naming the location and the setting to fix (the bucket, the keys, the endpoint).
    """
    if not loc.remote:
        return
    parent = loc.path.rstrip("/") if folder else loc.path.rpartition("/")[0] or loc.path
    probe = f"{parent}/{probe_name(uuid.uuid4().hex)}"
    fs = loc.fs
    with refusing(loc, field, "write"), fs.open_output_stream(probe, compression=None) as sink:
        sink.write(b"prefect-swarm write probe\n")
    try:
        with suppress(FileNotFoundError):  # another run's sweep (below) took it first
            delete_object(probe, loc.scheme, fs)
    except Exception as exc:  # a key that may write but not delete could not publish an output either
        raise store_error(exc, loc, field, "delete objects in") from exc
    _sweep_probes(parent, loc.scheme, fs)


def _sweep_probes(parent: str, scheme: str, fs: pafs.FileSystem) -> None:
    """Delete the probes a run killed between its write and its delete left in ``parent``: billed
    objects nobody would otherwise remove. A folder prefect-swarm may write is one it may list."""
    try:
        found = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except (OSError, pa.ArrowException):
        return
    for info in found:
        if info.type == pafs.FileType.File and is_probe(info.base_name):
            with suppress(FileNotFoundError):
                delete_object(info.path, scheme, fs)


def delete_object(path: str, scheme: str, fs: pafs.FileSystem) -> None:
    """Delete object ``path`` (``bucket/key``). On S3 one DeleteObject: pyarrow's ``delete_file`` then
    writes an empty ``folder/`` marker when the folder is left empty, an object nobody asked for."""
    if scheme != "s3":
        fs.delete_file(path)
        return
    bucket, _, key = path.partition("/")
    _s3_client().delete_object(Bucket=bucket, Key=key)


# --------------------------------------------------------------------------- multipart uploads
def abort_uploads(bucket_path: str, scheme: str, match: Callable[[str], bool]) -> int:
    """Abort the unfinished multipart uploads of keys under ``bucket_path`` (``bucket/prefix``) for
    which ``match(key)`` holds (keys relative to the bucket); return how many.

    pyarrow uploads an object bigger than one part as a multipart upload; a process killed mid-upload
    leaves it open: invisible (no object), but its parts are stored and billed until aborted.
    pyarrow's filesystem cannot list or abort them, so this asks S3 itself (botocore, with the same
    environment: keys, profile, ``AWS_ENDPOINT_URL[_S3]``, region). Only S3: a GCS upload left by a
    kill is a resumable upload session, which GCS drops by itself after a week. A failure to list or
    abort (no ``s3:ListBucketMultipartUploads`` right, say) is logged, never fatal.
    """
    if scheme != "s3":
        return 0
    bucket, _, prefix = bucket_path.partition("/")
    aborted = 0
    try:
        client = _s3_client()
        pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for upload in page.get("Uploads", []):
                if match(upload["Key"]):
                    client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                    aborted += 1
    except Exception as exc:  # botocore's errors (and a missing botocore): cleanup is best effort
        log.warning("could not abort unfinished uploads under s3://%s: %s", bucket_path, exc)
    if aborted:
        log.info("aborted %d unfinished multipart upload(s) under s3://%s", aborted, bucket_path)
    return aborted


def _s3_client() -> Any:
    import botocore.session
    from botocore.config import Config

    endpoint, _ = _endpoint()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    config = Config(s3={"addressing_style": "path"} if endpoint else {}, retries={"max_attempts": 3})
    return botocore.session.get_session().create_client("s3", endpoint_url=endpoint, region_name=region, config=config)


MIN_PART_BYTES = 8 * 2**20
"""Size of the first parts of a multipart upload (S3's least is 5 MiB)."""
PARTS_PER_SIZE = 1000
"""Parts uploaded at one size before the size doubles."""
MAX_PART_BYTES = 5 * 2**30
"""S3's largest part."""
MAX_PARTS = 10_000
"""S3's most parts of one upload."""


def upload_part_size(index: int, min_bytes: int = MIN_PART_BYTES, per_size: int = PARTS_PER_SIZE) -> int:
    """The size of part ``index`` (0-based) of an upload: ``min_bytes`` for the first ``per_size``
    parts, doubling every ``per_size`` parts (capped at 5 GiB), so the part size follows the
    object's size: 10,000 parts reach about 8 TB, past S3's 5 TiB object limit, while a small object
    still goes in 8 MiB parts."""
    return int(min(min_bytes << (index // per_size), MAX_PART_BYTES))


class S3Upload:
    """A binary sink writing object ``bucket/key`` on S3 by a multipart upload of growing parts
    (:func:`upload_part_size`). The object appears whole at :meth:`finish` (one PutObject when it
    fits one part, else CompleteMultipartUpload) or not at all: :meth:`abort` drops what was sent.
    Memory holds one part. ``close`` (as a wrapping :class:`pyarrow.PythonFile` calls it) completes nothing.

    ``client`` is the botocore S3 client (default: one from the environment, as :func:`abort_uploads`
    makes); ``min_part_bytes`` and ``parts_per_size`` shape the part sizes (:func:`upload_part_size`)."""

    def __init__(
        self,
        path: str,
        *,
        client: Any = None,
        min_part_bytes: int = MIN_PART_BYTES,
        parts_per_size: int = PARTS_PER_SIZE,
    ) -> None:
        self.bucket, _, self.key = path.partition("/")
        self.client = client if client is not None else _s3_client()
        self.min_part_bytes = min_part_bytes
        self.parts_per_size = parts_per_size
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.buffer += view
        while len(self.buffer) >= (size := self._part_size()):
            self._send(bytes(self.buffer[:size]))
            del self.buffer[:size]
        return len(view)

    def _part_size(self) -> int:
        return upload_part_size(len(self.parts), self.min_part_bytes, self.parts_per_size)

    def _send(self, body: bytes) -> None:
        if len(self.parts) >= MAX_PARTS:
            raise OSError(f"s3://{self.bucket}/{self.key}: more than {MAX_PARTS} upload parts (S3's limit)")
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload")["UploadId"]
        number = len(self.parts) + 1
        answer = self._call("upload_part", UploadId=self.upload_id, PartNumber=number, Body=body)
        self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    def _call(self, method: str, **kw: Any) -> Any:
        """One S3 request; its error is an OSError naming the AWS error (as pyarrow's are, see :func:`store_error`)."""
        try:
            return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kw)
        except Exception as exc:  # botocore's ClientError / EndpointConnectionError
            raise OSError(f"{type(exc).__name__}: {exc} (during {method} of s3://{self.bucket}/{self.key})") from exc

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def finish(self) -> None:
        """Make the object appear, whole."""
        if self.upload_id is None:
            self._call("put_object", Body=bytes(self.buffer))
        else:
            if self.buffer:
                self._send(bytes(self.buffer))
            self._call("complete_multipart_upload", UploadId=self.upload_id, MultipartUpload={"Parts": self.parts})
        self.buffer = bytearray()

    def abort(self) -> None:
        """Drop what was sent (the upload's parts); nothing appears."""
        if self.upload_id is not None:
            with suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
            self.upload_id = None


@contextmanager
def upload(loc: Location, *, uploader: Callable[[str], S3Upload] = S3Upload) -> Iterator[pa.NativeFile]:
    """Yield a stream writing object ``loc`` straight to its key: on S3 an :class:`S3Upload` made by
    ``uploader`` from the object's path (the object appears whole when the block ends, or not at all
    on error: its upload is aborted); elsewhere the store's own stream (GCS: a resumable upload,
    whole or absent)."""
    if loc.scheme != "s3":
        with loc.fs.open_output_stream(loc.path, compression=None) as sink:
            yield sink
        return
    sink = uploader(loc.path)
    try:
        yield pa.PythonFile(sink, mode="w")
        sink.finish()
    except BaseException:
        sink.abort()
        raise


# ---------------------------------------------------------------------------------------- publish
@contextmanager
def publish_file(loc: Location, *, uploader: Callable[[str], S3Upload] = S3Upload) -> Iterator[Path | pa.NativeFile]:
    """Yield where to write ``loc``'s new content; on success it replaces ``loc`` whole, on error nothing changes.

    Local: a temp path beside it, fsynced and renamed (:func:`prefect_swarm.paths.atomic_file`).
    S3: straight to the final key by a multipart upload of growing parts (:func:`upload`): the object
    appears at its completion, whole, and an error aborts it; no copy, so no 5 GiB CopyObject limit.
    GCS: a stream to a unique temporary key, then copied to the final key (see the module doc).
    ``uploader`` makes the S3 upload from the object's path (:class:`S3Upload` by default).
    """
    if not loc.remote:
        with atomic_file(loc.local_path) as local_tmp:
            yield local_tmp
        return
    if loc.scheme == "s3":
        with upload(loc, uploader=uploader) as sink:
            yield sink
        return
    fs = loc.fs
    parent, _, name = loc.path.rpartition("/")
    tmp = f"{parent}/{temp_name(name, uuid.uuid4().hex)}"
    try:
        with fs.open_output_stream(tmp, compression=None) as sink:
            yield sink
        fs.copy_file(tmp, loc.path)
    except BaseException:  # an upload that failed mid-way stays open on the store: abort it
        key = tmp.partition("/")[2]
        abort_uploads(tmp, loc.scheme, lambda k: k == key)
        raise
    finally:
        with suppress(Exception):  # gone already after a copy error; else the next commit removes it
            delete_object(tmp, loc.scheme, fs)


def remove_stale_temps(loc: Location) -> None:
    """Delete what a commit killed mid-write left beside ``loc`` (object stores): its temporary keys,
    and its unfinished multipart uploads of them (:func:`abort_uploads`)."""
    if not loc.remote:
        return
    parent, _, name = loc.path.rpartition("/")
    final = loc.path.partition("/")[2]  # an S3 output is uploaded to its own key (see publish_file)
    abort_uploads(f"{parent}/", loc.scheme, lambda key: key == final or is_temp_of(name, key.rpartition("/")[2]))
    try:
        found = loc.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except (OSError, pa.ArrowException):
        return
    for info in found:
        if is_temp_of(name, info.base_name):
            loc.fs.delete_file(info.path)
