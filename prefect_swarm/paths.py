"""The only code that knows the on-disk layout under ``$PREFECT_SWARM_HOME``.

    <home>/state.db
    <home>/defaults.yaml
    <home>/swarms/<name>/            SwarmPaths
        config.yaml                  redacted config as brought up
        replica-<i>.status.json      watchdog status (atomic writes)
        replica-<i>.log              engine stdout+stderr
        replica-<i>.head             host:port once healthy (Slurm)
        watchdog-<i>.log / .pid / .json   watchdog log, pid record, spec (no secrets)
        jobs/<job_id>/               JobPaths
    <home>/jobs/<job_id>/            JobPaths.standalone (a job against no recorded swarm)
    <job_dir>/                       JobPaths (also used for ledgers outside a swarm folder)
        spec.json  manifest.json  failed.jsonl  validated.json  commit.lock
        launch.json  logs/shard-<i>.log  logs/shard-<i>.exit.json   (local compute backend)
        shards/<i>/                  ShardPaths
            part-<seq>.parquet  progress.json  fingerprint.json  job.log  DONE
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect_swarm.settings import get_settings


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path`` to write; on success fsync and rename it over ``path``.

    For writers that need a file name (a parquet writer streaming batches). On error the temp
    file is removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Atomic text write (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomic JSON write."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def read_json(path: Path, default: Any = None) -> Any:
    """Read JSON, or ``default`` when the file is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


def home_dir() -> Path:
    """``$PREFECT_SWARM_HOME`` expanded."""
    return get_settings().home_dir


@dataclass(frozen=True)
class SwarmPaths:
    """Files of one swarm."""

    root: Path

    @classmethod
    def for_swarm(cls, name: str, base: Path | None = None) -> SwarmPaths:
        """The folder of swarm ``name`` under ``base`` (default ``$PREFECT_SWARM_HOME``)."""
        return cls((base or home_dir()) / "swarms" / name)

    def ensure(self) -> SwarmPaths:
        """Create the folder; return self."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def config(self) -> Path:
        """Redacted config as brought up."""
        return self.root / "config.yaml"

    def replica_status(self, i: int) -> Path:
        """Watchdog status file of replica ``i``."""
        return self.root / f"replica-{i}.status.json"

    def replica_log(self, i: int) -> Path:
        """Engine log of replica ``i``."""
        return self.root / f"replica-{i}.log"

    def replica_head(self, i: int) -> Path:
        """Head file (``host:port``) of replica ``i``, written once healthy."""
        return self.root / f"replica-{i}.head"

    def watchdog_log(self, i: int) -> Path:
        """Watchdog log of replica ``i``."""
        return self.root / f"watchdog-{i}.log"

    def watchdog_pid(self, i: int) -> Path:
        """Pid record (JSON: pid, create_time) of the watchdog of replica ``i`` (local backend)."""
        return self.root / f"watchdog-{i}.pid"

    def watchdog_spec(self, i: int) -> Path:
        """JSON spec the watchdog of replica ``i`` runs from (no secrets inside)."""
        return self.root / f"watchdog-{i}.json"

    def file(self, name: str) -> Path:
        """Any other file in the swarm folder (rendered scripts, nginx config...)."""
        return self.root / name

    def job_dir(self, job_id: str) -> Path:
        """Folder of job ``job_id`` run on this swarm."""
        return self.root / "jobs" / job_id


@dataclass(frozen=True)
class ShardPaths:
    """Files of one shard's ledger."""

    root: Path

    @property
    def parts_glob(self) -> str:
        """Glob matching committed part files."""
        return "part-*.parquet"

    def part(self, seq: int) -> Path:
        """Part file number ``seq``."""
        return self.root / f"part-{seq:06d}.parquet"

    def parts(self) -> list[Path]:
        """Committed part files, in order (temp files are never matched)."""
        return sorted(self.root.glob(self.parts_glob))

    @property
    def progress(self) -> Path:
        """Progress JSON (done, failed, total, tokens, rate)."""
        return self.root / "progress.json"

    @property
    def fingerprint(self) -> Path:
        """Fingerprint the ledger was written under."""
        return self.root / "fingerprint.json"

    @property
    def log(self) -> Path:
        """Job process log of this shard."""
        return self.root / "job.log"

    @property
    def done_marker(self) -> Path:
        """Present once the shard has finished every row."""
        return self.root / "DONE"


@dataclass(frozen=True)
class JobPaths:
    """Files of one job: spec, shard ledgers, manifest, failed rows."""

    root: Path

    @classmethod
    def standalone(cls, job_id: str, base: Path | None = None) -> JobPaths:
        """Folder of job ``job_id`` when it belongs to no swarm: ``<home>/jobs/<job_id>``."""
        return cls((base or home_dir()) / "jobs" / job_id)

    def ensure(self) -> JobPaths:
        """Create the folder; return self."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def spec(self) -> Path:
        """The JobSpec as JSON (what the job process reads)."""
        return self.root / "spec.json"

    @property
    def manifest(self) -> Path:
        """Manifest written at commit (counts, tokens, timings, fingerprint)."""
        return self.root / "manifest.json"

    @property
    def failed_rows(self) -> Path:
        """Error rows listed at commit (JSONL: id, error)."""
        return self.root / "failed.jsonl"

    @property
    def validated(self) -> Path:
        """Stamp of the input identity whose ids were checked unique (skips re-checking)."""
        return self.root / "validated.json"

    @property
    def commit_lock(self) -> Path:
        """Lock file serialising commits of this job."""
        return self.root / "commit.lock"

    COMMIT_TMP_PREFIX = ".commit-buckets-"
    """Prefix of the temporary bucket folders a commit sorts one shard's ledger in."""

    def commit_tmp_dirs(self) -> list[Path]:
        """Bucket folders left by a commit that was killed mid-merge."""
        return sorted(self.root.glob(self.COMMIT_TMP_PREFIX + "*"))

    def shards_root(self) -> Path:
        """Folder holding every shard's ledger."""
        return self.root / "shards"

    def shard(self, i: int) -> ShardPaths:
        """Ledger folder of shard ``i``."""
        return ShardPaths(self.root / "shards" / f"{i:05d}")

    def log(self, i: int) -> Path:
        """Process log of shard ``i`` (stdout+stderr)."""
        return self.root / "logs" / f"shard-{i:05d}.log"

    def exit_status(self, i: int) -> Path:
        """Exit status (JSON) of the process of shard ``i``, written by ``runtime.exitcode`` (local)."""
        return self.root / "logs" / f"shard-{i:05d}.exit.json"

    @property
    def launch(self) -> Path:
        """What a compute backend started for this job (JSON: pids, shards; local backend)."""
        return self.root / "launch.json"
