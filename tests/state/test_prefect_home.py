"""A submit host whose prefect-swarm home is moved off $HOME gets nothing written under $HOME by a flow run:
Prefect's own files (the temporary server's database) follow PREFECT_SWARM_HOME, unless the user has a
Prefect profile of their own (~/.prefect) or names PREFECT_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_swarm.paths import PREFECT_FILES

FLOW = """
import prefect_swarm.flows
from prefect import flow

@flow
def one() -> int:
    return 1

assert one() == 1
"""


def _env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path, Path]:
    home, swarm_home = tmp_path / "home", tmp_path / "swarm-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(home), PREFECT_SWARM_HOME=str(swarm_home), PREFECT_SERVER_ANALYTICS_ENABLED="false", **extra)
    # the temporary server makes its database first: more than Prefect's default 20 s on a loaded machine
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    return env, home, swarm_home


def test_a_flow_run_on_a_submit_host_writes_nothing_under_home(tmp_path: Path) -> None:
    env, home, swarm_home = _env(tmp_path)
    out = subprocess.run([sys.executable, "-c", FLOW], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(home.rglob("*")) == []
    assert (swarm_home / PREFECT_FILES / "prefect.db").is_file()  # the temporary server's database


@pytest.mark.parametrize("given", ["profile", "PREFECT_HOME", "no swarm home"])
def test_prefect_home_is_left_alone_where_the_user_has_one(tmp_path: Path, given: str) -> None:
    env, home, _ = _env(tmp_path)
    if given == "profile":
        (home / ".prefect").mkdir()
    elif given == "PREFECT_HOME":
        env["PREFECT_HOME"] = str(tmp_path / "mine")
    else:
        del env["PREFECT_SWARM_HOME"]
    probe = "import os, prefect_swarm; print(os.environ.get('PREFECT_HOME'))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == env.get("PREFECT_HOME", "None")
