"""The job process against the stub engine: output shape, resume, faults, refusals, signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, requests, run_job, run_openai_batch, write_spec

from prefect_swarm.jobs.rows.commit import commit_output
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, read_json
from prefect_swarm.testing.waiting import wait_until


def _out(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_shards_give_one_row_per_id_in_input_order(tmp_path: Path, stub) -> None:
    make_dataset(tmp_path / "in.parquet", 3000, row_group=700)
    spec = write_spec(tmp_path, endpoints=[stub.url], shards=3)
    before = requests(stub)
    procs = [subprocess.Popen(job_argv(spec, i, 3)) for i in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert requests(stub) - before == 3000
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(3000)]
    assert all(r["status"] == "ok" and r["text"].startswith("stub-") and r["completion_tokens"] > 0 for r in rows)
    assert rows[5]["prompt"] == "question number 5 about topic 5"
    manifest = read_json(JobPaths(tmp_path / "job").manifest)
    assert manifest["rows"] == manifest["ok"] == 3000 and manifest["prompt_tokens"] > 0
    # a rerun of a finished job sends nothing
    before = requests(stub)
    assert [run_job(spec, i, 3).returncode for i in range(3)] == [0, 0, 0]
    assert requests(stub) == before


def test_env_supplies_endpoint_and_model(tmp_path: Path, stub) -> None:
    make_dataset(tmp_path / "in.parquet", 50)
    spec = write_spec(tmp_path, model=None)
    env = {"PREFECT_SWARM_ENDPOINTS": stub.url + "/v1", "MODEL": "stub-model"}
    res = run_job(spec, env=env)
    assert res.returncode == 0, res.stderr
    assert len(_out(tmp_path / "job-out.parquet")) == 50


def test_faults_every_row_ok_or_error_with_reason(tmp_path: Path, stub_factory) -> None:
    flaky = stub_factory(error_rate=0.1, rate_429=0.1, timeout_rate=0.05, seed=7)
    make_dataset(tmp_path / "in.parquet", 1500)
    spec = write_spec(
        tmp_path,
        endpoints=[flaky.url],
        max_retries=2,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=0.5,
        concurrency=64,
    )
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert len(rows) == 1500 and len({r["id"] for r in rows}) == 1500
    errors = [r for r in rows if r["status"] == "error"]
    assert all(r["status"] == "ok" and r["text"] for r in rows if r["status"] != "error")
    assert all(r["error"] and ("HTTP" in r["error"] or "timeout" in r["error"]) for r in errors)
    assert 0 < len(errors) < 150  # 25% faults, 3 attempts: ~1.6% expected
    stats = flaky.stats()
    assert stats["429"] and stats["5xx"] and stats["timeouts"]
    failed = (tmp_path / "job" / "failed.jsonl").read_text().splitlines()
    assert len(failed) == len(errors) and json.loads(failed[0])["error"]


def test_retry_failed_reruns_only_error_rows(tmp_path: Path, stub_factory, stub) -> None:
    flaky = stub_factory(error_rate=0.3, seed=3)
    make_dataset(tmp_path / "in.parquet", 400)
    spec = write_spec(tmp_path, endpoints=[flaky.url], max_retries=0)
    assert run_job(spec).returncode == 0
    first = _out(tmp_path / "job-out.parquet")
    n_err = sum(r["status"] == "error" for r in first)
    assert n_err > 50
    data = json.loads(spec.read_text())
    spec.write_text(json.dumps({**data, "retry_failed": True, "endpoints": [stub.url]}))
    before = requests(stub)
    assert run_job(spec).returncode == 0
    assert requests(stub) - before == n_err
    commit_output(JobSpec.model_validate(json.loads(spec.read_text())))
    again = _out(tmp_path / "job-out.parquet")
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert all(r["status"] == "ok" for r in again)
    assert [r["text"] for r in again if r["id"] in {f["id"] for f in first if f["status"] == "ok"}] == [
        r["text"] for r in first if r["status"] == "ok"
    ]


@pytest.mark.parametrize("change", [{"model": "other-model"}, {"job_kwargs": {"sampling": {"max_tokens": 9}}}])
def test_resume_with_other_settings_is_refused(tmp_path: Path, stub, change: dict) -> None:
    make_dataset(tmp_path / "in.parquet", 2000)
    spec = write_spec(tmp_path, endpoints=[stub.url], concurrency=4)
    proc = subprocess.Popen(job_argv(spec), stderr=subprocess.PIPE, text=True)
    _wait_for_parts(tmp_path / "job", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 75
    data = json.loads(spec.read_text())
    spec.write_text(json.dumps({**data, **change}))
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 2
    key = next(iter(change))
    assert "refusing to resume shard 0" in res.stderr and f"{key}:" in res.stderr and "--overwrite" in res.stderr
    assert requests(stub) == before
    res = run_job(spec, 0, 1, "--overwrite")
    assert res.returncode == 0, res.stderr


def _wait_for_parts(job_dir: Path, proc: subprocess.Popen, n: int = 1) -> None:
    def parts() -> int:
        assert proc.poll() is None, "the job ended before writing a part"
        return len(list((job_dir / "shards" / "00000").glob("part-*.parquet")))

    wait_until(f"{n} part file(s) of shard 0", parts, until=lambda found: found >= n, timeout_s=60, poll_s=0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_flushes_and_exits_75_then_resume_finishes(tmp_path: Path, stub, sig: signal.Signals) -> None:
    make_dataset(tmp_path / "in.parquet", 3000)
    spec = write_spec(tmp_path, endpoints=[stub.url], concurrency=8, checkpoint_every=100_000, checkpoint_seconds=0.3)
    before = requests(stub)
    proc = subprocess.Popen(job_argv(spec), stderr=subprocess.PIPE, text=True)
    _wait_for_parts(tmp_path / "job", proc)
    time.sleep(0.1)  # the point: the signal lands with rows in flight past the first part, at no chosen moment
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert sig.name in err
    shard = JobPaths(tmp_path / "job").shard(0)
    progress = read_json(shard.progress)
    sent = requests(stub) - before
    assert progress["state"] == "requeue" and 0 < progress["done"] < 3000
    assert progress["done"] == sum(pq.read_metadata(p).num_rows for p in shard.parts())
    assert sent - progress["done"] <= 8  # only requests cut off in flight are redone
    assert not shard.done_marker.exists()
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert requests(stub) - before - sent <= 3000 - progress["done"] + 8
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(3000)]


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path, stub, stub_factory) -> None:
    import random

    n, conc, every = 12_000, 16, 300
    make_dataset(tmp_path / "in.parquet", n)
    ref_spec = write_spec(tmp_path, "ref", endpoints=[stub.url], concurrency=conc, checkpoint_every=every)
    assert run_job(ref_spec).returncode == 0
    # The killed runs go to a stub with 10 ms latency (at most 1,600 rows/s at c=16), so the job
    # outlasts the kills however fast the client is; answers do not depend on the latency.
    stub = stub_factory(latency_ms=10)
    spec = write_spec(
        tmp_path,
        "killed",
        endpoints=[stub.url],
        concurrency=conc,
        checkpoint_every=every,
        checkpoint_seconds=0.5,
    )
    from prefect_swarm.jobs.checkpoint.ledger import MAX_PENDING_WRITES

    shard = JobPaths(tmp_path / "killed").shard(0)

    def in_ledger() -> int:
        return len({r for p in shard.parts() for r in pq.read_table(p, columns=["_row"]).column("_row").to_pylist()})

    # What one kill may cost: the requests in flight, and the rows answered but not on disk: the
    # buffer (< every), the parts queued for the writer thread and the one being written.
    per_kill_bound = conc + every * (MAX_PENDING_WRITES + 2)
    rng, kills, before, lost = random.Random(1), 0, requests(stub), []
    while kills < 6:
        run_before, rows_before = requests(stub), in_ledger()
        proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 1.6))  # the point: a SIGKILL at a random moment
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        lost.append((requests(stub) - run_before) - (in_ledger() - rows_before))
    assert kills >= 5
    assert all(0 <= x <= per_kill_bound for x in lost), (lost, per_kill_bound)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    sent = requests(stub) - before
    assert n <= sent <= n + sum(lost)
    ref, got = pq.read_table(tmp_path / "ref-out.parquet"), pq.read_table(tmp_path / "killed-out.parquet")
    assert got.num_rows == n and len(set(got.column("id").to_pylist())) == n
    assert got.equals(ref)


def _bad(tmp_path: Path, stub, **spec_fields) -> subprocess.CompletedProcess[str]:
    spec = write_spec(tmp_path, endpoints=[stub.url], **spec_fields)
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 2, res.stderr
    assert requests(stub) == before
    return res


def test_bad_datasets_are_refused_before_any_request(tmp_path: Path, stub) -> None:
    import pyarrow as pa

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["x", "y"]}), src)
    err = _bad(tmp_path, stub).stderr
    assert "column 'prompt' is missing" in err and str(src) in err

    make_dataset(src, 10, ids=["a", "b", "c", "d", "e", "a", "f", "g", "h", "i"])
    err = _bad(tmp_path, stub).stderr
    assert "id column 'id'" in err and "duplicated" in err and "'a'" in err and str(src) in err

    pq.write_table(pa.table({"id": pa.array([], pa.string()), "prompt": pa.array([], pa.string())}), src)
    err = _bad(tmp_path, stub).stderr
    assert "has no rows" in err and str(src) in err

    src.write_bytes(b"PAR1 this is not parquet")
    err = _bad(tmp_path, stub).stderr
    assert "not a readable parquet file" in err and str(src) in err

    pq.write_table(pa.table({"id": ["a", "b"], "prompt": [1, 2]}), src)
    err = _bad(tmp_path, stub).stderr
    assert "column 'prompt' has type int64" in err and "string" in err and str(src) in err

    pq.write_table(pa.table({"id": [1.5, 2.5], "prompt": ["x", "y"]}), src)
    err = _bad(tmp_path, stub).stderr
    assert "id column 'id' has type double" in err


def test_two_endpoints_share_the_load(tmp_path: Path, stub_factory) -> None:
    a, b = stub_factory(latency_ms=5), stub_factory(latency_ms=5)
    make_dataset(tmp_path / "in.parquet", 600)
    spec = write_spec(tmp_path, endpoints=[a.url, b.url])
    done = run_job(spec)
    assert done.returncode == 0, done.stderr[-3000:]
    # a row of the tail may be copied to the replica with room (the runner logs how many): one request more
    copied = re.search(r"the tail: (\d+) rows copied", done.stderr)
    ra, rb = requests(a), requests(b)
    assert ra + rb == 600 + (int(copied.group(1)) if copied else 0) and min(ra, rb) > 200, (ra, rb, copied)


def test_adaptive_concurrency_completes_under_429(tmp_path: Path, stub_factory) -> None:
    busy = stub_factory(rate_429=0.3, retry_after_s=0.01, latency_ms=2, seed=5)
    make_dataset(tmp_path / "in.parquet", 800)
    spec = write_spec(
        tmp_path,
        endpoints=[busy.url],
        adaptive_concurrency=True,
        concurrency=64,
        max_retries=10,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    assert run_job(spec).returncode == 0
    rows = _out(tmp_path / "job-out.parquet")
    assert len(rows) == 800 and all(r["status"] == "ok" for r in rows)


def test_custom_job_class_and_per_row_sampling(tmp_path: Path, stub) -> None:
    import pyarrow as pa

    pq.write_table(
        pa.table({"review": ["good", "bad", "fine"], "params": ['{"max_tokens": 5}', "", None]}),
        tmp_path / "in.parquet",
    )
    (tmp_path / "myjobs.py").write_text(
        "import pyarrow as pa\n"
        "from prefect_swarm.jobs import SwarmJob\n"
        "class Upper(SwarmJob):\n"
        "    outputs = {'label': pa.string(), 'n': pa.int64()}\n"
        "    def __init__(self, prefix, **kw):\n"
        "        super().__init__(**kw)\n"
        "        self.prefix = prefix\n"
        "    def columns(self):\n"
        "        return {'review': 'string'}\n"
        "    def request(self, row):\n"
        "        msg = {'role': 'user', 'content': self.prefix + row['review']}\n"
        "        return {'messages': [msg], **self.sampling}\n"
        "    def parse(self, body):\n"
        "        text = body['choices'][0]['message']['content']\n"
        "        return {'label': text.upper(), 'n': body['usage']['completion_tokens']}\n"
    )
    spec = write_spec(
        tmp_path,
        endpoints=[stub.url],
        id_column=None,
        job="myjobs:Upper",
        job_kwargs={"prefix": "rate: ", "sampling": {"max_tokens": 16}, "sampling_column": "params"},
    )
    res = run_job(spec, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["review"] for r in rows] == ["good", "bad", "fine"]
    assert rows[0]["label"].startswith("STUB-") and "RATE: GOOD" in rows[0]["label"]
    assert rows[0]["n"] <= 5 and rows[0]["completion_tokens"] == rows[0]["n"]
    manifest = json.loads(JobPaths(spec.parent).manifest.read_text())
    assert manifest["ids"] == "row position"  # the output says its ids are the input's row positions


def test_openai_batch_jsonl_in_and_out(tmp_path: Path, stub) -> None:
    src = tmp_path / "in.jsonl"
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "stub-model",
                "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 4,
            },
        }
        for i in range(30)
    ]
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = run_openai_batch(tmp_path, stub, src)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(30)]
    assert out[0]["response"]["status_code"] == 200 and out[0]["error"] is None
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"].startswith("stub-")


def test_spec_fields_are_described_and_strict() -> None:
    from pydantic import ValidationError

    for name, field in JobSpec.model_fields.items():
        assert field.description, name
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"input": "a.parquet", "output": "b.parquet", "concurency": 3})
    with pytest.raises(ValidationError, match="not 'module:Class'"):
        JobSpec(input="a.parquet", output="b.parquet", job="nope")
    assert JobSpec(input="a.parquet", output="o", job="embedding").job.endswith(":EmbeddingJob")
    assert os.environ.get("PREFECT_SWARM_HOME")


def test_second_process_for_a_shard_exits_2_without_touching_the_ledger(tmp_path: Path, stub_factory) -> None:
    make_dataset(tmp_path / "in.parquet", 400)
    slow = stub_factory(latency_ms=50)
    spec = write_spec(tmp_path, endpoints=[slow.url], concurrency=2, checkpoint_every=100_000, checkpoint_seconds=600)
    first = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
    try:
        shard = JobPaths(tmp_path / "job").shard(0)

        def state() -> object:
            assert first.poll() is None, "the first job process ended"
            return (read_json(shard.progress) or {}).get("state")

        wait_until("the progress file to say running", state, until=lambda s: s == "running", timeout_s=30, poll_s=0.05)

        def files() -> dict[str, int]:  # progress.json is the first process's to rewrite (every 2 s): its pid below
            return {p.name: p.stat().st_mtime_ns for p in shard.root.iterdir() if p != shard.progress}

        before = files()
        second = run_job(spec)
        assert second.returncode == 2, second.stderr
        assert f"shard 0 of job job is already running (pid {first.pid})" in second.stderr
        assert files() == before
        assert read_json(shard.progress)["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 75
    # the lock dies with its process: the next run takes it and finishes the shard
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert len(_out(tmp_path / "job-out.parquet")) == 400


_REPORT_PANDAS = """
import runpy, sys
try:
    runpy.run_module("prefect_swarm.jobs.run", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    print("pandas" in sys.modules, stop.code)
"""


def test_a_job_process_writes_its_parts_without_importing_pandas(tmp_path: Path, stub) -> None:
    """pyarrow would import pandas for the first part (~0.3 CPU-s and ~30-50 MB per shard process)."""
    make_dataset(tmp_path / "in.parquet", 300, row_group=100)
    spec = write_spec(tmp_path, endpoints=[stub.url], checkpoint_every=100)
    python, _, _, *args = job_argv(spec)
    res = subprocess.run([python, "-c", _REPORT_PANDAS, *args], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["False", "0"], res.stderr
    rows = _out(tmp_path / "job-out.parquet")
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(300)] and {r["status"] for r in rows} == {"ok"}


def test_pyarrow_kept_from_pandas_still_converts_to_and_from_it() -> None:
    """What a DataFrameJob whose module does not import pandas relies on after the job process's probe."""
    code = """
import sys
import pyarrow as pa
from prefect_swarm.jobs.checkpoint.ledger import pyarrow_without_pandas
assert pyarrow_without_pandas()
pa.table({"a": [1, 2], "b": ["x", None]})
assert "pandas" not in sys.modules
frame = pa.table({"c": ["x", "y", "x"]}).to_pandas()
frame["c"] = frame["c"].astype("category")
table = pa.Table.from_pandas(frame)
assert str(table.schema.field("c").type).startswith("dictionary"), table.schema
assert table.to_pandas()["c"].dtype == "category"
assert not pyarrow_without_pandas()  # pandas imported: the process is left as it is
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
