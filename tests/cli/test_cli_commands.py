"""CLI behaviour that needs no running swarm: exit codes, errors, confirmation, hooks, prune rules."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prefect_swarm.cli.errors import ExitCode, exit_code_for
from prefect_swarm.cli.main import app
from prefect_swarm.exceptions import (
    BackendError,
    CapacityError,
    ConfigError,
    DatasetError,
    JobError,
    ReadinessError,
    StateError,
)
from prefect_swarm.state import StateStore, SwarmRecord

runner = CliRunner()


def invoke(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input)


def _record(
    name: str,
    phase: str = "RUNNING",
    handle: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    StateStore().put_swarm(
        SwarmRecord(
            name=name,
            backend="local",
            phase=phase,
            handle=handle,
            config=config if config is not None else {"name": name, "model": "m", "replicas": 1},
        )
    )


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("x"), 2),
        (DatasetError("x"), 2),
        (StateError("x"), 3),
        (BackendError("x"), 1),
        (ReadinessError("x"), 4),
        (CapacityError("x"), 4),
        (JobError("x"), 1),
        (RuntimeError("x"), 1),
    ],
)
def test_exit_code_mapping(exc: Exception, code: int) -> None:
    assert exit_code_for(exc) == code


def test_help_documents_exit_codes() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "Exit codes" in result.stdout and "not found" in result.stdout
    assert "Exit codes" in (sys.modules["prefect_swarm.cli.main"].__doc__ or "")


@pytest.mark.parametrize("command", [["status", "nope"], ["describe", "nope"], ["down", "nope", "-y"]])
def test_unknown_swarm_is_not_found(command: list[str]) -> None:
    result = invoke(*command)
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "no swarm named 'nope'" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(run_cli: Callable[..., Any]) -> None:
    plain = run_cli("status", "nope")
    debug = run_cli("--debug", "status", "nope")
    assert plain.returncode == debug.returncode == 3
    assert "Traceback" not in plain.stderr
    assert "Traceback" in debug.stderr


def test_down_needs_name_or_all() -> None:
    assert invoke("down").exit_code == ExitCode.BAD_INPUT
    assert invoke("down", "x", "--all").exit_code == ExitCode.BAD_INPUT


def test_down_asks_first_and_a_no_changes_nothing() -> None:
    _record("keepme")
    for answer in ("n\n", None):  # refused, and no terminal at all
        result = invoke("down", "keepme", input=answer)
        assert result.exit_code == ExitCode.FAILURE
        assert "nothing changed" in result.stderr
    assert StateStore().require_swarm("keepme").phase == "RUNNING"


def test_status_json_is_stable_without_a_handle() -> None:
    _record("nohandle", phase="PENDING")
    result = invoke("status", "nohandle", "-o", "json", "--no-history")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == 1
    assert doc["swarm"]["name"] == "nohandle"
    assert doc["status"]["phase"] == "PENDING" and doc["status"]["replicas"] == []
    assert doc["prefect"] == {"available": False, "runs": [], "error": None}


def _history_module(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any]) -> None:
    mod = types.ModuleType("prefect_swarm.tasks.flow_runs")
    mod.runs_for_swarm = fn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prefect_swarm.tasks.flow_runs", mod)


def test_prefect_history_unreachable_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(name: str, limit: int = 20) -> Any:
        raise ConnectionError("connection refused on 127.0.0.1:4200")

    _history_module(monkeypatch, boom)
    _record("hist", phase="PENDING")
    table = invoke("status", "hist")
    assert table.exit_code == 0, table.stderr
    lines = [ln for ln in table.stdout.splitlines() if "Prefect API unreachable" in ln]
    assert len(lines) == 1 and "connection refused" in lines[0]
    doc = json.loads(invoke("status", "hist", "-o", "json").stdout)
    assert doc["prefect"]["error"].startswith("Prefect API unreachable")


def test_prefect_history_runs_are_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    _history_module(monkeypatch, lambda name, limit=20: [{"name": f"run-of-{name}", "state": "COMPLETED", "id": "r1"}])
    _record("hist2", phase="PENDING")
    doc = json.loads(invoke("status", "hist2", "-o", "json").stdout)
    assert doc["prefect"] == {
        "available": True,
        "error": None,
        "runs": [{"name": "run-of-hist2", "state": "COMPLETED", "id": "r1"}],
    }
    assert "run-of-hist2" in invoke("status", "hist2").stdout


def test_prune_removes_only_what_is_certainly_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    reaper = types.ModuleType("prefect_swarm.tasks.reaper")
    reaper.reap_orphans = lambda dry_run=False: calls.append(dry_run) or []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prefect_swarm.tasks.reaper", reaper)
    _record("stopped", phase="STOPPED")
    _record("no-handle", phase="PENDING")
    # the backend cannot be asked (the stored config is unusable): an error proves nothing, so it stays
    _record("unsure", phase="RUNNING", handle={"name": "unsure", "backend": "local"}, config={"bogus": 1})
    dry = json.loads(invoke("db", "prune", "--dry-run", "-o", "json").stdout)
    assert [r["name"] for r in dry["removed"]] == ["stopped"]
    assert {r.name for r in StateStore().list_swarms()} == {"stopped", "no-handle", "unsure"}
    result = invoke("db", "prune", "-y", "-o", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["name"] for r in doc["removed"]] == ["stopped"]
    kept = {r["name"]: r["reason"] for r in doc["kept"]}
    assert set(kept) == {"no-handle", "unsure"}
    assert "could not ask" in kept["unsure"]
    assert {r.name for r in StateStore().list_swarms()} == {"no-handle", "unsure"}
    assert calls == [True, False]  # the reaper ran first, honouring --dry-run


def test_prune_asks_first() -> None:
    _record("stopped", phase="STOPPED")
    assert invoke("db", "prune", input="n\n").exit_code == ExitCode.FAILURE
    assert StateStore().get_swarm("stopped") is not None


def test_version() -> None:
    """What a user who installed into their own environment checks: this package and what it runs with."""
    from importlib.metadata import version

    from prefect_swarm import __version__

    table = invoke("version").stdout
    assert __version__ in table
    assert invoke("--version").stdout == table
    doc = json.loads(invoke("version", "-o", "json").stdout)
    assert doc["version"] == __version__
    for name in ("prefect", "pyarrow", "aiohttp", "pydantic", "httpx"):
        assert doc["packages"][name] == version(name)
        assert f"{name}" in table and version(name) in table


def test_version_finds_the_engine_in_its_own_python(tmp_path: Path) -> None:
    """The engine runs in a Python of its own: --engine-python asks that one; a wrong path is exit 2."""
    fake = tmp_path / "site"
    (fake / "vllm-0.0.1.dist-info").mkdir(parents=True)
    (fake / "vllm-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n")
    python = tmp_path / "engine-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    doc = json.loads(invoke("version", "-o", "json", "--engine-python", str(python)).stdout)
    assert doc["engines"] == {"vllm": "0.0.1"}
    assert "vllm       0.0.1" in invoke("version", "--engine-python", str(python)).stdout
    missing = invoke("version", "--engine-python", str(tmp_path / "nope"))
    assert missing.exit_code == ExitCode.BAD_INPUT
    assert "--engine-python" in missing.output and "Traceback" not in missing.output


def test_cli_does_not_import_prefect(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    import subprocess

    code = "import sys, prefect_swarm.cli.main; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_status_exits_cleanly_when_the_prefect_api_hangs(run_cli: Callable[..., Any]) -> None:
    """An API that answers /health but never answers the run query: status prints, exits 0, no abort."""
    import http.server
    import threading

    release = threading.Event()

    class Hanging(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /health answers, as a live but overloaded server's does
            if not self.path.endswith("/health"):
                release.wait(30)
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "4")
            self.end_headers()
            self.wfile.write(b"true")

        def do_POST(self) -> None:  # the run query never gets an answer while the command runs
            release.wait(30)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _record("hung", phase="PENDING")
        env = {
            "PREFECT_API_URL": f"http://127.0.0.1:{server.server_address[1]}/api",
            "PREFECT_SWARM_PREFECT_API_TIMEOUT_S": "1",
        }
        proc = run_cli("status", "hung", "-o", "json", env=env)
    finally:
        release.set()
        server.shutdown()
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    doc = json.loads(proc.stdout)
    assert doc["prefect"]["available"] is False
    assert "timed out" in doc["prefect"]["error"]
