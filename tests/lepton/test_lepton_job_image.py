"""Jobs run in their image, not on the worker: the interpreter a job names must exist there.

The fake starts a job's command inside a job root standing for its image (PATH = the image's
``bin``, holding ``python3``; no worker venv, no PYTHONPATH). So a job started with the worker's
``sys.executable`` or a bare ``python`` fails as it would on a real workspace, and the backend's
job runtime must name what the image has.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobRequest, JobStatus
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton

Make = Callable[..., SwarmConfig]

_WHERE = (
    "import os, sys; print('PATH=' + os.environ['PATH']); print('EXE=' + sys.executable); print('CWD=' + os.getcwd())"
)


def _compute(cfg: SwarmConfig) -> LeptonCompute:
    return LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)


def test_job_runtime_names_the_images_interpreter(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(job_image="ghcr.io/acme/jobs:1")
    runtime = _compute(cfg).job_runtime()
    assert runtime.python == "python3" and runtime.python != sys.executable
    assert runtime.image == "ghcr.io/acme/jobs:1"
    assert runtime.env["PREFECT_SWARM_HOME"] == cfg.backend.shared_path  # type: ignore[union-attr]
    assert fake_lepton.requests == []  # building the runtime calls nothing


def test_a_job_runs_inside_its_image_root(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    compute = _compute(lepton_cfg())
    job = compute.submit(JobRequest(name="where", command=[compute.job_runtime().python, "-c", _WHERE]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    out = dict(line.split("] ", 1)[1].split("=", 1) for line in compute.logs(job).splitlines() if "=" in line)
    assert str(fake_lepton.workdir) in out["PATH"] and ".venv" not in out["PATH"]
    assert out["CWD"].startswith(str(fake_lepton.workdir))
    assert "PYTHONPATH" not in fake_lepton.job_env(job.id)


def test_the_workers_interpreter_does_not_exist_in_the_image(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    compute = _compute(lepton_cfg())
    for python in (sys.executable, "python"):
        job = compute.submit(JobRequest(name="worker-python", command=[python, "-c", "print('ran')"]))
        assert compute.wait(job, poll_s=0.1) is JobStatus.FAILED
        logs = compute.logs(job)
        assert "ran" not in logs and python in logs


def test_an_image_the_workspace_cannot_pull_fails_the_job(lepton_cfg: Make, shared_dir: object) -> None:
    with FakeLepton(images={"vllm/vllm-openai:latest": sys.executable}) as fake:
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token, job_image="nope/missing:0")
        compute = _compute(cfg)
        job = compute.submit(JobRequest(name="pull", command=[compute.job_runtime().python, "-c", "pass"]))
        assert compute.wait(job, poll_s=0.1) is JobStatus.FAILED
        assert "nope/missing:0" in compute.logs(job)
        good = _compute(lepton_cfg(workspace_url=fake.url, token=fake.token))
        job = good.submit(JobRequest(name="pull", command=[good.job_runtime().python, "-c", "pass"], detach=False))
        assert good.probe(job).status is JobStatus.SUCCEEDED


def test_a_job_image_without_prefect_swarm_is_refused_before_the_endpoint(lepton_cfg: Make, shared_dir: object) -> None:
    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.exceptions import ConfigError

    # the image's python3 is a plain interpreter: no prefect-swarm, as in vllm/vllm-openai
    with FakeLepton(images={"vllm/vllm-openai:latest": "/usr/bin/python3"}) as fake:
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token)
        srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
        with pytest.raises(ConfigError, match=r"backend.job_image: 'python3' in image vllm/vllm-openai:latest cannot"):
            srv.create_or_update(cfg)
        assert fake.deployments == {} and fake.jobs == {}


def test_job_setup_runs_before_each_job_process(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg(job_setup=["export FROM_SETUP=installed"])
    compute = _compute(cfg)
    code = "import os; print('setup=' + os.environ['FROM_SETUP'])"
    job = compute.submit(JobRequest(name="setup", command=[compute.job_runtime().python, "-c", code]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    assert "setup=installed" in compute.logs(job)


def test_a_job_inherits_nothing_from_the_worker(
    lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("LANG", "xx_YY.UTF-8")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("WORKER_ONLY", "1")
    compute = _compute(lepton_cfg())
    code = (
        "import os, tempfile; e = os.environ; print('CWD_EMPTY=' + str(os.listdir('.') == [])); "
        "print('KEYS=' + ','.join(sorted(k for k in e if not k.startswith('PREFECT_SWARM_')))); "
        "print('TMP=' + tempfile.gettempdir()); print('HOME=' + e['HOME'])"
    )
    job = compute.submit(JobRequest(name="env", command=[compute.job_runtime().python, "-c", code]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    out = dict(line.split("] ", 1)[1].split("=", 1) for line in compute.logs(job).splitlines() if "=" in line)
    keys = set(out["KEYS"].split(","))
    assert {"PATH", "HOME", "TMPDIR"} <= keys and not keys & {"LANG", "WORKER_ONLY", "PYTHONPATH", "VIRTUAL_ENV"}
    assert out["CWD_EMPTY"] == "True"
    for key in ("TMP", "HOME"):  # what the image sets, inside the job root
        assert out[key].startswith(str(fake_lepton.workdir)) and str(tmp_path) not in out[key]
