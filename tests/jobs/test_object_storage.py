"""Input, output and the ledger on an object store (a real S3 API: moto in server mode on loopback).

A kill -9 mid-job and a rerun with input, output (and the ledger, ``ledger: s3://...``) on
``s3://`` is exactly once; the output is read back with pyarrow and pandas from ``s3://``; a
commit killed mid-write publishes nothing; bad locations are refused before any request, naming the field.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, requests, run_job, write_spec

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.checkpoint.ledger import read_ledger, shard_store
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import TEMP_SUFFIX, JobPaths, read_json
from prefect_swarm.testing.moto_s3 import MotoS3
from prefect_swarm.testing.waiting import wait_until

BUCKET = "swarm-data"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """One moto S3 server for the module, its bucket created, this process's AWS_* pointed at it."""
    with MotoS3() as server:
        server.create_bucket(BUCKET)
        old = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _fs() -> pafs.FileSystem:
    return storage.parse(f"s3://{BUCKET}/x", "test").fs


def _put(local: Path, key: str) -> str:
    with open(local, "rb") as src, _fs().open_output_stream(f"{BUCKET}/{key}", compression=None) as dst:
        dst.write(src.read())
    return f"s3://{BUCKET}/{key}"


def _keys(prefix: str) -> list[str]:
    found = _fs().get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", allow_not_found=True, recursive=True))
    return sorted(i.path for i in found if i.is_file)


@pytest.mark.parametrize("ledger_on_s3", [False, True], ids=["ledger-local", "ledger-s3"])
def test_kill9_and_rerun_on_s3_is_exactly_once(
    tmp_path: Path, s3: MotoS3, stub, stub_factory, ledger_on_s3: bool
) -> None:
    n, conc, every = 6000, 16, 200
    top = "kill-s3ledger" if ledger_on_s3 else "kill"
    make_dataset(tmp_path / "in.parquet", n, row_group=500)
    src = _put(tmp_path / "in.parquet", f"{top}/in.parquet")
    ref = write_spec(tmp_path, "ref", endpoints=[stub.url], concurrency=conc, checkpoint_every=every)
    assert run_job(ref).returncode == 0
    slow = stub_factory(latency_ms=10)  # at most 1,600 rows/s at c=16: the job outlasts the kills
    out = f"s3://{BUCKET}/{top}/out.parquet"
    spec = write_spec(
        tmp_path,
        "killed",
        input=src,
        output=out,
        endpoints=[slow.url],
        concurrency=conc,
        checkpoint_every=every,
        checkpoint_seconds=0.3,
        **({"ledger": f"s3://{BUCKET}/{top}/ledger"} if ledger_on_s3 else {}),
    )
    shard = JobPaths(tmp_path / "killed").shard(0)
    store = shard_store(JobSpec.load(spec), 0)

    def in_ledger() -> int:
        """Distinct rows in the shard's ledger; a live job may compact parts between the listing and the read."""
        for _ in range(50):
            try:
                table = read_ledger(store, ["_row"])
            except FileNotFoundError:
                continue
            return 0 if table is None else len(set(table.column("_row").to_pylist()))
        raise AssertionError("the ledger changed under each of 50 reads")

    rng, kills, before, lost = random.Random(2), 0, requests(slow), []
    while kills < 4:
        run_before, rows_before = requests(slow), in_ledger()
        proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL, env={**os.environ, **s3.env()})
        wait_until(  # kill mid-run once it has checkpointed, whatever its start costs
            "a checkpoint (or the job's end)",
            lambda p=proc: (in_ledger(), p.poll()),
            until=lambda seen, rows=rows_before: seen[0] != rows or seen[1] is not None,
            timeout_s=60,
            poll_s=0.05,
        )
        time.sleep(rng.uniform(0.0, 0.3))  # between two checkpoints: rows in flight and unflushed are lost
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        lost.append((requests(slow) - run_before) - (in_ledger() - rows_before))
        assert _keys(f"{top}/out") == [], "a killed job published an output"
    assert kills >= 3 and in_ledger() > 0
    if ledger_on_s3:  # the checkpoint is on the store; the job folder keeps only the lock (and logs)
        parts = [k for k in _keys(f"{top}/ledger/00000/") if k.rsplit("/", 1)[1].startswith("part-")]
        assert parts and len(parts) == len(store.parts())
        assert shard.parts() == [] and not shard.progress.exists() and not shard.fingerprint.exists()
    res = run_job(spec, env=s3.env())
    assert res.returncode == 0, res.stderr
    sent = requests(slow) - before
    assert n <= sent <= n + sum(lost)
    want = pq.read_table(tmp_path / "ref-out.parquet")
    got = pq.read_table(f"{BUCKET}/{top}/out.parquet", filesystem=_fs())
    assert got.num_rows == n and len(set(got.column("id").to_pylist())) == n
    assert got.equals(want)
    assert pq.read_table(out).equals(want)  # pyarrow and pandas, from the s3:// URI (AWS_* in the environment)
    frame = pd.read_parquet(out)
    assert list(frame["id"]) == [f"r{i:06d}" for i in range(n)] and (frame["status"] == "ok").all()
    data_keys = [k for k in _keys(f"{top}/") if "/ledger/" not in k]
    assert data_keys == [f"{BUCKET}/{top}/in.parquet", f"{BUCKET}/{top}/out.parquet"]  # no temp key left
    ledger_keys = {k.rsplit("/", 1)[1] for k in _keys(f"{top}/ledger/")}
    if ledger_on_s3:
        assert {"DONE", "progress.json", "fingerprint.json"} <= ledger_keys
        assert not any(k.endswith(TEMP_SUFFIX) for k in ledger_keys) and not shard.done_marker.exists()
    else:
        assert ledger_keys == set() and shard.done_marker.exists()
    manifest = read_json(JobPaths(tmp_path / "killed").manifest)
    assert manifest["output"] == out and manifest["rows"] == manifest["ok"] == n
    # a rerun of a finished job sends nothing and rewrites nothing
    mtime = _fs().get_file_info(f"{BUCKET}/{top}/out.parquet").mtime_ns
    assert run_job(spec, env=s3.env()).returncode == 0
    assert requests(slow) - before == sent
    assert _fs().get_file_info(f"{BUCKET}/{top}/out.parquet").mtime_ns == mtime


def test_openai_batch_jsonl_gz_from_and_to_s3(tmp_path: Path, s3: MotoS3, stub) -> None:
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4},
        }
        for i in range(30)
    ]
    local = tmp_path / "batch.jsonl.gz"
    local.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    src = _put(local, "batch/in.jsonl.gz")
    out = f"s3://{BUCKET}/batch/out.jsonl.gz"
    spec = write_spec(tmp_path, "batch", input=src, output=out, endpoints=[stub.url], id_column=None)
    res = run_job(spec, env=s3.env())
    assert res.returncode == 0, res.stderr
    with _fs().open_input_stream(f"{BUCKET}/batch/out.jsonl.gz", compression=None) as fh:
        got = [json.loads(x) for x in gzip.decompress(fh.read()).decode().splitlines()]
    assert [x["custom_id"] for x in got] == [f"q{i}" for i in range(30)]
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in got)


def test_commit_killed_mid_write_publishes_nothing(tmp_path: Path, s3: MotoS3) -> None:
    code = (
        "import os, pyarrow as pa, pyarrow.parquet as pq\n"
        "from prefect_swarm.jobs.rows import storage\n"
        f"loc = storage.parse('s3://{BUCKET}/crash/out.parquet', 'output')\n"
        "with storage.publish_file(loc) as sink:\n"
        "    w = pq.ParquetWriter(sink, pa.schema([('a', pa.int64())]))\n"
        "    w.write_table(pa.table({'a': list(range(100000))}))\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **s3.env()}, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    loc = storage.parse(f"s3://{BUCKET}/crash/out.parquet", "output")
    assert not loc.exists()
    storage.remove_stale_temps(loc)
    assert _keys("crash/") == []
    # an error inside the write publishes nothing either, and leaves no temp key
    with pytest.raises(RuntimeError), storage.publish_file(loc) as sink:
        sink.write(b"half")
        raise RuntimeError("boom")
    assert _keys("crash/") == []
    with storage.publish_file(loc) as sink:
        pq.write_table(pa.table({"a": [1]}), sink)
    assert _keys("crash/") == [f"{BUCKET}/crash/out.parquet"]


SECRET = "example-secret"
"""A credential written into a URI: refused, and never echoed."""
IN_URI = "credentials may not be written into the URI"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("input", "ftp://host/in.parquet", "scheme 'ftp' is not supported"),
        ("output", "s3:///out.parquet", "the bucket is missing"),
        ("output", f"s3://AKIAEXAMPLEKEY:{SECRET}@bucket/out.parquet", IN_URI),
        ("input", f"s3://bucket/in.parquet?secret_key={SECRET}", IN_URI),
        ("job_dir", "s3://bucket/ledger", "must be on a POSIX filesystem"),
        ("ledger", "ledger-here", "set ledger only for an s3:// or gs:// folder"),
        ("ledger", f"s3://AKIAEXAMPLEKEY:{SECRET}@bucket/ledger", IN_URI),
    ],
)
def test_bad_locations_are_refused_before_any_request(tmp_path: Path, stub, field: str, value: str, says: str) -> None:
    make_dataset(tmp_path / "in.parquet", 10)
    spec = write_spec(tmp_path, endpoints=[stub.url], **{field: value})
    before = requests(stub)
    res = run_job(spec, env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})  # nothing is asked of any store
    assert res.returncode == 2, res.stderr
    assert says in res.stderr and f"{field} " in res.stderr
    assert SECRET not in res.stderr
    assert requests(stub) == before


def test_local_forms_are_the_same_path(tmp_path: Path) -> None:
    plain = storage.parse(str(tmp_path / "a.parquet"), "output")
    assert storage.parse(f"file://{tmp_path}/a.parquet", "output") == plain.__class__(
        f"file://{tmp_path}/a.parquet", "", str(tmp_path / "a.parquet")
    )
    assert not plain.remote and plain.uri == str((tmp_path / "a.parquet").resolve())
    spec = JobSpec(input="in.parquet", output="out.parquet", job_dir=f"file://{tmp_path}/job")
    assert spec.paths.root == tmp_path / "job"
    with pytest.raises(ConfigError, match="gs://BUCKET/KEY"):
        storage.parse("gs://", "output")


def test_prepare_job_with_input_and_output_on_s3(tmp_path: Path, s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_swarm.launch import prepare_job

    make_dataset(tmp_path / "in.parquet", 20)
    src = _put(tmp_path / "in.parquet", "prep/in.parquet")
    spec = JobSpec(input=src, output=f"s3://{BUCKET}/prep/out.parquet", job_dir=str(tmp_path / "job"), id_column="id")
    ids = set()
    for cwd in (tmp_path, tmp_path / "job"):  # the job id names the output, wherever it is submitted from
        (tmp_path / "job").mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        ready = prepare_job(spec)
        ids.add(ready.job_id)
    assert len(ids) == 1 and JobSpec.load(tmp_path / "job" / "spec.json").input == src
    with pytest.raises(ConfigError, match=r"output s3://swarm-data/prep/in.parquet is the input"):
        prepare_job(spec.model_copy(update={"output": src}))
    with pytest.raises(ConfigError, match=r"input s3://swarm-data/prep/missing.parquet does not exist"):
        prepare_job(JobSpec(input=f"s3://{BUCKET}/prep/missing.parquet", output=str(tmp_path / "o.parquet")))


def test_ledger_on_s3_resume_checks_and_overwrite(tmp_path: Path, s3: MotoS3, stub) -> None:
    n = 60
    make_dataset(tmp_path / "in.parquet", n)
    ledger = f"s3://{BUCKET}/ow/ledger"
    spec = write_spec(tmp_path, "ow", endpoints=[stub.url], checkpoint_every=20, ledger=ledger)
    before = requests(stub)
    assert run_job(spec, env=s3.env()).returncode == 0
    assert requests(stub) - before == n
    # other settings against the checkpoint on the store: refused, naming it
    changed = write_spec(
        tmp_path,
        "ow",
        endpoints=[stub.url],
        checkpoint_every=20,
        ledger=ledger,
        job_kwargs={"sampling": {"max_tokens": 9}},
    )
    res = run_job(changed, env=s3.env())
    assert res.returncode != 0 and "refusing to resume" in res.stderr and ledger in res.stderr
    assert requests(stub) - before == n
    # --overwrite discards the objects and starts over: every row again, one fresh set of parts
    res = run_job(changed, 0, 1, "--overwrite", env=s3.env())
    assert res.returncode == 0, res.stderr
    assert requests(stub) - before == 2 * n
    table = read_ledger(shard_store(JobSpec.load(changed), 0), ["_row"])
    assert table is not None and sorted(table.column("_row").to_pylist()) == list(range(n))


def test_upload_parts_grow_with_the_object(s3: MotoS3) -> None:
    """Part sizes follow the object's size (no fixed-part ceiling): 8 MiB parts first, doubling every
    1,000 parts, 10,000 parts reach past S3's 5 TiB; an upload of growing parts reads back whole."""
    sizes = [storage.upload_part_size(i) for i in range(storage.MAX_PARTS)]
    assert sizes[0] == sizes[999] == 8 * 2**20 and sizes[1000] == 16 * 2**20
    assert sum(sizes) > 5 * 2**40 and max(sizes) <= storage.MAX_PART_BYTES
    sent: list[int] = []

    class Recording:
        """The store's client, noting the size of each part it is sent."""

        def __init__(self) -> None:
            self.client = storage._s3_client()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def upload_part(self, **kw: Any) -> Any:
            sent.append(len(kw["Body"]))
            return self.client.upload_part(**kw)

    def uploader(path: str) -> storage.S3Upload:  # S3's least part, doubling as seen in a 33 MiB object
        return storage.S3Upload(path, client=Recording(), min_part_bytes=5 * 2**20, parts_per_size=2)

    data = random.Random(3).randbytes(33 * 2**20)
    loc = storage.parse(f"s3://{BUCKET}/grow/big.bin", "output")
    with storage.publish_file(loc, uploader=uploader) as sink:
        for k in range(0, len(data), 3 * 2**20 + 7):
            sink.write(data[k : k + 3 * 2**20 + 7])
    assert [s // 2**20 for s in sent] == [5, 5, 10, 10, 3]
    assert _fs().open_input_stream(f"{BUCKET}/grow/big.bin").read() == data


def test_a_dataset_on_s3_is_published_by_its_manifest(tmp_path: Path, s3: MotoS3) -> None:
    """Parts go straight to their keys (no copy); the manifest switches commits; the previous commit's
    files are deleted and _SUCCESS written last; a killed part upload is aborted by the next commit."""
    import pyarrow.dataset as pds
    from test_commit import _fake_ledger
    from test_dataset_output import _rewrite

    from prefect_swarm.jobs.rows import output
    from prefect_swarm.jobs.rows.commit import commit_output

    n = 2000
    make_dataset(tmp_path / "in.parquet", n, row_group=500)
    spec = JobSpec.load(write_spec(tmp_path, shards=2, endpoints=["http://127.0.0.1:9"], output=f"s3://{BUCKET}/ds/"))
    latest = _fake_ledger(spec, n, seed=3)
    first = commit_output(spec, bucket_rows=300)

    def check() -> dict[str, Any]:
        manifest = json.loads(_fs().open_input_stream(f"{BUCKET}/ds/{output.MANIFEST}").read())
        keys = sorted(k.removeprefix(f"{BUCKET}/ds/") for k in _keys("ds/"))
        assert keys == sorted([*(f["path"] for f in manifest["files"]), output.MANIFEST, output.SUCCESS])
        table = pds.dataset(f"{BUCKET}/ds", filesystem=_fs(), format="parquet").to_table()
        table = table.sort_by(output.POSITION_COLUMN)
        assert table.column("text").to_pylist() == [latest[i]["text"] for i in range(n)]
        return manifest

    assert check()["commit"] == first["commit"]
    _rewrite(spec, latest, "v2", n)
    killed = f"ds/{output.part_name(0, 0, 'f' * 12)}"
    client = s3.client()
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=killed)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=killed, UploadId=upload, PartNumber=1, Body=b"x" * (5 * 2**20))
    second = commit_output(spec, bucket_rows=300)
    assert second["commit"] != first["commit"] and check()["commit"] == second["commit"]
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="ds/").get("Uploads", []) == []
    assert commit_output(spec) == second
