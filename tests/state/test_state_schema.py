"""Schema version, forward migration from a hand-made v1 database, WAL, and a lazy store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from prefect_swarm.exceptions import StateError
from prefect_swarm.state import SCHEMA_VERSION, JobRecord, StateStore, SwarmRecord

# The v1 schema exactly as the first release wrote it (kept here on purpose, not imported:
# the test must not follow later edits of the migration code).
V1_DDL = """
CREATE TABLE swarms (
    name TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    config TEXT NOT NULL,
    handle TEXT,
    phase TEXT NOT NULL,
    flow_run_id TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE jobs (
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
);
CREATE INDEX jobs_swarm ON jobs(swarm);
PRAGMA user_version = 1;
"""


def _make_v1(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(V1_DDL)
        db.execute(
            "INSERT INTO swarms VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "old",
                "local",
                json.dumps({"name": "old", "model": "m"}),
                json.dumps({"name": "old", "backend": "local", "url": "http://127.0.0.1:1"}),
                "RUNNING",
                "fr-1",
                100.0,
                101.0,
            ),
        )
        db.execute(
            "INSERT INTO jobs (id, swarm, spec, status, shard, nshards, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            ("job-1", "old", json.dumps({"x": 1}), "RUNNING", 0, 2, 100.0, 101.0),
        )
    db.close()


def test_schema_version_is_current(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    assert store.schema_version == SCHEMA_VERSION >= 2


def test_v1_database_is_migrated_forward_keeping_rows(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _make_v1(path)
    store = StateStore(path)
    assert store.schema_version == SCHEMA_VERSION
    rec = store.require_swarm("old")
    assert (rec.phase, rec.flow_run_id, rec.created_at) == ("RUNNING", "fr-1", 100.0)
    assert rec.config == {"name": "old", "model": "m"}
    assert rec.handle and rec.handle["url"] == "http://127.0.0.1:1"
    assert rec.keep is False and rec.fingerprint is None  # v2 columns, defaulted
    assert rec.source is None  # v3 column, defaulted
    job = store.require_job("job-1")
    assert (job.swarm, job.nshards, job.job_dir) == ("old", 2, None)
    # the new columns are usable
    assert store.update_swarm("old", keep=True, fingerprint="abc").keep is True
    assert store.update_swarm("old", source="swarm-spec/old").source == "swarm-spec/old"
    store.put_job(JobRecord(id="job-2", spec={}, status="PENDING", job_dir="/tmp/j"))
    assert store.require_job("job-2").job_dir == "/tmp/j"


def test_migration_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _make_v1(path)
    StateStore(path).list_swarms()
    StateStore(path).list_swarms()  # a second open must not re-run ALTER TABLE (it would fail)
    with sqlite3.connect(path) as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(swarms)")]
    assert cols.count("keep") == 1


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StateError, match="newer than this prefect-swarm"):
        StateStore(path).list_swarms()


def test_wal_mode_is_on(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    assert store.journal_mode == "wal"
    with sqlite3.connect(path) as db:  # persistent: any other connection sees it too
        assert db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"


def test_v1_database_in_rollback_mode_is_switched_to_wal(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _make_v1(path)
    assert StateStore(path).journal_mode == "wal"


def test_constructing_a_store_touches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    store = StateStore(path)
    assert not path.parent.exists()
    assert store.get_swarm("x") is None
    assert path.exists()


def test_default_path_follows_prefect_swarm_home(swarm_home: Path) -> None:
    store = StateStore()
    store.put_swarm(SwarmRecord(name="a", backend="local", config={}, phase="RUNNING"))
    assert (swarm_home / "state.db").exists()


def test_records_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    rec = SwarmRecord(
        name="a",
        backend="local",
        config={"k": [1, 2]},
        phase="PENDING",
        handle={"name": "a", "meta": {"pids": [1]}},
        keep=True,
        fingerprint="f",
    )
    store.put_swarm(rec)
    got = store.require_swarm("a")
    assert (got.config, got.handle, got.keep, got.fingerprint) == (rec.config, rec.handle, True, "f")
    assert store.update_swarm("a", phase="RUNNING").phase == "RUNNING"
    with pytest.raises(StateError):
        store.update_swarm("missing", phase="RUNNING")
    with pytest.raises(StateError, match="known: a"):
        store.require_swarm("b")
    assert store.delete_swarm("a") and not store.delete_swarm("a")
