"""A swarm's and a job's files are their user's alone (issue 35 item 1), decided in one place:
:func:`prefect_swarm.paths.private_dir` for folders, the entry points' umask for files.

Another user is played by uid 65534 (``nobody``): a folder chowned to it is one she made first. The
tests need root to hand a folder to another user; CI runs them as root.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.exceptions import AccessError
from prefect_swarm.paths import JobPaths, SwarmPaths, open_log, private_dir, private_umask, user_umask
from prefect_swarm.state import StateStore
from prefect_swarm.testing.users import NOBODY, as_user

OTHER = NOBODY
"""The other user's uid (``nobody``)."""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_missing_folders_are_made_0700_all_the_way_down(tmp_path: Path) -> None:
    paths = SwarmPaths.of("s", str(tmp_path / "scratch")).ensure()
    assert paths.root == tmp_path / "scratch" / "swarms" / "s"
    for folder in (tmp_path / "scratch", tmp_path / "scratch" / "swarms", paths.root):
        assert mode(folder) == 0o700, folder
    job = JobPaths(paths.job_dir("j1")).ensure()
    assert mode(job.root) == 0o700 and mode(job.root.parent) == 0o700


def test_own_folder_readable_by_others_is_closed_one_writable_by_others_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    private_dir(mine)
    assert mode(mine) == 0o700
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(AccessError, match=r"open: other users may write it \(mode 777\).*mkdir -m 700"):
        private_dir(open_to_all)


@needs_root
def test_a_swarm_folder_another_user_made_first_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)  # a shared scratch, sticky like /tmp
    squatted = scratch / "swarms" / "prod"
    squatted.mkdir(parents=True)
    os.chown(scratch / "swarms", OTHER, OTHER)
    (scratch / "swarms").chmod(0o755)
    os.chown(squatted, OTHER, OTHER)
    squatted.chmod(0o700)
    with pytest.raises(AccessError, match=r"swarms/prod: it belongs to nobody, not to you \(root\)"):
        SwarmPaths.of("prod", str(scratch)).ensure()
    assert list(squatted.iterdir()) == []


@needs_root
@pytest.mark.parametrize(
    ("above_mode", "above_owner", "refused"),
    [
        (0o777, 0, r"other users may write it \(mode 777\)"),  # group/world-writable, not sticky
        (0o2775, 0, r"other users may write it \(mode 2775\)"),  # a group project folder
        (0o1777, OTHER, r"a shared folder of nobody, who may replace what is in it"),  # sticky, another's
        (0o1777, 0, None),  # /tmp-like: fine
        (0o755, OTHER, None),  # another's folder nobody else may write: only its owner could swap
    ],
)
def test_a_folder_above_that_lets_another_user_swap_the_swarm_folder_is_refused(
    tmp_path: Path, above_mode: int, above_owner: int, refused: str | None
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "swarms").mkdir(mode=0o700)
    os.chown(run_dir, above_owner, above_owner)
    run_dir.chmod(above_mode)
    if refused is None:
        assert mode(SwarmPaths.of("s", str(run_dir)).ensure().root) == 0o700
        return
    with pytest.raises(AccessError, match=refused) as err:
        SwarmPaths.of("s", str(run_dir)).ensure()
    assert str(run_dir) in str(err.value)
    assert not (run_dir / "swarms" / "s").exists()


def test_a_link_in_place_of_the_swarm_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "swarms").mkdir(mode=0o700)
    (tmp_path / "swarms" / "s").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(AccessError, match=r"not a folder \(a symbolic link\)"):
        SwarmPaths.of("s", str(tmp_path)).ensure()


def test_state_db_and_its_journal_are_0600(swarm_home: Path) -> None:
    swarm_home.chmod(0o755)
    store = StateStore()
    store.list_swarms()
    assert mode(swarm_home) == 0o700
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        if (swarm_home / name).exists():
            assert mode(swarm_home / name) == 0o600, name
    assert mode(swarm_home / "state.db") == 0o600


def test_logs_are_0600_and_outputs_keep_the_users_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path / "logs" / "x.log") as fh:
        fh.write(b"line\n")
    assert mode(tmp_path / "logs" / "x.log") == 0o600 and mode(tmp_path / "logs") == 0o700
    monkeypatch.delenv("PREFECT_SWARM_USER_UMASK", raising=False)
    code = (
        "import os; os.umask(0o027); from prefect_swarm.paths import private_umask, user_umask; "
        "private_umask(); open('f', 'w').close(); print(oct(os.stat('f').st_mode & 0o777), oct(user_umask()))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0o600", "0o27"]
    assert private_umask and user_umask  # the names the entry points use


def as_other_user(argv: list[str]) -> tuple[int, str]:
    """The CLI with ``argv``, run as :data:`OTHER` (:func:`~prefect_swarm.testing.users.as_user`)."""

    def cli() -> tuple[int, str]:
        result = CliRunner().invoke(app, argv)
        return result.exit_code, result.output

    ok, value = as_user(OTHER, cli)
    assert ok, value
    return int(value[0]), str(value[1])


COMMANDS = [["list"], ["job", "status", "j1"], ["down", "s", "-y"], ["status", "s"], ["job", "cancel", "j1"]]


@needs_root
def test_another_users_commands_on_the_owners_home_get_one_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`list`, `job status`, `down`, `status`, `job cancel`, `up` by another user pointed at the owner's home:
    exit 2, one message naming the folder, no traceback, nothing of the owner's read or changed."""
    for argv in COMMANDS:  # warm-up as the owner on a home of its own: the imports each command needs
        CliRunner().invoke(app, argv)
    base = Path(tempfile.mkdtemp(prefix="psw-shared-"))  # a folder both users can reach, as on a site
    try:
        base.chmod(0o755)
        home = base / "home"
        monkeypatch.setenv("PREFECT_SWARM_HOME", str(home))
        StateStore().list_swarms()  # the owner's home, 0700, with its state.db
        before = (home / "state.db").read_bytes()
        config = base / "s.yaml"  # a config she may read: her `up` of it against the owner's home
        config.write_text("name: s\nmodel: m\nengine: {kind: command, command: [/bin/true]}\n")
        config.chmod(0o644)
        for argv in [*COMMANDS, ["up", "-c", str(config)]]:
            code, output = as_other_user(argv)
            assert code == 2, (argv, output)
            assert "Traceback" not in output and "AccessError" in output, (argv, output)
            assert str(home) in output.replace("\n", ""), (argv, output)
        assert (home / "state.db").read_bytes() == before
    finally:
        shutil.rmtree(base)


@needs_root
@pytest.mark.parametrize(
    ("raced", "mode", "refused"),
    [
        ("swarms", 0o777, r"swarms: other users may write it \(mode 777\)"),  # a level above the swarm's folder
        ("swarms/s", 0o700, r"swarms/s: it belongs to nobody, not to you"),  # the swarm's folder itself
    ],
)
def test_a_folder_another_user_makes_between_our_look_and_our_mkdir_is_judged_as_one_found(
    tmp_path: Path, raced: str, mode: int, refused: str
) -> None:
    """The race :func:`private_dir` must survive: it looked (nothing there), she made the folder, its
    mkdir then finds it. The squatter is played by the look itself (it makes the folder, as nobody's,
    and answers that nothing is there)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    target = run_dir / raced
    real = os.path.lexists

    def look_then_squat(p: Path) -> bool:
        if Path(p) == target and not real(target):
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            target.mkdir(mode=mode)
            os.chmod(target, mode)
            os.chown(target, OTHER, OTHER)
            return False
        return False if Path(p).is_relative_to(target) else real(p)

    with pytest.raises(AccessError, match=refused):
        private_dir(SwarmPaths.of("s", str(run_dir)).root, exists=look_then_squat)
