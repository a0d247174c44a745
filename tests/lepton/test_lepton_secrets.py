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
        fake_lepton.wait_deletes()  # the storage check's job, deleted by `up`, goes in the background
        specs = [str(w.body) for w in fake_lepton.jobs.values()]
        assert len(specs) == 2 and not any("hf-secret-4242" in s or api_key in s for s in specs)
    with pytest.raises(ConfigError) as err:
        Swarm(lepton_cfg(name="other", token="wrong-token-9876")).up()
    out, errout = capfd.readouterr()
    texts = {"logs": caplog.text, "stdout": out, "stderr": errout, "error": str(err.value)}
    for secret in (fake_lepton.token, api_key, "hf-secret-4242", "wrong-token-9876"):
        for where, text in texts.items():
            assert secret not in text, f"secret found in {where}"
        found = _files_containing(swarm_home, secret)
        if secret == api_key:  # the one place the endpoint's key is kept: each swarm's swarm.key, mode 0600
            assert all(p.name == "swarm.key" and p.stat().st_mode & 0o777 == 0o600 for p in found), found
            found = [p for p in found if p.name != "swarm.key"]
        assert found == [], "secret found in the swarm home (state.db, folders)"
    assert get_settings().state_db.exists()
    assert "retry" in caplog.text  # the retries were logged (without secrets)


@pytest.mark.parametrize("fake_lepton", [{"latency_s": 0.02}], indirect=True)
def test_eight_concurrent_shard_submits_share_the_swarm_secret(
    lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from prefect_swarm.interfaces import JobStatus
    from prefect_swarm.interfaces.jobenv import API_KEY

    cfg = lepton_cfg()
    key = cfg.api_key.get_secret_value()  # type: ignore[union-attr]
    with Swarm(cfg) as swarm:
        compute = swarm.compute
        command = [compute.job_runtime().python, "-c", "print('shard')"]

        def submit(i: int) -> object:
            return compute.submit(JobRequest(name=f"job-s{i}", command=command, nshards=8, shard_id=i))

        with ThreadPoolExecutor(8) as pool:  # as the flow maps its shards
            handles = list(pool.map(submit, range(8)))
        assert [compute.wait(h, poll_s=0.1) for h in handles] == [JobStatus.SUCCEEDED] * 8  # type: ignore[arg-type]
        envs = [fake_lepton.job_env(jid) for jid in fake_lepton.jobs]
        assert len(envs) == 8 and all(env[API_KEY] == key for env in envs)
        deletes = [p for m, p, _s in fake_lepton.requests if m == "DELETE" and "/usersecrets/" in p]
        assert deletes == []  # never deleted while a shard's pod could be resolving it


def test_down_deletes_only_its_own_secrets(lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton) -> None:
    from prefect_swarm.backends.lepton.client import job_secret_name, swarm_owner, swarm_secret_name
    from prefect_swarm.paths import SwarmPaths

    # names are unambiguous: no swarm's secrets are a prefix of another's, no two (swarm, key) share one,
    # and a swarm of the same name from another home (another owner) has names of its own
    assert not swarm_secret_name("lep-2", "o", "K").startswith(swarm_secret_name("lep", "o", "K")[:-1])
    assert swarm_secret_name("a", "o", "B_C") != swarm_secret_name("a-b", "o", "C")
    assert swarm_secret_name("a", "o1", "K") != swarm_secret_name("a", "o2", "K")
    assert job_secret_name("a", "o", "j", "B_C") != job_secret_name("a-b", "o", "j", "C")
    assert job_secret_name("s", "o", "j", "hf_token") != job_secret_name("s", "o", "j", "HF_TOKEN")
    first, second = Swarm(lepton_cfg(name="lep")), Swarm(lepton_cfg(name="lep-2"))
    first.up()
    second.up()
    theirs = set(fake_lepton.secrets)
    assert len(theirs) == 2
    first.down()
    owner = swarm_owner(SwarmPaths.for_swarm("lep-2"))
    assert set(fake_lepton.secrets) == {swarm_secret_name("lep-2", owner, "PREFECT_SWARM_API_KEY")}
    second.down()
    assert fake_lepton.secrets == {}


def test_a_job_whose_secret_is_missing_fails(lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton) -> None:
    from prefect_swarm.backends.lepton.compute import LeptonCompute
    from prefect_swarm.interfaces import JobStatus
    from prefect_swarm.paths import SwarmPaths

    cfg = lepton_cfg(endpoint_token_secret="no-such-secret")
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    job = compute.submit(JobRequest(name="echo", command=[compute.job_runtime().python, "-c", "print(1)"]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.FAILED
    assert "secret 'no-such-secret' not found" in compute.logs(job)


def test_an_expired_token_fails_down_loudly_and_the_swarm_stays_live(
    lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton
) -> None:
    from prefect_swarm.interfaces import ServingPhase
    from prefect_swarm.state import StateStore

    cfg = lepton_cfg()
    swarm = Swarm(cfg)
    swarm.up()
    swarm.wait_ready()
    old_token = fake_lepton.token
    new_token = fake_lepton.expire_token()
    with pytest.raises(
        ConfigError, match=r"(?s)rejected the token for workspace 'ws-test'.*backend.token.*tokens expire"
    ) as err:
        Swarm(cfg).down()
    assert old_token not in str(err.value)
    assert StateStore().require_swarm("lep").phase is ServingPhase.RUNNING  # still live, as it is
    assert list(fake_lepton.deployments) == ["lep"]
    Swarm(lepton_cfg(token=new_token)).down()  # a current token tears it down
    assert StateStore().require_swarm("lep").phase is ServingPhase.STOPPED and fake_lepton.deployments == {}
