"""Jobs run in their image, not on the worker: the interpreter a job names must exist there.

The fake starts a job's command inside a job root standing for its image (PATH = the image's
``bin``, holding ``python3``; no worker venv, no PYTHONPATH). So a job started with the worker's
``sys.executable`` or a bare ``python`` fails as it would on a real workspace, and the backend's
job runtime must name what the image has.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobRequest, JobStatus
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.fake_lepton import WITHOUT_PREFECT_SWARM, FakeLepton

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

    # the image's python3 lacks prefect-swarm, as vllm/vllm-openai does; nothing staged (job_wheel off)
    with FakeLepton(images={"vllm/vllm-openai:latest": WITHOUT_PREFECT_SWARM}) as fake:
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token, job_wheel=False)
        srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
        with pytest.raises(
            ConfigError, match=r"backend.job_image: 'python3' in image vllm/vllm-openai:latest cannot"
        ) as err:
            srv.create_or_update(cfg)
        fake.wait_deletes()  # deletes finish in the background, as on the platform
        assert fake.deployments == {} and fake.jobs == {}
        # the hint names what the README documents (a clone's install, or the staged wheel), no release
        assert "backend.job_wheel: true" in str(err.value) and "pip install '.[lepton]'" in str(err.value)
        assert "prefect-swarm==" not in str(err.value)


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


_WHICH = "import prefect_swarm; print('FROM=' + prefect_swarm.__file__)"


def test_the_staged_wheel_lets_an_image_without_prefect_swarm_run_jobs(lepton_cfg: Make, shared_dir: Path) -> None:
    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.backends.lepton.wheel import WHEELS_DIR

    with FakeLepton(images={"vllm/vllm-openai:latest": WITHOUT_PREFECT_SWARM}) as fake:
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token)
        compute = _compute(cfg)
        # no wheel staged: the image cannot run the job process
        bare = _compute(lepton_cfg(workspace_url=fake.url, token=fake.token, job_wheel=False))
        job = bare.submit(JobRequest(name="which", command=["python3", "-c", _WHICH]))
        assert bare.wait(job, poll_s=0.1) is JobStatus.FAILED and "No module named 'prefect_swarm'" in bare.logs(job)
        # `up` stages the wheel (once per version), its storage check installs it, the endpoint starts
        srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
        handle = srv.create_or_update(cfg)
        (wheel,) = (Path(cfg.backend.shared_path) / WHEELS_DIR).glob("*/*.whl")  # type: ignore[union-attr]
        staged_at = wheel.stat().st_mtime_ns
        for _ in range(2):  # each job's container starts from the image: each installs it again
            job = compute.submit(JobRequest(name="which", command=["python3", "-c", _WHICH]))
            assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED, compute.logs(job)
            where = compute.logs(job).split("FROM=", 1)[1].split()[0]
            assert f"/containers/{job.id}/venv/" in where  # the wheel's copy, in this job's container
        srv.create_or_update(cfg)
        assert wheel.stat().st_mtime_ns == staged_at  # not written again
        srv.delete(handle)


def test_an_image_whose_pip_cannot_install_the_wheel_is_refused(
    lepton_cfg: Make, shared_dir: Path, tmp_path: Path
) -> None:
    import subprocess

    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.exceptions import ConfigError

    venv = tmp_path / "no-pip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with FakeLepton(images={"vllm/vllm-openai:latest": str(venv / "bin" / "python")}) as fake:
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token)
        with pytest.raises(
            ConfigError,
            match=r"(?s)backend.job_wheel: 'python3' in image .* could not install.*"
            r"No module named pip",
        ):
            LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name)).create_or_update(cfg)
        assert fake.deployments == {}


def test_a_slow_image_pull_is_given_time_and_named_when_too_slow(lepton_cfg: Make, shared_dir: Path) -> None:
    from prefect_swarm.backends.lepton.serving import LeptonServing
    from prefect_swarm.exceptions import BackendError

    with FakeLepton(pull_s=3) as fake:
        # the check's own 1 s counts from its container's start: a 3 s pull is not held against it
        cfg = lepton_cfg(workspace_url=fake.url, token=fake.token, storage_check_timeout_s=1)
        srv = LeptonServing(cfg, SwarmPaths.for_swarm(cfg.name))
        srv.delete(srv.create_or_update(cfg))
    with FakeLepton(pull_s=60) as fake:
        slow = lepton_cfg(workspace_url=fake.url, token=fake.token, storage_check_timeout_s=1)
        slow = slow.model_copy(update={"ready_timeout_s": 2})
        with pytest.raises(
            BackendError,
            match=r"was still starting after \d+s.*image vllm/vllm-openai:latest is most "
            r"likely still being pulled",
        ) as err:
            LeptonServing(slow, SwarmPaths.for_swarm(slow.name)).create_or_update(slow)
        assert "ready_timeout_s" in (err.value.hint or "") and fake.deployments == {}
