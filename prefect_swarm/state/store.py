"""SQLite store of swarms and jobs: the truth for "what exists".

One short-lived connection per operation (safe across processes and threads), WAL journal on a local
filesystem and a rollback journal on a network one (:func:`journal_for`: SQLite's WAL needs shared
memory that NFS, Lustre and the like do not give across hosts), a busy timeout, writes in ``BEGIN
IMMEDIATE`` transactions. Constructing a store touches nothing on disk: the file is created and
migrated on first use, so ``validate`` and other read-nothing commands leave no trace. The schema
version lives in ``PRAGMA user_version``; :data:`MIGRATIONS` brings any older database forward,
never back. Rows hold redacted configs only: secrets never reach this file.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from prefect_swarm.exceptions import StateError
from prefect_swarm.interfaces.types import JobStatus, ServingPhase
from prefect_swarm.paths import MOUNTS as MOUNTS
from prefect_swarm.paths import NETWORK_FS as NETWORK_FS
from prefect_swarm.paths import filesystem_type as filesystem_type
from prefect_swarm.paths import journal_for, private_dir, private_file
from prefect_swarm.settings import get_settings

_V1_STATEMENTS = (
    """CREATE TABLE IF NOT EXISTS swarms (
        name TEXT PRIMARY KEY,
        backend TEXT NOT NULL,
        config TEXT NOT NULL,
        handle TEXT,
        phase TEXT NOT NULL,
        flow_run_id TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY,
        swarm TEXT,
        spec TEXT NOT NULL,
        handle TEXT,
        status TEXT NOT NULL,
        shard INTEGER,
        nshards INTEGER NOT NULL DEFAULT 1,
        progress TEXT,
        flow_run_id TEXT,
        task_run_id TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS jobs_swarm ON jobs(swarm)",
)


def _v1(db: sqlite3.Connection) -> None:
    for stmt in _V1_STATEMENTS:
        db.execute(stmt)  # executescript would commit our migration transaction halfway


def _v2(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE swarms ADD COLUMN keep INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE swarms ADD COLUMN fingerprint TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN job_dir TEXT")
    db.execute("CREATE INDEX IF NOT EXISTS swarms_flow_run ON swarms(flow_run_id)")


def _v3(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE swarms ADD COLUMN source TEXT")


def _v4(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS leases (
            swarm TEXT NOT NULL,
            owner TEXT NOT NULL,
            kind TEXT NOT NULL,
            host TEXT,
            pid INTEGER,
            heartbeat REAL NOT NULL,
            expires_at REAL,
            created_at REAL NOT NULL,
            PRIMARY KEY (swarm, owner)
        )"""
    )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3, _v4]
"""Migration i brings the schema from version i to i+1. Append only."""

SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class SwarmRecord:
    """One swarm as stored."""

    name: str
    backend: str
    config: dict[str, Any]
    phase: ServingPhase
    handle: dict[str, Any] | None = None
    flow_run_id: str | None = None
    keep: bool = False
    fingerprint: str | None = None
    source: str | None = None
    """Where the config came from, e.g. ``swarm-spec/NAME``: a later process reloads its secrets there."""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def run_dir(self) -> str | None:
        """The recorded config's ``backend.run_dir`` (see :attr:`SwarmConfig.run_dir`), if any."""
        backend = self.config.get("backend") or {}
        return backend.get("run_dir") if isinstance(backend, dict) else None


@dataclass(frozen=True)
class JobRecord:
    """One job as stored, whoever submitted it (the CLI or a flow run).

    ``handle`` is ``{"submissions": [...]}``: one entry per submission to the compute backend (a
    :class:`~prefect_swarm.interfaces.JobHandle` dict plus the ``shards`` it runs and, from a flow,
    the ``task_run_id``). ``progress`` holds the job's sums; per-shard progress lives in the ledger.
    """

    id: str
    spec: dict[str, Any]
    status: JobStatus
    swarm: str | None = None
    handle: dict[str, Any] | None = None
    shard: int | None = None
    nshards: int = 1
    progress: dict[str, Any] | None = None
    flow_run_id: str | None = None
    task_run_id: str | None = None
    job_dir: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def submissions(self) -> list[Submission]:
        """Every submission of the job to its compute backend, oldest first (a copy)."""
        return [cast(Submission, dict(sub)) for sub in (self.handle or {}).get("submissions") or []]


class Submission(TypedDict, total=False):
    """One submission of a job as :class:`JobRecord` stores it: a
    :class:`~prefect_swarm.interfaces.JobHandle` dict (``id``, ``backend``, ``name``, ``meta``) plus
    the ``shards`` it runs (empty for a script job) and, from a flow, the ``task_run_id``."""

    id: str
    backend: str
    name: str
    meta: dict[str, Any]
    shards: list[int]
    task_run_id: str | None


class LeaseKind(enum.StrEnum):
    """Who holds a swarm, and so how to tell that the holder is gone."""

    FLOW_RUN = "flow_run"
    """A Prefect flow run (owner ``flow-run:<id>``): dead once Prefect says the run is terminal."""
    PROCESS = "process"
    """A process on ``host`` (a CLI command waiting on a job): dead once its pid is gone there."""
    JOB = "job"
    """A job (owner ``job:<id>``, e.g. ``job submit`` without waiting): dead once the job is not active."""
    KEEP = "keep"
    """``up`` / ``keep_swarm``: never dead; only ``down`` releases it."""
    TEARDOWN = "teardown"
    """The swarm is being stopped: whoever wants it waits until this lease is gone."""
    BRING_UP = "bring_up"
    """A process submitting the swarm (owner ``bring-up:<host>:<pid>``), held only while it does:
    dead once its pid is gone there, and then its bring-up blocks nobody."""


@dataclass(frozen=True)
class LeaseRecord:
    """One holder of one swarm. A swarm is stopped only when none of its leases is live."""

    swarm: str
    owner: str
    kind: LeaseKind
    host: str | None = None
    pid: int | None = None
    heartbeat: float = field(default_factory=time.time)
    expires_at: float | None = None
    """Until then the lease is live whatever its owner does; after it, live while the owner is."""
    created_at: float = field(default_factory=time.time)


class Claim(enum.StrEnum):
    """What :meth:`StateStore.claim_swarm` found."""

    BRING_UP = "bring_up"
    """No live swarm of that name: the caller's record was written (PENDING); it brings it up."""
    ATTACH = "attach"
    """A live (or coming up) swarm: the caller holds a lease on it now and waits for it."""
    WAIT = "wait"
    """The swarm is being stopped: nothing was written; ask again shortly."""


_R = TypeVar("_R", "SwarmRecord", "JobRecord", "LeaseRecord")

_JSON_COLS = {"config", "handle", "spec", "progress"}
_ENUM_COLS: dict[str, type[ServingPhase] | type[JobStatus] | type[LeaseKind]] = {
    "phase": ServingPhase,
    "status": JobStatus,
    "kind": LeaseKind,
}


def _dump(col: str, value: Any) -> Any:
    if col in _JSON_COLS and value is not None:
        return json.dumps(value, sort_keys=True, default=str)
    if col == "keep":
        return int(bool(value))
    if col in _ENUM_COLS and value is not None:
        return _ENUM_COLS[col](value).value
    return value


def _load(row: sqlite3.Row) -> dict[str, Any]:
    out = {k: row[k] for k in row.keys()}  # noqa: SIM118 (sqlite3.Row is not a dict)
    for col in _JSON_COLS & out.keys():
        if out[col] is not None:
            out[col] = json.loads(out[col])
    if "keep" in out:
        out["keep"] = bool(out["keep"])
    for col in _ENUM_COLS.keys() & out.keys():
        out[col] = _ENUM_COLS[col](out[col])
    return out


class StateStore:
    """Swarms and jobs in SQLite at ``path`` (default ``$PREFECT_SWARM_HOME/state.db``)."""

    def __init__(self, path: str | Path | None = None, busy_timeout_ms: int | None = None) -> None:
        settings = get_settings()
        self.path = Path(path) if path is not None else settings.state_db
        self.busy_timeout_ms = busy_timeout_ms if busy_timeout_ms is not None else settings.busy_timeout_ms
        self.journal_setting = settings.state_journal
        self._ready = False  # the file is created and migrated on first use, not here

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self._ready = True
            try:
                self._migrate()
            except BaseException:
                self._ready = False
                raise
        with self._raw_connect(write) as db:
            yield db

    @contextmanager
    def _raw_connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            if write:
                db.execute("BEGIN IMMEDIATE")
            yield db
            if write:
                db.execute("COMMIT")
        except BaseException:
            if write and db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def _migrate(self) -> None:
        """Create the file, set its journal mode, and bring its schema forward (once per store).

        The folder is this user's alone and the file 0600 (:func:`~prefect_swarm.paths.private_dir`,
        :func:`~prefect_swarm.paths.private_file`); SQLite gives its -wal and -shm files the database
        file's mode, and ones left by an older version are closed here too."""
        private_dir(self.path.parent)
        for path in (self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))):
            if path == self.path or path.exists():
                private_file(path)
        self._set_journal(journal_for(self.path.parent, self.journal_setting))
        with self._raw_connect() as db:
            if int(db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
                return  # the common case takes no write lock
        with self._raw_connect(write=True) as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"{self.path} has schema version {version}, newer than this prefect-swarm "
                    f"({SCHEMA_VERSION}). Upgrade prefect-swarm or point PREFECT_SWARM_HOME elsewhere."
                )
            for step in MIGRATIONS[version:]:
                step(db)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _set_journal(self, mode: str) -> None:
        # Switching the journal mode needs an exclusive lock, and SQLite does not always call the
        # busy handler for it: when many processes open a fresh database at once, retry here.
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                with self._raw_connect() as db:
                    if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != mode:
                        db.execute(f"PRAGMA journal_mode={mode.upper()}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise StateError(f"cannot open {self.path}: {exc}. Is another process holding it?") from exc
                time.sleep(0.02)

    @property
    def journal_mode(self) -> str:
        """The database's journal mode (``wal``, or ``delete`` on a network filesystem: :func:`journal_for`)."""
        with self._connect() as db:
            return str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()

    @property
    def schema_version(self) -> int:
        """The database's schema version."""
        with self._connect() as db:
            return int(db.execute("PRAGMA user_version").fetchone()[0])

    # ------------------------------------------------------------------ swarms
    def put_swarm(self, rec: SwarmRecord) -> SwarmRecord:
        """Insert or replace the record of swarm ``rec.name``."""
        rec = replace(rec, updated_at=time.time())
        with self._connect(write=True) as db:
            self._insert(db, "swarms", rec)
        return rec

    def get_swarm(self, name: str) -> SwarmRecord | None:
        """The record of swarm ``name``, or None."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM swarms WHERE name = ?", (name,)).fetchone()
        return SwarmRecord(**_load(row)) if row else None

    def require_swarm(self, name: str) -> SwarmRecord:
        """Like :meth:`get_swarm` but raise StateError naming the known swarms."""
        rec = self.get_swarm(name)
        if rec is None:
            known = ", ".join(r.name for r in self.list_swarms()) or "none"
            raise StateError(
                f"no swarm named '{name}' in {self.path} (known: {known}). `prefect-swarm list` shows them."
            )
        return rec

    def list_swarms(self) -> list[SwarmRecord]:
        """Every swarm record, oldest first."""
        return self._select(SwarmRecord, "SELECT * FROM swarms ORDER BY created_at, name")

    def update_swarm(self, name: str, **fields: Any) -> SwarmRecord:
        """Change some fields of swarm ``name`` atomically; raise StateError if it is gone."""
        return self._update("swarms", "name", name, SwarmRecord, fields)

    def settle_phase(self, rec: SwarmRecord, phase: ServingPhase) -> bool:
        """Set swarm ``rec.name``'s phase to ``phase`` only if its record is still ``rec`` as read (same
        phase, not updated since): a look that took a while never overwrites what changed meanwhile.
        True when it was set."""
        with self._connect(write=True) as db:
            cur = db.execute(
                "UPDATE swarms SET phase = ?, updated_at = ? WHERE name = ? AND phase = ? AND updated_at = ?",
                (phase.value, time.time(), rec.name, rec.phase.value, rec.updated_at),
            )
            return cur.rowcount > 0

    def delete_swarm(self, name: str) -> bool:
        """Remove the record; True if one was removed."""
        with self._connect(write=True) as db:
            return db.execute("DELETE FROM swarms WHERE name = ?", (name,)).rowcount > 0

    def find_swarms_by_flow_run(self, flow_run_id: str) -> list[SwarmRecord]:
        """Swarms brought up by flow run ``flow_run_id``."""
        return self._select(SwarmRecord, "SELECT * FROM swarms WHERE flow_run_id = ?", (flow_run_id,))

    # ------------------------------------------------------------------ leases
    def claim_swarm(
        self, rec: SwarmRecord, lease: LeaseRecord, live_phases: frozenset[ServingPhase]
    ) -> tuple[Claim, SwarmRecord | None]:
        """Hold swarm ``rec.name`` for ``lease.owner``, atomically with deciding who brings it up.

        Live (a phase in ``live_phases``): add the lease, return ATTACH and the stored record.
        Not live: write ``rec`` and the lease, return BRING_UP. Being stopped (a TEARDOWN lease):
        write nothing, return WAIT. Two callers never both get BRING_UP for one live swarm.
        """
        lease = replace(lease, swarm=rec.name)
        with self._connect(write=True) as db:
            tear = db.execute(
                "SELECT 1 FROM leases WHERE swarm = ? AND kind = ?", (rec.name, LeaseKind.TEARDOWN.value)
            ).fetchone()
            if tear is not None:
                return Claim.WAIT, None
            row = db.execute("SELECT * FROM swarms WHERE name = ?", (rec.name,)).fetchone()
            existing = SwarmRecord(**_load(row)) if row else None
            self._insert(db, "leases", lease)
            if existing is not None and existing.phase in live_phases:
                return Claim.ATTACH, existing
            if existing is not None:
                rec = replace(rec, created_at=time.time())
            self._insert(db, "swarms", replace(rec, updated_at=time.time()))
            return Claim.BRING_UP, rec

    def put_lease(self, lease: LeaseRecord) -> LeaseRecord:
        """Insert or replace ``lease`` (one per swarm and owner)."""
        with self._connect(write=True) as db:
            self._insert(db, "leases", lease)
        return lease

    def list_leases(self, swarm: str | None = None) -> list[LeaseRecord]:
        """Leases (of one swarm if given), oldest first."""
        query, args = "SELECT * FROM leases", cast(tuple[str, ...], ())
        if swarm is not None:
            query, args = query + " WHERE swarm = ?", (swarm,)
        return self._select(LeaseRecord, query + " ORDER BY created_at, owner", args)

    def leases_of(self, owner: str) -> list[LeaseRecord]:
        """Every lease ``owner`` holds."""
        return self._select(LeaseRecord, "SELECT * FROM leases WHERE owner = ? ORDER BY created_at", (owner,))

    def release_lease(self, swarm: str, owner: str) -> bool:
        """Drop ``owner``'s lease on ``swarm``; True if there was one."""
        with self._connect(write=True) as db:
            return db.execute("DELETE FROM leases WHERE swarm = ? AND owner = ?", (swarm, owner)).rowcount > 0

    def release_and_claim_teardown(
        self, swarm: str, owner: str | None, dead: set[str], teardown: LeaseRecord
    ) -> list[LeaseRecord]:
        """Drop ``owner``'s lease and the ``dead`` owners' leases on ``swarm``, atomically; if no other
        lease is left, take the TEARDOWN lease ``teardown`` (the caller then stops the swarm and
        drops it) and return []; else return the leases that still hold the swarm."""
        gone = {*dead, *([owner] if owner else [])}
        with self._connect(write=True) as db:
            for who in gone:
                db.execute("DELETE FROM leases WHERE swarm = ? AND owner = ?", (swarm, who))
            rows = db.execute("SELECT * FROM leases WHERE swarm = ? ORDER BY created_at", (swarm,)).fetchall()
            left = [LeaseRecord(**_load(r)) for r in rows]
            if left:
                return left
            self._insert(db, "leases", replace(teardown, swarm=swarm))
            return []

    def clear_leases(self, swarm: str) -> int:
        """Drop every lease on ``swarm`` (it was stopped); return how many."""
        with self._connect(write=True) as db:
            return db.execute("DELETE FROM leases WHERE swarm = ?", (swarm,)).rowcount

    # ------------------------------------------------------------------ jobs
    def put_job(self, rec: JobRecord) -> JobRecord:
        """Insert or replace the record of job ``rec.id``."""
        rec = replace(rec, updated_at=time.time())
        with self._connect(write=True) as db:
            self._insert(db, "jobs", rec)
        return rec

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record of job ``job_id``, or None."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord(**_load(row)) if row else None

    def require_job(self, job_id: str) -> JobRecord:
        """Like :meth:`get_job` but raise StateError."""
        rec = self.get_job(job_id)
        if rec is None:
            raise StateError(f"no job '{job_id}' in {self.path}. `prefect-swarm job list` shows them.")
        return rec

    def list_jobs(self, swarm: str | None = None) -> list[JobRecord]:
        """Every job record (of one swarm if given), oldest first."""
        query, args = "SELECT * FROM jobs", cast(tuple[str, ...], ())
        if swarm is not None:
            query, args = query + " WHERE swarm = ?", (swarm,)
        return self._select(JobRecord, query + " ORDER BY created_at, id", args)

    def update_job(self, job_id: str, **fields: Any) -> JobRecord:
        """Change some fields of job ``job_id`` atomically; raise StateError if it is gone."""
        return self._update("jobs", "id", job_id, JobRecord, fields)

    def add_job_submission(self, job_id: str, submission: dict[str, Any], status: JobStatus) -> JobRecord:
        """Append ``submission`` to job ``job_id``'s submissions and set its status, atomically
        (shard tasks of one flow run submit from many threads at once)."""
        with self._connect(write=True) as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise StateError(f"no job '{job_id}' in {self.path}")
            rec = JobRecord(**_load(row))
            subs = [*rec.submissions, submission]
            rec = replace(rec, handle={"submissions": subs}, status=status, updated_at=time.time())
            db.execute(
                "UPDATE jobs SET handle = ?, status = ?, updated_at = ? WHERE id = ?",
                (_dump("handle", rec.handle), _dump("status", status), rec.updated_at, job_id),
            )
        return rec

    def jobs_of_flow_run(self, flow_run_id: str) -> list[JobRecord]:
        """Jobs submitted by flow run ``flow_run_id``."""
        return self._select(JobRecord, "SELECT * FROM jobs WHERE flow_run_id = ? ORDER BY created_at", (flow_run_id,))

    def delete_job(self, job_id: str) -> bool:
        """Remove the record; True if one was removed."""
        with self._connect(write=True) as db:
            return db.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount > 0

    # ------------------------------------------------------------------ shared
    def _select(self, cls: type[_R], query: str, args: tuple[Any, ...] = ()) -> list[_R]:
        with self._connect() as db:
            rows = db.execute(query, args).fetchall()
        return [cls(**_load(r)) for r in rows]

    @staticmethod
    def _insert(db: sqlite3.Connection, table: str, rec: Any) -> None:
        cols = list(type(rec).__dataclass_fields__)
        db.execute(
            f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            [_dump(c, getattr(rec, c)) for c in cols],
        )

    def _update(
        self,
        table: str,
        key: str,
        value: str,
        cls: type[SwarmRecord] | type[JobRecord],
        fields: dict[str, Any],
    ) -> Any:
        unknown = set(fields) - set(cls.__dataclass_fields__) - {key}
        if unknown:
            raise ValueError(f"unknown {table} fields: {sorted(unknown)}")
        fields = {**fields, "updated_at": time.time()}
        sets = ", ".join(f"{c} = ?" for c in fields)
        with self._connect(write=True) as db:
            cur = db.execute(
                f"UPDATE {table} SET {sets} WHERE {key} = ?",
                [*(_dump(c, v) for c, v in fields.items()), value],
            )
            if cur.rowcount == 0:
                raise StateError(f"no {table[:-1]} '{value}' in {self.path}")
            row = db.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
        return cls(**_load(row))
