"""`batch-inference` on a Lepton backend, by SwarmSpec block name, through the real server and worker.

The real leptonai SDK talks to the loopback fake Lepton API: endpoint up, ready, a 2-shard job
(two Lepton jobs), commit, down; exactly-once output and nothing left running. The workspace
token lives only in the saved LeptonBackend block: neither the worker nor the flow runs have
``LEPTON_WORKSPACE_TOKEN``, so teardown (the flow's ``finally``, the cancel hook) must reload it
from the block named in the swarm's record; and it must reach no log, state row, parameter,
artifact or file.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil
import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts
from stack import PrefectStack, job_variables

from prefect_swarm.state import StateStore
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

# The SDK reads LEPTON_CACHE_DIR once, at import; set before the session's worker starts, so the
# flow runs it spawns keep off ~/.cache/lepton too.
os.environ.setdefault("LEPTON_CACHE_DIR", tempfile.mkdtemp(prefix="lepton-cache-"))

pytestmark = [pytest.mark.prefect_server, pytest.mark.lepton, pytest.mark.slow]

API_KEY = "endpoint-key-5e7a1b9c3d"
LEPTON_ENV = ("LEPTON_WORKSPACE_ID", "LEPTON_WORKSPACE_TOKEN", "LEPTON_WORKSPACE_URL", "LEPTON_WORKSPACE_ORIGIN_URL")


@pytest.fixture
def shared(need_lepton_sdk: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The 'shared filesystem' (the fake's mount); PREFECT_SWARM_HOME lies on it, as Lepton needs."""
    root = tmp_path / "shared"
    (root / "home").mkdir(parents=True)
    monkeypatch.setenv("PREFECT_SWARM_HOME", str(root / "home"))
    for key in LEPTON_ENV:
        monkeypatch.delenv(key, raising=False)
    return root


def _fake(latency_ms: float = 0, **knobs: Any) -> Any:
    from prefect_swarm.testing.fake_lepton import FakeLepton

    return FakeLepton(endpoint_command=engine_command(host="127.0.0.1", latency_ms=latency_ms), **knobs)


def _image_python(folder: Path) -> str:
    """The job image's interpreter: another Python than the worker's (the system's, when it is of
    the same minor version), given prefect-swarm and its dependencies as an image would have them."""
    import subprocess
    import sysconfig

    other = shutil.which("python3", path="/usr/bin:/bin")
    same_minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    if other and os.path.realpath(other) != os.path.realpath(sys.executable):
        probe = subprocess.run([other, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True)
        other = other if probe.stdout.decode().strip() == same_minor else None
    else:
        other = None
    import prefect_swarm

    paths = sysconfig.get_paths()
    libs = dict.fromkeys([str(Path(prefect_swarm.__file__).parents[1]), paths["purelib"], paths["platlib"]])
    script = folder / "image-python3"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={":".join(libs)} exec {other or sys.executable} "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture(params=[False, True], ids=["legacy-api", "new-endpoint-api"])
def fake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A fake workspace whose endpoint answers at once, on the legacy and on the new Endpoint API;
    its job image runs another interpreter than the worker's."""
    python = _image_python(tmp_path_factory.mktemp("image"))
    with _fake(new_deployment_api=request.param, images={"vllm/vllm-openai:latest": python}) as f:
        yield f


def _save_blocks(fake: Any, shared: Path, name: str) -> str:
    """A LeptonBackend block (the token) and a SwarmSpec referencing it; return the flow parameter."""
    from pydantic import SecretStr

    from prefect_swarm.blocks import LeptonBackend, SwarmSpec
    from prefect_swarm.config.backends import LeptonMount

    LeptonBackend(
        workspace_id=fake.workspace_id,
        workspace_url=fake.url,
        token=SecretStr(fake.token),
        mounts=[LeptonMount(path="/prefect-swarm", mount_path=str(shared))],
        shared_path=str(shared / "runs"),
        ready_poll_s=0.2,
        job_resource_shape="cpu.small",
    ).save(f"{name}-backend", overwrite=True)
    backend = cast(LeptonBackend, LeptonBackend.load(f"{name}-backend", _sync=True))  # type: ignore[call-arg]
    SwarmSpec(
        name=name,
        model="stub-model",
        gpus_per_replica=0,
        api_key=SecretStr(API_KEY),
        ready_timeout_s=120,
        backend=backend,
    ).save(name, overwrite=True)
    return f"swarm-spec/{name}"


def _parameters(ref: str, shared: Path, rows: int, **job: Any) -> dict[str, Any]:
    return {
        "swarm": ref,
        "job": job_options(**job),
        "input": str(prompts(shared / "in.parquet", rows)),
        "output": str(shared / "out.parquet"),
        "shards": 2,
    }


def _jobs_created(fake: Any) -> int:
    created = [path for method, path, status in fake.requests if method == "POST" and status == 200]
    return sum(1 for path in created if path.endswith("/jobs"))


def _worker_env(stack: PrefectStack) -> dict[str, str]:
    return dict(psutil.Process(stack.procs["worker"].pid).environ())


def _prefect_records(run_id: Any) -> dict[str, str]:
    """The run as the API shows it: run (parameters, job variables), task runs, artifacts, logs."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    async def read() -> dict[str, str]:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            only = FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
            tasks = await client.read_task_runs(flow_run_filter=only)
            arts = await client.read_artifacts(flow_run_filter=only)
            by_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
            logs, offset = [], 0
            while True:
                page = await client.read_logs(log_filter=by_run, offset=offset)
                logs += page
                offset += len(page)
                if not page:
                    break
        return {
            "flow run (parameters, job variables)": run.model_dump_json(),
            "task runs": json.dumps([t.model_dump(mode="json") for t in tasks]),
            "artifacts": json.dumps([a.model_dump(mode="json") for a in arts]),
            "flow run logs": "\n".join(entry.message for entry in logs),
            "log count": str(len(logs)),
        }

    return asyncio.run(read())


def _files_containing(root: Path, needle: str) -> list[Path]:
    """Files holding ``needle``, but a swarm's own key file (``swarm.key``, mode 0600: what jobs read)."""
    found = [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]
    return [p for p in found if not (p.name == "swarm.key" and p.stat().st_mode & 0o777 == 0o600)]


def test_batch_inference_on_lepton_block_through_the_worker(
    prefect_stack: PrefectStack, shared: Path, fake: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    from prefect.deployments import run_deployment

    assert "LEPTON_WORKSPACE_TOKEN" not in _worker_env(prefect_stack)  # the block is the only source
    ref = _save_blocks(fake, shared, "lep-flow")
    params = _parameters(ref, shared, 60, concurrency=4)
    run: FlowRun = run_deployment(  # type: ignore[assignment]  # sync dispatch
        "batch-inference/on-demand",
        parameters=params,
        job_variables=job_variables(shared / "home"),
        flow_run_name="lepton-e2e",
        timeout=300,
        poll_interval=1,
    )
    assert run.state is not None and run.state.is_completed(), (run.state, _worker_log(prefect_stack))
    # up (after the shared-storage check job), ready, two Lepton jobs (one per shard), commit:
    # one row per input id, in input order
    assert _jobs_created(fake) == 1 + 2
    table = pq.read_table(shared / "out.parquet")
    assert table.column("id").to_pylist() == [f"r{i:05d}" for i in range(60)]
    assert set(table.column("status").to_pylist()) == {"ok"}
    # down: nothing left in the workspace
    fake.wait_deletes()  # deletes finish in the background, as on the platform
    assert fake.running_processes() == [] and fake.deployments == {} and fake.jobs == {}
    rec = StateStore().require_swarm("lep-flow")
    assert rec.phase == "STOPPED" and rec.source == ref and rec.flow_run_id == str(run.id)
    # no secret anywhere we wrote or Prefect stored
    # the flow process sends its last logs after the run is Completed
    wait_until(
        "the flow run's teardown log",
        lambda: "Swarm 'lep-flow' stopped." in _prefect_records(run.id)["flow run logs"],
        timeout_s=30,
        poll_s=1,
    )
    records = _prefect_records(run.id)
    out, err = capfd.readouterr()
    texts = {
        **records,
        "worker log": _worker_log(prefect_stack),
        "server log": (prefect_stack.home / "server.log").read_text(errors="replace"),
        "captured output": out + err,
    }
    for secret in (fake.token, API_KEY):
        for where, text in texts.items():
            assert secret not in text, f"secret found in {where}"
        assert _files_containing(shared, secret) == [], "secret in state.db or the swarm/job folders"


def test_cancel_deletes_the_deployment_without_a_token_in_the_env(
    prefect_stack: PrefectStack, shared: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    assert "LEPTON_WORKSPACE_TOKEN" not in _worker_env(prefect_stack)
    with _fake(latency_ms=250) as fake:
        ref = _save_blocks(fake, shared, "lep-cancel")
        run: FlowRun = run_deployment(  # type: ignore[assignment]  # sync dispatch
            "batch-inference/on-demand",
            parameters=_parameters(ref, shared, 400, concurrency=2),
            job_variables=job_variables(shared / "home"),
            flow_run_name="lepton-cancel",
            timeout=0,
        )
        store = StateStore()

        def shards_running() -> bool:
            rec = store.get_swarm("lep-cancel")
            jobs = store.list_jobs("lep-cancel")
            return rec is not None and rec.phase == "RUNNING" and any(j.status == "RUNNING" for j in jobs)

        wait_until("swarm RUNNING with shard jobs", shards_running, timeout_s=180, poll_s=0.5)
        wait_until("endpoint + 2 job processes", lambda: len(fake.running_processes()) == 3, timeout_s=60)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)  # the UI's Cancel button
        wait_until("the Lepton deployment to be deleted", lambda: not fake.deployments, timeout_s=60, poll_s=0.5)
        wait_until("no process left in the fake", lambda: not fake.running_processes(), timeout_s=30)
        fake.wait_deletes()
        assert fake.jobs == {}
        # Swarm.down records STOPPED once Lepton confirms the deployment gone and its secrets deleted
        wait_until("record STOPPED", lambda: store.require_swarm("lep-cancel").phase == "STOPPED", timeout_s=30)
        assert store.require_swarm("lep-cancel").source == ref

        def final() -> bool:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run.id).state
            return state is not None and state.is_final()

        wait_until("run final", final, timeout_s=150)  # the worker kills the process at its next cancellation poll
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run.id).state.type.value == "CANCELLED"  # type: ignore[union-attr]
        log = _worker_log(prefect_stack)
        out, err = capfd.readouterr()
        for secret in (fake.token, API_KEY):
            assert secret not in log and secret not in out + err
            assert _files_containing(shared, secret) == []


def _worker_log(stack: PrefectStack) -> str:
    return (stack.home / "worker.log").read_text(errors="replace")
