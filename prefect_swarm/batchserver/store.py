"""The batch service's durable state: tenants (hashed keys), files and batches, in one SQLite file.

Everything a client sees is a row here, scoped by tenant: every read and write names the tenant,
so one tenant's id is "not found" to another. Ids are generated here (``file-<hex>``,
``batch_<hex>``); the bytes of a file live at :meth:`BatchServicePaths.file` of its id, so no
path is ever built from what a client sent. A batch's object (the JSON OpenAI returns) is kept
whole in ``doc``; the columns beside it are what the service looks things up by.

Keys are stored as their SHA-256 (a key is 256 random bits: no dictionary to salt against); the
key itself is shown once, when it is created, and never written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prefect_swarm.paths import BatchServicePaths, journal_for, private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key_hash TEXT PRIMARY KEY, tenant TEXT NOT NULL, prefix TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL,
    filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL, lines INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL,
    status TEXT NOT NULL, model TEXT, job_id TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,
    stop_sent INTEGER NOT NULL DEFAULT 0, resubmits INTEGER NOT NULL DEFAULT 0, flow_run_id TEXT,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS files_tenant ON files (tenant, seq);
CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, seq);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
"""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""Batch statuses the runner still drives; the others are final."""
KEY_PREFIX = "sk-batch-"


def key_hash(key: str) -> str:
    """What is stored for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_id(prefix: str) -> str:
    """A fresh object id (``file-``/``batch_`` + 32 hex digits)."""
    return f"{prefix}{uuid.uuid4().hex}"


def derived_id(prefix: str, *parts: str) -> str:
    """An id that is the same each time it is derived from ``parts`` (a batch's output files: a
    finalization redone after a crash names the same files)."""
    return prefix + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class FileRow:
    """One stored file."""

    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    lines: int
    created_at: int

    def object(self) -> dict[str, Any]:
        """The OpenAI ``file`` object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass(frozen=True)
class BatchRow:
    """One batch: its OpenAI object and the service's bookkeeping."""

    id: str
    tenant: str
    status: str
    model: str | None
    job_id: str | None
    cancel_requested: bool
    stop_sent: bool
    resubmits: int
    flow_run_id: str | None
    doc: dict[str, Any]


class ServiceStore:
    """The service's database (created on first use, 0600 in a 0700 folder)."""

    def __init__(self, paths: BatchServicePaths | None = None) -> None:
        self.paths = (paths or BatchServicePaths.for_home()).ensure()
        for folder in (self.paths.files, self.paths.root / "work"):
            folder.mkdir(mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        private_file(self.paths.db)
        self._db = sqlite3.connect(self.paths.db, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA journal_mode={journal_for(self.paths.root)}")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------ keys
    def create_key(self, tenant: str) -> str:
        """A new key for ``tenant`` (returned once; only its hash is kept)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._tx() as db:
            db.execute(
                "INSERT INTO keys (key_hash, tenant, prefix, created_at) VALUES (?, ?, ?, ?)",
                (key_hash(key), tenant, key[: len(KEY_PREFIX) + 4], time.time()),
            )
        return key

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key this is (None: no such key)."""
        rows = self._all("SELECT tenant FROM keys WHERE key_hash = ?", (key_hash(key),))
        return rows[0][0] if rows else None

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key: tenant, the first characters, creation time (never the key)."""
        rows = self._all("SELECT tenant, prefix, created_at FROM keys ORDER BY created_at")
        return [{"tenant": t, "prefix": p + "...", "created_at": c} for t, p, c in rows]

    def revoke_keys(self, tenant: str) -> int:
        """Remove every key of ``tenant``; return how many."""
        with self._tx() as db:
            return db.execute("DELETE FROM keys WHERE tenant = ?", (tenant,)).rowcount

    # ------------------------------------------------------------------ files
    def add_file(self, row: FileRow) -> FileRow:
        """Record a stored file (its bytes are already at ``paths.file(row.id)``). Idempotent by id."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO files (id, tenant, filename, purpose, bytes, lines, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.tenant, row.filename, row.purpose, row.bytes, row.lines, row.created_at),
            )
        return row

    def get_file(self, tenant: str, file_id: str) -> FileRow | None:
        """File ``file_id`` of ``tenant`` (None for another tenant's)."""
        rows = self._all(
            "SELECT id, tenant, filename, purpose, bytes, lines, created_at FROM files WHERE id = ? AND tenant = ?",
            (file_id, tenant),
        )
        return FileRow(*rows[0]) if rows else None

    def list_files(
        self, tenant: str, *, purpose: str | None, after: str | None, limit: int, order: str
    ) -> tuple[list[FileRow], bool]:
        """A page of ``tenant``'s files (newest first with ``order='desc'``) after file ``after``; has_more."""
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        where, args = ["tenant = ?"], [tenant]
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        if after:
            where.append(f"seq {op} (SELECT seq FROM files WHERE id = ? AND tenant = ?)")
            args += [after, tenant]
        rows = self._all(
            "SELECT id, tenant, filename, purpose, bytes, lines, created_at FROM files "
            f"WHERE {' AND '.join(where)} ORDER BY seq {direction} LIMIT ?",
            (*args, limit + 1),
        )
        return [FileRow(*r) for r in rows[:limit]], len(rows) > limit

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Forget ``tenant``'s file ``file_id`` and remove its bytes; False when it is not theirs."""
        with self._tx() as db:
            gone = db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount
        if gone:
            self.paths.file(file_id).unlink(missing_ok=True)
        return bool(gone)

    # ------------------------------------------------------------------ batches
    def add_batch(self, tenant: str, doc: dict[str, Any], model: str | None) -> BatchRow:
        """Record a new batch."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, tenant, status, model, doc) VALUES (?, ?, ?, ?, ?)",
                (doc["id"], tenant, doc["status"], model, json.dumps(doc)),
            )
        row = self.get_batch(tenant, doc["id"])
        assert row is not None
        return row

    def _batch(self, where: str, args: tuple[Any, ...]) -> list[BatchRow]:
        rows = self._all(
            "SELECT id, tenant, status, model, job_id, cancel_requested, stop_sent, resubmits, flow_run_id, doc "
            "FROM batches " + where,
            args,
        )
        return [
            BatchRow(r[0], r[1], r[2], r[3], r[4], bool(r[5]), bool(r[6]), r[7], r[8], json.loads(r[9])) for r in rows
        ]

    def get_batch(self, tenant: str, batch_id: str) -> BatchRow | None:
        """Batch ``batch_id`` of ``tenant`` (None for another tenant's)."""
        rows = self._batch("WHERE id = ? AND tenant = ?", (batch_id, tenant))
        return rows[0] if rows else None

    def list_batches(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchRow], bool]:
        """A page of ``tenant``'s batches, newest first, after batch ``after``; has_more."""
        where, args = "WHERE tenant = ?", [tenant]
        if after:
            where += " AND seq < (SELECT seq FROM batches WHERE id = ? AND tenant = ?)"
            args += [after, tenant]
        rows = self._batch(where + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1))
        return rows[:limit], len(rows) > limit

    def active_batches(self) -> list[BatchRow]:
        """Every batch the runner still drives, oldest first (all tenants)."""
        marks = ", ".join("?" * len(ACTIVE))
        return self._batch(f"WHERE status IN ({marks}) ORDER BY seq", ACTIVE)

    def update_batch(self, batch_id: str, changes: dict[str, Any], **columns: Any) -> BatchRow:
        """Merge ``changes`` into batch ``batch_id``'s object (its ``status`` column follows) and set
        ``columns`` (job_id, cancel_requested, stop_sent, resubmits, flow_run_id), in one transaction."""
        with self._tx() as db:
            (raw,) = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
            doc = {**json.loads(raw), **changes}
            sets = {"doc": json.dumps(doc), "status": doc["status"], **columns}
            db.execute(
                f"UPDATE batches SET {', '.join(f'{k} = ?' for k in sets)} WHERE id = ?", (*sets.values(), batch_id)
            )
        rows = self._batch("WHERE id = ?", (batch_id,))
        return rows[0]

    def finish_batch(self, batch_id: str, files: list[FileRow], changes: dict[str, Any]) -> BatchRow:
        """Record a batch's output files and its final object together (a crash leaves neither)."""
        with self._tx() as db:
            for row in files:
                db.execute(
                    "INSERT OR REPLACE INTO files (id, tenant, filename, purpose, bytes, lines, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (row.id, row.tenant, row.filename, row.purpose, row.bytes, row.lines, row.created_at),
                )
            (raw,) = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
            doc = {**json.loads(raw), **changes}
            db.execute(
                "UPDATE batches SET doc = ?, status = ? WHERE id = ?", (json.dumps(doc), doc["status"], batch_id)
            )
        return self._batch("WHERE id = ?", (batch_id,))[0]
