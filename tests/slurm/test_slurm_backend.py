"""The Slurm backend on a real single-node Slurm (scripts/slurm/ci-up.sh): serving, compute, failure paths.

Every swarm is named ``psw-t-<random>-...`` and deleted after its test; only our jobs are cancelled.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from _slurmkit import (
    PY,
    LiveSwarm,
    job_command,
    make_job,
    nginx_locations,
    node_gpus,
    our_jobs,
    output_ids,
    refused_without_key,
    stub_config,
    unique_name,
)

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.backends.slurm.compute import SlurmCompute
from prefect_swarm.exceptions import BackendError, CapacityError, ConfigError
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingPhase
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MakeSwarm = Callable[..., LiveSwarm]


@pytest.mark.smoke
def test_up_status_four_shard_job_down(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    swarm = slurm_swarm(stub_config(replicas=2))
    handle = swarm.up()
    st = swarm.serving.status(handle)
    assert st.phase is ServingPhase.RUNNING, st
    assert st.healthy == 2 and st.url
    array = handle.meta["replicas_job"]
    assert [r.external_id for r in st.replicas] == [f"{array}_0", f"{array}_1"]
    assert httpx.get(st.url + "/health", timeout=5).status_code == 401  # closed by default: every route
    auth = {"Authorization": f"Bearer {swarm.serving.client_key()}"}
    assert httpx.get(st.url + "/health", headers=auth, timeout=5).status_code == 200

    spec = make_job(tmp_path, 400, shards=4)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=4, detach=True))
    names = job.meta["step_names"]  # steps are known by name: submit asked Slurm nothing per step
    assert len(set(names)) == 4 and job.id == f"{job.meta['jobid']}:{names[0]}"
    assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.probe(job)
    ids = output_ids(tmp_path)
    assert sorted(ids) == [f"r{i:05d}" for i in range(400)]  # exactly once, every row

    swarm.down()
    assert our_jobs(swarm.cfg) == ""
    assert swarm.serving.status(handle).phase is ServingPhase.STOPPED
    swarm.down()  # idempotent


def test_create_or_update_reuses_the_running_jobs(slurm_swarm: MakeSwarm) -> None:
    swarm = slurm_swarm(stub_config(replicas=1))
    first = swarm.up()
    again = swarm.serving.create_or_update(swarm.cfg)
    assert (again.meta["replicas_job"], again.meta["lb_job"]) == (
        first.meta["replicas_job"],
        first.meta["lb_job"],
    )
    assert len(our_jobs(swarm.cfg).splitlines()) == 2


@pytest.mark.slurm_whole
def test_more_gpus_than_the_node_has_fails_with_the_slurm_reason(slurm_swarm: MakeSwarm) -> None:
    # one replica of 2 fake GPUs more than the node holds: the last waits for Resources forever
    replicas = node_gpus() // 2 + 1
    swarm = slurm_swarm(stub_config(replicas=replicas, gpus_per_replica=2, backend={"queue_timeout_s": 8}))
    swarm.handle = swarm.serving.create_or_update(swarm.cfg)
    t0 = time.monotonic()
    with pytest.raises(CapacityError, match=r"Resources") as err:
        swarm.serving.wait_ready(swarm.handle, 120)
    assert time.monotonic() - t0 < 8 + 30
    assert "queue_timeout_s" in str(err.value)
    assert our_jobs(swarm.cfg) == "", "nothing may stay queued"


def test_a_replica_bigger_than_any_node_is_refused_at_submit(slurm_swarm: MakeSwarm) -> None:
    swarm = slurm_swarm(stub_config(replicas=1, gpus_per_replica=node_gpus() + 1))
    with pytest.raises(ConfigError, match=r"Slurm refused the request(.|\n)*node configuration is not available"):
        swarm.serving.create_or_update(swarm.cfg)
    assert our_jobs(swarm.cfg) == ""


HOSTILE_VALUE = "a,b \"double\" 'single'\nsecond line $(touch {m}) `touch {m}`; touch {m}"


def test_environment_reaches_the_step_intact_and_secrets_stay_hidden(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    secret = "sk-secret-7a1c9e"
    swarm = slurm_swarm(stub_config(replicas=1, api_key=secret))
    handle = swarm.up()
    marker = tmp_path / "PWNED"
    value = HOSTILE_VALUE.format(m=marker)
    out = tmp_path / "env.txt"
    code = (
        "import os, sys; open(sys.argv[1], 'w').write(repr([os.environ['WEIRD'], os.environ['MY_TOKEN'], "
        "os.environ['PREFECT_SWARM_API_KEY'], os.environ['MODEL'], os.environ['ENDPOINT']]))"
    )
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(
        JobRequest(
            name="env",
            command=[PY, "-c", code, str(out)],
            env={"WEIRD": value},
            secret_env={"MY_TOKEN": secret + "-2"},
            detach=False,
        )
    )
    assert compute.probe(job).status is JobStatus.SUCCEEDED
    weird, token, key, model, endpoint = eval(out.read_text())  # our own repr
    assert (weird, token, key, model) == (value, secret + "-2", secret, "stub-model")
    assert endpoint == swarm.serving.status(handle).url
    assert not marker.exists()
    assert secret not in repr(job) and secret not in str(job.to_dict())
    kept = {swarm.paths.api_key_file, swarm.paths.lb_auth_conf}  # the key's own 0600 files, nothing else
    for path in swarm.paths.root.rglob("*"):
        if path in kept:
            assert path.stat().st_mode & 0o777 == 0o600, path
        elif path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    # the API key reached the engine through its environment (never its argv)
    pid = json.loads(swarm.paths.replica_status(0).read_text())["pid"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"VLLM_API_KEY={secret}".encode() in environ
    assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_usr1_reaches_job_steps_and_a_preempted_shard_resumes(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    swarm = slurm_swarm(stub_config(replicas=1, engine={"args": ["--latency-ms", "50"]}))
    handle = swarm.up()
    spec = make_job(tmp_path, 2000, concurrency=4, drain_seconds=1)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=1, shard_id=0))
    shard_dir = tmp_path / "job" / "shards" / "00000"
    wait_until("a part file of the shard", lambda: list(shard_dir.glob("part-*.parquet")), timeout_s=30, poll_s=0.3)
    steps = SlurmClient().steps(job.meta["jobid"])
    step = next(sid for sid, name in steps.items() if name in job.meta["step_names"])
    SlurmClient().scancel([step], signal="USR1")  # what --signal=USR1@N delivers before the time limit
    assert compute.wait(job, poll_s=0.5) is JobStatus.PREEMPTED
    probe = compute.probe(job)
    assert probe.exit_code == 75 and "PREEMPTED (resumable)" in probe.detail, probe  # flushed, resumable
    assert list(shard_dir.glob("part-*.parquet")), "the ledger was flushed"
    assert not (tmp_path / "out.parquet").exists()
    again = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=1, shard_id=0, detach=False))
    assert compute.probe(again).status is JobStatus.SUCCEEDED
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(2000)]


def test_probe_cancel_and_reattach_by_external_id(slurm_swarm: MakeSwarm) -> None:
    swarm = slurm_swarm(stub_config(replicas=1))
    handle = swarm.up()
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="sleep", command=[PY, "-c", "import time; time.sleep(120)"]))
    other = SlurmCompute(swarm.cfg, swarm.paths, handle)  # another process would rebuild it from state
    from prefect_swarm.interfaces import JobHandle

    again = JobHandle.from_dict(job.to_dict())
    # rebuilt from its record, the job is found; a loaded machine may take a moment to start it
    wait_until(
        "the job running", lambda: other.probe(again), until=lambda p: p.status is JobStatus.RUNNING, timeout_s=60
    )
    other.cancel(again)
    assert other.wait(again, poll_s=0.3) is JobStatus.CANCELLED
    other.cancel(again)  # idempotent


@pytest.mark.slurm_whole
def test_submit_waits_for_the_allocation_and_reports_why_it_never_ran(slurm_swarm: MakeSwarm) -> None:
    # an exclusive job of ours holds the node: both swarm jobs stay PENDING until it is cancelled
    blocker = (
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--exclusive",
                "--time=5:00",
                f"--job-name=psw-{unique_name()}-blocker",
                "--output=/dev/null",
                "--wrap",
                "sleep 300",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    try:
        swarm = slurm_swarm(stub_config(replicas=1, backend={"queue_timeout_s": 3}))
        handle = swarm.handle = swarm.serving.create_or_update(swarm.cfg)
        t0 = time.monotonic()
        with pytest.raises(CapacityError, match=r"PENDING \((Resources|Priority)\)") as err:
            SlurmCompute(swarm.cfg, swarm.paths, handle).submit(JobRequest(name="early", command=[PY, "-c", "pass"]))
        assert 3 <= time.monotonic() - t0 < 3 + 15
        assert "queue_timeout_s" in str(err.value)
        assert len(our_jobs(swarm.cfg).splitlines()) == 2, "a job that cannot start leaves the swarm alone"

        backend = swarm.cfg.backend.model_copy(update={"queue_timeout_s": 60})
        compute = SlurmCompute(swarm.cfg.model_copy(update={"backend": backend}), swarm.paths, handle)
        timer = threading.Timer(2.0, SlurmClient().scancel, args=([blocker],))
        timer.start()
        job = compute.submit(JobRequest(name="late", command=[PY, "-c", "import os; print(os.environ['ENDPOINT'])"]))
        assert compute.wait(job, poll_s=0.3) is JobStatus.SUCCEEDED, compute.probe(job)
    finally:
        SlurmClient().scancel([blocker])
    url = swarm.serving.status(handle).url
    assert url and url in Path(job.meta["logs"][0]).read_text()  # the step started once the LB announced itself

    swarm.down()
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="no Slurm job in the queue"):
        compute.submit(JobRequest(name="gone", command=[PY, "-c", "pass"]))
    assert time.monotonic() - t0 < 10


@pytest.mark.vllm
def test_vllm_cpu_swarm_on_slurm(slurm_swarm: MakeSwarm, need_vllm: None, tmp_path: Path) -> None:
    from services import VLLM_ARGS, VLLM_ENV, tiny_model, vllm_python

    cfg = stub_config(
        replicas=1,
        gpus_per_replica=0,
        model=str(tiny_model()),
        served_model_name="tiny",
        engine={
            "kind": "vllm",
            "command": None,
            "python": str(vllm_python()),
            "args": VLLM_ARGS,
            "env": VLLM_ENV,
            "startup_timeout_s": 300,
        },
    )
    swarm = slurm_swarm(cfg)
    handle = swarm.up(timeout_s=400)
    st = swarm.serving.status(handle)
    assert st.phase is ServingPhase.RUNNING and st.healthy == 1
    # closed by default, every route: the engine's own list (its OpenAPI document, read with the key, plus
    # what it mounts outside it: FastAPI's docs and vLLM's /metrics) and nginx's locations, at the LB and
    # at the replica's port; vLLM's --api-key alone would have let all but /v1/* through
    key = swarm.serving.client_key()
    assert key and st.url
    auth = {"Authorization": f"Bearer {key}"}
    lb, replica = st.url.removesuffix("/v1"), st.replicas[0].url
    doc = httpx.get(f"{replica}/openapi.json", headers=auth, timeout=30).json()
    routes = {(m.upper(), re.sub(r"\{[^}]*\}", "x", p)) for p, ops in doc["paths"].items() for m in ops}
    assert {("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/health")} <= routes, sorted(routes)
    routes |= {("GET", p) for p in ("/openapi.json", "/docs", "/redoc", "/metrics", "/no-such-route")}
    routes |= {(m, p) for p in nginx_locations(swarm.paths.nginx_conf) for m in ("GET", "POST")}
    assert refused_without_key([lb, replica], sorted(routes), key) == []
    for base in (lb, replica):  # the key opens them (readiness, the watchdog and `top` send it)
        for route in ("/health", "/metrics", "/v1/models"):
            assert _answers_200(base + route, auth), (base, route)
    spec = make_job(tmp_path, 40, concurrency=4, shards=4)
    compute = SlurmCompute(swarm.cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=4, detach=False))
    assert compute.probe(job).status is JobStatus.SUCCEEDED
    assert sorted(output_ids(tmp_path)) == [f"r{i:05d}" for i in range(40)]
    swarm.down()
    assert our_jobs(swarm.cfg) == ""
    # no engine of this swarm outlived it (other vLLM processes on the machine are not ours)
    job_name = f"SLURM_JOB_NAME={swarm.serving.names.replicas}".encode()

    def ours() -> list[Path]:
        return [
            p for p in Path("/proc").iterdir()
            if p.name.isdigit() and b"vllm.entrypoints" in _read(p / "cmdline") and job_name in _read(p / "environ")
        ]  # fmt: skip

    # the job has left squeue; its steps' processes get SIGTERM, then SIGKILL KillWait (5 s) later
    wait_until("no engine process of the job left", ours, until=lambda left: left == [], timeout_s=30)


def _answers_200(url: str, headers: dict[str, str], within_s: float = 30) -> bool:
    """GET ``url`` answers 200 within ``within_s``: nginx takes an upstream out for a few seconds after
    an error (a loaded CPU engine timing out on one of the probes above), answering 502 meanwhile."""
    try:
        wait_until(
            f"{url} to answer 200",
            lambda: httpx.get(url, headers=headers, timeout=30).status_code,
            until=lambda code: code == 200,
            timeout_s=within_s,
            poll_s=1,
        )
    except WaitTimedOut:
        return False
    return True


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_down_lets_a_replica_stop_at_its_own_pace_past_killwait(slurm_swarm: MakeSwarm) -> None:
    # the test Slurm KILLs a job 5 s (KillWait) after a plain cancel's TERM; this engine takes 8 s to stop
    # (a Ray head's daemons, a draining vLLM): down TERMs the scripts and waits for their teardown
    swarm = slurm_swarm(stub_config(replicas=1, engine={"command": engine_command(stop_delay_s=8)}))
    handle = swarm.up()
    assert "stopped after TERM" not in swarm.paths.replica_log(0).read_text()
    swarm.serving.delete(handle)
    assert our_jobs(swarm.cfg) == ""
    assert "stub engine: stopped after TERM" in swarm.paths.replica_log(0).read_text()
    # and sacct reads CANCELLED, as after a plain scancel (each script cancels itself once stopped)
    for job in (handle.meta["replicas_job"], handle.meta["lb_job"]):
        acct = SlurmClient().sacct([str(job)])
        assert acct and all(e.state.startswith("CANCELLED") for e in acct if "." not in e.id), (job, acct)


def test_delete_also_cancels_jobs_the_handle_does_not_list(slurm_swarm: MakeSwarm, tmp_path: Path) -> None:
    # an `up` whose record was never written (say the LB's sbatch failed after the replicas' went
    # through) left a job under the swarm's name that the handle does not know: delete still finds it
    swarm = slurm_swarm(stub_config(replicas=1))
    handle = swarm.up()
    stray = subprocess.run(
        ["sbatch", "--parsable", "-J", swarm.serving.names.replicas, "-t", "2", "-o", str(tmp_path / "stray.out"),
         "--wrap", "sleep 120"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert stray in our_jobs(swarm.cfg)
    swarm.serving.delete(handle)
    assert our_jobs(swarm.cfg) == "", "a job under the swarm's psw- name outlived delete()"
