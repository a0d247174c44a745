"""The state database's journal follows its filesystem: WAL on a local disk, a rollback journal on a
network filesystem (SQLite documents WAL as unsafe there), or what PREFECT_SWARM_STATE_JOURNAL says."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.state import StateStore
from prefect_swarm.state.store import filesystem_type, journal_for

MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
filer:/export/home /home nfs4 rw,vers=4.2 0 0
mds@tcp:/scratch /scratch lustre rw,flock 0 0
/dev/sdb1 /scratch/local ext4 rw 0 0
//srv/share /mnt/my\\040share cifs rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
/dev/sdc1 /mnt/usb fuseblk rw 0 0
"""


@pytest.fixture
def mounts(tmp_path: Path) -> Path:
    path = tmp_path / "mounts"
    path.write_text(MOUNTS)
    return path


@pytest.mark.parametrize(
    ("folder", "fs", "journal"),
    [
        ("/var/lib/x", "ext4", "wal"),
        ("/tmp/run", "tmpfs", "wal"),
        ("/home/alice/.prefect-swarm", "nfs4", "delete"),
        ("/homer", "ext4", "wal"),  # a prefix of the name is not the mount point
        ("/scratch/alice", "lustre", "delete"),
        ("/scratch/local/alice", "ext4", "wal"),  # the longest mount point wins
        ("/mnt/my share/state", "cifs", "delete"),  # /proc/mounts escapes the space
        ("/mnt/bucket/state", "fuse.s3fs", "delete"),
        ("/mnt/usb/state", "fuseblk", "wal"),
    ],
)
def test_journal_follows_the_filesystem(mounts: Path, folder: str, fs: str, journal: str) -> None:
    assert filesystem_type(Path(folder), mounts) == fs
    assert journal_for(Path(folder), "auto", mounts) == journal


def test_setting_overrides_detection(mounts: Path) -> None:
    assert journal_for(Path("/home/alice"), "wal", mounts) == "wal"
    assert journal_for(Path("/var/lib"), "delete", mounts) == "delete"


def test_unreadable_mount_table_means_local(tmp_path: Path) -> None:
    assert filesystem_type(tmp_path, tmp_path / "no-such-table") is None
    assert journal_for(tmp_path, "auto", tmp_path / "no-such-table") == "wal"


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="findmnt (util-linux) is not installed")
def test_filesystem_type_agrees_with_findmnt(tmp_path: Path) -> None:
    for folder in (tmp_path, Path("/"), Path("/proc/self")):
        found = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "--target", str(folder)], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert filesystem_type(folder) == found


def _journal(path: Path) -> str:
    with closing(sqlite3.connect(path)) as db:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def test_store_uses_a_rollback_journal_when_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.db"
    StateStore(path).list_swarms()  # created in WAL mode (a local disk)
    assert _journal(path) == "wal"
    monkeypatch.setenv("PREFECT_SWARM_STATE_JOURNAL", "delete")  # e.g. the home moved onto NFS
    store = StateStore(path)
    assert store.journal_mode == "delete"
    assert store.list_swarms() == []
    assert _journal(path) == "delete"  # persistent: every other process uses the rollback journal too
    assert not path.with_name("state.db-wal").exists() and not path.with_name("state.db-shm").exists()


def test_bad_journal_setting_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREFECT_SWARM_STATE_JOURNAL", "memory")
    with pytest.raises(ConfigError, match=r"PREFECT_SWARM_STATE_JOURNAL='memory': Input should be 'auto'"):
        StateStore(tmp_path / "state.db")
