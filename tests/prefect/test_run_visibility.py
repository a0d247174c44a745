"""What a run shows in Prefect: a user error as one message (no traceback), a bug with its
traceback; a log line per phase in order; the job's progress artifact updated every few seconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import job_options, job_progress_artifact, prompts, run_logs, stub_swarm
from stack import PrefectStack

from prefect_swarm.exceptions import ConfigError, DatasetError
from prefect_swarm.flows import batch_inference

pytestmark = [pytest.mark.prefect_server]


def test_user_errors_end_the_run_with_their_message_alone(
    prefect_api: PrefectStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inp = prompts(tmp_path / "in.parquet", 5)
    out = str(tmp_path / "out.parquet")
    cases = {
        "missing input file": (stub_swarm("user-err"), job_options(), str(tmp_path / "nope.parquet")),
        "bad column": (stub_swarm("user-err"), job_options(job_kwargs={"prompt_column": "text"}), str(inp)),
        "bad config": ({**stub_swarm("user-err"), "replicas": 0}, job_options(), str(inp)),
    }
    expected = {
        "missing input file": [f"input {tmp_path}/nope.parquet does not exist", "Give the job's input"],
        "bad column": ["column 'text' is missing (columns: id, prompt)", "Rename the column"],
        "bad config": ["replicas: Input should be greater than or equal to 1", "prefect-swarm validate"],
    }
    for label, (cfg, opts, path) in cases.items():
        state = batch_inference(cfg, opts, path, out, shards=1, return_state=True)
        message = str(state.message)
        assert state.is_failed(), (label, state)
        assert all(part in message for part in expected[label]), (label, message)
        assert not message.startswith("Flow run encountered"), (label, message)  # the error's own message
        with pytest.raises(ConfigError):  # DatasetError is one: Python callers still get the exception
            state.result()
        logs = run_logs(state.state_details.flow_run_id)
        assert not any("Traceback" in line for line in logs), (label, logs)
        assert any(expected[label][0] in line for line in logs), (label, logs)
        print(f"{label}: Failed, {message.splitlines()[0]!r}, {len(logs)} log lines, no traceback")

    # a bug (not an error raised on purpose: here in a job class, met as the run plans the job) keeps its
    # traceback in the run's logs
    (tmp_path / "buggy_jobs.py").write_text(
        "from prefect_swarm.jobs.builtin import ChatCompletionJob\n"
        "class Broken(ChatCompletionJob):\n"
        "    def __init__(self, **kw):\n"
        "        raise RuntimeError('an unexpected bug')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = job_options(job="buggy_jobs:Broken")
    state = batch_inference(stub_swarm("user-err"), broken, str(inp), out, shards=1, return_state=True)
    assert state.is_failed() and "RuntimeError" in str(state.message), state
    logs = run_logs(state.state_details.flow_run_id)
    assert any("Traceback" in line and "an unexpected bug" in line for line in logs), logs
    with pytest.raises(RuntimeError):
        state.result()
    assert not isinstance(RuntimeError(), DatasetError)


def test_a_run_logs_each_phase_and_updates_its_progress_every_few_seconds(
    prefect_api: PrefectStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_EVERY_S", "0.5")
    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_LOG_EVERY_S", "0.01")  # each update of the artifact logs its line
    n = 120  # 2 shards x 60 rows, 2 in flight each, 100 ms a request: about 3 s of requests
    cfg = stub_swarm("phases", latency_ms=100)
    inp = prompts(tmp_path / "in.parquet", n)
    state = batch_inference(
        cfg, job_options(concurrency=2), str(inp), str(tmp_path / "out.parquet"), shards=2, return_state=True
    )
    assert state.is_completed(), state
    logs = run_logs(state.state_details.flow_run_id)
    phases = [
        "Bring-up: swarm 'phases'",
        "Readiness: waiting for swarm 'phases': ",
        "Swarm 'phases' ready",
        "Shards: 2 of 2 started on swarm 'phases'",
        "Shard 0 done: 60 ok, 0 failed of 60 rows",
        "Shard 1 done: 60 ok, 0 failed of 60 rows",
        "Release: letting go of swarm(s) phases",
        "Commit: merging the shards' ledgers",
        f"Output {tmp_path}/out.parquet: {n} rows",
    ]
    assert not [x for x in logs if x.startswith("Cancelled job")], logs  # a run that succeeded cancels nothing
    at = {p: next((i for i, line in enumerate(logs) if line.startswith(p)), None) for p in phases}
    assert all(i is not None for i in at.values()), {p: i for p, i in at.items() if i is None}
    order = sorted(phases, key=lambda p: at[p])  # type: ignore[arg-type,return-value]
    shard_lines = {"Shard 0 done: 60 ok, 0 failed of 60 rows", "Shard 1 done: 60 ok, 0 failed of 60 rows"}
    assert [p for p in order if p not in shard_lines] == [p for p in phases if p not in shard_lines], order
    assert order.index("Shards: 2 of 2 started on swarm 'phases'") < min(order.index(p) for p in shard_lines)
    assert max(order.index(p) for p in shard_lines) < order.index("Release: letting go of swarm(s) phases")
    # the job's own progress artifact (the shards' say "shard N") was updated while rows were answered:
    # each update logged its progress line; the artifact ends at 100%
    said = [re.match(r"Job \S+: ([\d,]+)/([\d,]+) rows", line) for line in logs]
    done = [int(m[1].replace(",", "")) for m in said if m]
    during = {d for d in done if 0 < d < n}
    assert len(done) >= 4 and len(during) >= 2, done
    job = job_progress_artifact(state.state_details.flow_run_id)
    assert job.data == 100.0 and f"{n} ok, 0 failed of {n} rows" in str(job.description), job
    print(f"{len(done)} job progress updates ({sorted(during)} while running); phases in order: {len(phases)} lines")
