"""Every malformed config in ``corpus/`` is refused by ``validate`` and ``up`` before anything starts.

Each corpus file says what the message must contain (``# expect: TEXT``, usually the field path)
and what it must never contain (``# forbid: TEXT``, e.g. a secret value).

The corpus runs the CLI's own app in this process (typer's runner: same commands, messages and exit
codes); the installed ``prefect-swarm`` script is checked to say the same for a sample, so 80 files
do not cost 80 interpreter starts.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.yaml"))


def _directives(path: Path, key: str) -> list[str]:
    prefix = f"# {key}:"
    return [ln[len(prefix) :].strip() for ln in path.read_text().splitlines() if ln.startswith(prefix)]


def _processes_with_home(home: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PREFECT_SWARM_HOME") == str(home):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _assert_nothing_started(home: Path) -> None:
    db = home / "state.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "swarms" in tables:
                assert conn.execute("SELECT count(*) FROM swarms").fetchone()[0] == 0
    assert not (home / "swarms").exists(), "a swarm folder was created"
    assert _processes_with_home(home) == [], "a process was left running"


def test_corpus_is_big_enough() -> None:
    assert len(FILES) >= 25
    for path in FILES:
        assert _directives(path, "expect"), f"{path.name} names no expected field"


def _in_process(*args: str) -> tuple[int, str, str]:
    """``prefect-swarm ARGS`` run by the CLI's app in this process: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
@pytest.mark.parametrize("command", ["validate", "up"])
def test_malformed_config_is_refused(path: Path, command: str, swarm_home: Path) -> None:
    code, stdout, stderr = _in_process(command, "-c", str(path))
    out = stdout + stderr
    assert code == 2, out
    assert "ConfigError" in stderr
    assert "Traceback" not in out
    for text in _directives(path, "expect"):
        assert text in stderr, f"{path.name}: {text!r} not in:\n{stderr}"
    for text in _directives(path, "forbid"):
        assert text not in out, f"{path.name}: {text!r} leaked into the output"
    _assert_nothing_started(swarm_home)


SAMPLE = [FILES[0], FILES[len(FILES) // 2], FILES[-1]]


@pytest.mark.parametrize("path", SAMPLE, ids=[p.stem for p in SAMPLE])
@pytest.mark.parametrize("command", ["validate", "up"])
def test_the_installed_script_refuses_as_the_app_does(
    path: Path, command: str, run_cli: Callable[..., object], swarm_home: Path
) -> None:
    result = run_cli(command, "-c", str(path))
    assert result.returncode == 2, result.stdout + result.stderr  # type: ignore[attr-defined]
    assert result.stderr == _in_process(command, "-c", str(path))[2]  # type: ignore[attr-defined]
    _assert_nothing_started(swarm_home)


def test_missing_file_is_bad_input(run_cli: Callable[..., object], tmp_path: Path, swarm_home: Path) -> None:
    result = run_cli("validate", "-c", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2  # type: ignore[attr-defined]
    assert "does not exist" in result.stderr  # type: ignore[attr-defined]
    _assert_nothing_started(swarm_home)
