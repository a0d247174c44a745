"""An external swarm whose key is a Prefect Secret block: `up` from the CLI and a batch_inference
flow load it through the Prefect API; the config, the flow's parameters, the state and every file
of the swarm home hold only the block's name; the server (a keyed stub the test started) is never
stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import job_options, prompts
from stack import PrefectStack

from prefect_swarm.config import load_config
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.state import StateStore
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

pytestmark = pytest.mark.prefect_server

KEY = "sk-secret-block-key-c0d9"


def _holding(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_an_external_swarm_takes_its_key_from_a_secret_block(
    prefect_api: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.blocks.system import Secret

    from prefect_swarm.blocks import with_secret_key
    from prefect_swarm.flows import batch_inference

    Secret(value=KEY).save("ext-key", overwrite=True)
    with StubEngine(free_port(), api_key=KEY, model="tiny") as stub:
        cfg = {
            "name": "ext-secret",
            "model": "tiny",
            "backend": {"type": "external", "url": stub.url + "/v1", "api_key_secret": "ext-key"},
        }
        missing = load_config(data={**cfg, "backend": {**cfg["backend"], "api_key_secret": "no-such-key"}})
        with pytest.raises(ConfigError, match=r"backend\.api_key_secret: no Secret block 'no-such-key'"):
            with_secret_key(missing)

        path = tmp_path / "ext.yaml"
        path.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "PREFECT_API_URL": prefect_api.api_url, "COLUMNS": "200"}
        cli = [sys.executable, "-m", "prefect_swarm.cli.main"]
        res = subprocess.run([*cli, "up", "-c", str(path)], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        res = subprocess.run([*cli, "down", "ext-secret", "-y"], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert stub.stats()["requests"] == 1  # the readiness completion, with the block's key

        n = 12
        inp = prompts(tmp_path / "in.parquet", n)
        res = batch_inference(cfg, job_options(), str(inp), str(tmp_path / "out.parquet"))
        assert res["ok"] == n
        assert stub.stats()["requests"] == 1 + 1 + n  # a second readiness, then each row once
        assert stub.proc is not None and stub.proc.poll() is None  # the flow's teardown never stopped it
    assert StateStore().require_swarm("ext-secret").phase == "STOPPED"
    assert _holding(swarm_home, KEY) == []
