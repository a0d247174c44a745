"""`prefect-swarm exec` on a real local swarm of stub engines: environment, exit code, refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
@pytest.mark.usefixtures("local_backend")
def test_exec_runs_in_the_replica_env_and_passes_the_exit_code(
    run_cli: Callable[..., Any],
    stub_swarm_config: Callable[..., Path],
    swarm_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PREFECT_SWARM_API_KEY", "sk-exec-test")  # the key reaches the replica from the env only
    path = stub_swarm_config("execy", replicas=2, env={"SOME_REPLICA_VAR": "from-the-swarm"})
    up = run_cli("up", "-c", str(path), "-o", "json")
    assert up.returncode == 0, up.stderr
    port = json.loads(up.stdout)["swarm"]["endpoint"].rsplit(":", 1)[1]

    script = 'echo "$SOME_REPLICA_VAR $PORT $PREFECT_SWARM_API_KEY $(pwd)"; echo oops >&2; exit 7'
    got = run_cli("exec", "execy", "--replica", "1", "--", "sh", "-c", script)
    assert got.returncode == 7, got.stderr
    var, seen_port, key, cwd = got.stdout.split()
    assert (var, int(seen_port), key) == ("from-the-swarm", int(port) + 1, "sk-exec-test")
    assert Path(cwd) == swarm_home / "swarms" / "execy"
    assert got.stderr.strip() == "oops"

    # the engine answers on $PORT from inside the replica with the key the replica holds (what the README's
    # `curl -H "Authorization: Bearer $PREFECT_SWARM_API_KEY" localhost:$PORT/metrics` relies on); a keyed
    # swarm is closed on every route, /health included
    probe = (
        "import os, sys, urllib.request as u; r = u.Request(f'http://127.0.0.1:{os.environ[\"PORT\"]}/health'); "
        "sys.argv[1:] and r.add_header('Authorization', 'Bearer ' + os.environ['PREFECT_SWARM_API_KEY']); u.urlopen(r)"
    )
    assert run_cli("exec", "execy", "--", "python", "-c", probe, "with-key").returncode == 0
    refused = run_cli("exec", "execy", "--", "python", "-c", probe)
    assert refused.returncode == 1 and "401" in refused.stderr

    bad = run_cli("exec", "execy", "--replica", "2", "--", "true")
    assert bad.returncode == 2 and "--replica" in bad.stderr

    assert run_cli("down", "execy", "-y").returncode == 0
    stopped = run_cli("exec", "execy", "--", "true")
    assert stopped.returncode == 4 and "stopped" in stopped.stderr


def test_exec_of_an_unknown_swarm_is_not_found(run_cli: Callable[..., Any]) -> None:
    got = run_cli("exec", "nope", "--", "true")
    assert got.returncode == 3, got.stderr


@pytest.mark.usefixtures("need_lepton_sdk")
def test_exec_on_lepton_is_refused_with_the_reason_before_anything_runs(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    from prefect_swarm.backends.registry import build_backends
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.interfaces import ServingHandle
    from prefect_swarm.interfaces.types import ServingPhase
    from prefect_swarm.paths import SwarmPaths
    from prefect_swarm.state import StateStore, SwarmRecord
    from prefect_swarm.testing.fake_lepton import FakeLepton

    with FakeLepton() as fake:
        cfg = SwarmConfig.model_validate(
            {
                "name": "lep",
                "model": "stub-model",
                "gpus_per_replica": 0,
                "backend": {
                    "type": "lepton",
                    "workspace_id": fake.workspace_id,
                    "workspace_url": fake.url,
                    "mounts": [{"path": "/prefect-swarm", "mount_path": str(tmp_path)}],
                    "shared_path": str(tmp_path / "runs"),
                },
            }
        )
        handle = ServingHandle(name="lep", backend="lepton", url=fake.url, meta={})
        StateStore().put_swarm(
            SwarmRecord(
                name="lep", backend="lepton", config=cfg.redacted(), phase=ServingPhase.RUNNING, handle=handle.to_dict()
            )
        )
        got = run_cli(
            "exec", "lep", "--", "true", env={"LEPTON_WORKSPACE_TOKEN": fake.token, "LEPTON_CACHE_DIR": str(tmp_path)}
        )
        assert got.returncode == 2, got.stderr
        assert "exec" in got.stderr and "no way to run a command inside a deployment replica" in got.stderr
        assert fake.requests == []  # refused before anything was asked of the workspace
        with pytest.raises(ConfigError, match="lepton backend lacks"):  # the seam itself refuses too
            build_backends(cfg, SwarmPaths.for_swarm("lep")).serving.exec_command(handle, 0, ["true"])
