"""The Lepton token and the endpoint key reach no log, state row or file prefect-swarm writes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import JobRequest
from prefect_swarm.settings import get_settings
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = pytest.mark.lepton


def _files_containing(root: Path, needle: str) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(path)
    return hits


def test_no_secret_in_logs_state_or_files(
    lepton_cfg: Callable[..., SwarmConfig],
    fake_lepton: FakeLepton,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    swarm_home: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = lepton_cfg()
    api_key = cfg.api_key.get_secret_value()  # type: ignore[union-attr]
    fake_lepton.inject(503, count=2, match="/jobs")  # retry messages are logged too
    with Swarm(cfg) as swarm:
        compute = swarm.compute
        job = compute.submit(
            JobRequest(
                name="echo",
                command=[compute.job_runtime().python, "-c", "print('hello')"],
                nshards=2,
                secret_env={"HF_TOKEN": "hf-secret-4242"},
            )
        )
        compute.wait(job, stream_logs=True, poll_s=0.1)
        swarm.status()
        specs = [str(w.body) for w in fake_lepton.jobs.values()]
        assert len(specs) == 2 and not any("hf-secret-4242" in s or api_key in s for s in specs)
    with pytest.raises(ConfigError) as err:
        Swarm(lepton_cfg(name="other", token="wrong-token-9876")).up()
    out, errout = capfd.readouterr()
    texts = {"logs": caplog.text, "stdout": out, "stderr": errout, "error": str(err.value)}
    for secret in (fake_lepton.token, api_key, "hf-secret-4242", "wrong-token-9876"):
        for where, text in texts.items():
            assert secret not in text, f"secret found in {where}"
        assert _files_containing(swarm_home, secret) == [], "secret found in the swarm home (state.db, folders)"
    assert get_settings().state_db.exists()
    assert "retry" in caplog.text  # the retries were logged (without secrets)
