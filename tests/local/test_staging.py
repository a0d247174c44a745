"""Model staging (``stage:``) on the local backend: copied once, skipped when it matches, the engine
loads the staged copy, ``volumes list|rm`` see it and ``rm`` is refused while a live swarm uses it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_kit import STUB, stub_config
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.paths import file_lock
from prefect_swarm.sidecar.stage import MARKER, lock_path, manifest
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.models import make_model_folder, model_checking_engine

runner = CliRunner()

CHECKING_ENGINE = model_checking_engine(STUB)


def staged_mtimes(staged: Path) -> dict[str, int]:
    return {p.relative_to(staged).as_posix(): p.stat().st_mtime_ns for p in staged.rglob("*") if p.is_file()}


def stage_cli(src: Path, dest: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "prefect_swarm.sidecar.stage", "--from", str(src), "--to", str(dest)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_stagers_copy_once_and_a_changed_source_is_staged_again(tmp_path: Path) -> None:
    src, dest = make_model_folder(tmp_path), tmp_path / "local" / "tiny"
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / ".tiny.tmp-999").mkdir()  # a killed stager's half copy
    with file_lock(lock_path(dest)):  # all three start while the lock is held, so they really contend
        procs = [stage_cli(src, dest) for _ in range(3)]
        time.sleep(1.0)
        assert all(p.poll() is None for p in procs)  # blocked on the lock
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert all(out.strip() == str(dest) for out, _ in outs)  # each prints the staged path
    logs = "".join(err for _, err in outs)
    assert logs.count("staged 3 files") == 1 and logs.count("already staged") == 2, logs
    assert not (tmp_path / "local" / ".tiny.tmp-999").exists()
    marker = json.loads((dest / MARKER).read_text())
    assert marker["hash"] == manifest(src).digest and marker["files"] == 3
    assert (dest / "shards" / "weights.bin").read_bytes() == (src / "shards" / "weights.bin").read_bytes()

    before = staged_mtimes(dest)
    (src / "config.json").write_text(json.dumps({"model_type": "stub", "v": 2}))  # new size and mtime
    _, err = stage_cli(src, dest).communicate(timeout=60)
    assert "staged 3 files" in err and json.loads((dest / "config.json").read_text())["v"] == 2
    assert staged_mtimes(dest)["config.json"] != before["config.json"]

    (dest / "shards" / "weights.bin").unlink()  # a damaged copy is staged again
    assert "staged 3 files" in stage_cli(src, dest).communicate(timeout=60)[1]


def test_missing_source_is_a_clear_failure(tmp_path: Path) -> None:
    out, err = stage_cli(tmp_path / "nope", tmp_path / "local" / "x").communicate(timeout=60)
    assert "stage.from" in err and "is not a directory" in err and out == ""


class Messages(logging.Handler):
    """The messages of the stage logger (the CLI's logging setup does not reach it)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def stage_log() -> Iterator[Messages]:
    logger, handler = logging.getLogger("prefect_swarm.stage"), Messages()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_two_replicas_stage_once_second_up_skips_and_volumes_rm_waits_for_down(
    tmp_path: Path, stage_log: Messages, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_folder(tmp_path)
    cfg = stub_config(2, command=CHECKING_ENGINE, model=str(model), stage={"to": str(tmp_path / "node-disk")})
    staged = Path(cfg.staged_model or "")

    swarm = Swarm(cfg)
    try:
        t0 = time.monotonic()
        swarm.up()
        swarm.wait_ready()
        first = time.monotonic() - t0
        assert sum("staged 3 files" in m for m in stage_log.messages) == 1, stage_log.messages
        for i in range(2):  # the engine of each replica was given the staged folder
            assert f"engine model path: {staged}" in swarm.paths.replica_log(i).read_text()
        mtimes = staged_mtimes(staged)

        listed = runner.invoke(app, ["volumes", "list", "-o", "json"])
        assert listed.exit_code == 0, listed.output
        (row,) = json.loads(listed.stdout)["volumes"]
        assert row["path"] == str(staged) and row["used_by"] == [cfg.name] and row["files"] == 3

        refused = runner.invoke(app, ["volumes", "rm", str(staged), "-y"])
        assert refused.exit_code != 0 and cfg.name in refused.output and staged.is_dir()
    finally:
        swarm.down()

    stage_log.messages.clear()
    again = Swarm(cfg)
    try:
        t0 = time.monotonic()
        again.up()
        again.wait_ready()
        second = time.monotonic() - t0
        assert any(m.startswith("already staged") for m in stage_log.messages), stage_log.messages
        assert not any("staged 3 files" in m for m in stage_log.messages)
        assert staged_mtimes(staged) == mtimes  # nothing was copied again
    finally:
        again.down()
    with capsys.disabled():  # in the test log even without -s
        print(f"\nlocal staging: first up (copy) {first:.2f} s, second up (skipped) {second:.2f} s")

    removed = runner.invoke(app, ["volumes", "rm", str(staged), "-y"])
    assert removed.exit_code == 0, removed.output
    assert not staged.exists()
    assert runner.invoke(app, ["volumes", "rm", str(tmp_path), "-y"]).exit_code != 0  # not a staged copy


def test_volumes_list_says_why_slurm_copies_are_not_listed_here(tmp_path: Path) -> None:
    from prefect_swarm.interfaces.types import ServingPhase
    from prefect_swarm.state import StateStore, SwarmRecord

    config = {"name": "far", "model": "/models/m", "stage": {"to": "/local/models"}, "backend": {"type": "slurm"}}
    StateStore().put_swarm(SwarmRecord(name="far", backend="slurm", config=config, phase=ServingPhase.RUNNING))
    out = runner.invoke(app, ["volumes", "list", "-o", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["volumes"] == []
    (na,) = doc["unavailable"]
    assert na["to"] == "/local/models" and "not visible" in na["reason"] and "--list /local/models" in na["reason"]


def test_stage_is_refused_on_a_backend_that_cannot_run_it() -> None:
    with pytest.raises(ValueError, match="remove stage"):
        SwarmConfig.model_validate(
            {
                "name": "far",
                "model": "/models/m",
                "stage": {"to": "/local"},
                "backend": {"type": "lepton", "workspace_id": "ws"},
            }
        )
