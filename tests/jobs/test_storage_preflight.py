"""Object storage found before the first request (issue 22 item 1), and killed uploads aborted.

A moto S3 server on loopback that checks credentials as IAM does (``MotoS3(iam=True)``). Each bad
location or credential is a corpus case run through the job process's entry point in this process:
exit 2, one message naming the location or setting (no traceback), no request at the stub engine,
no output, temp or probe object and no open multipart upload on the store, the input's bytes
unchanged. A few of them go through ``prefect-swarm job submit`` too. Then the multipart uploads a
killed commit or a killed ledger flush leaves open are aborted by the rerun, and only those.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, requests, write_spec

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.run import main as job_main
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import is_probe, probe_name
from prefect_swarm.testing.moto_s3 import MotoS3
from prefect_swarm.testing.ports import free_port

BUCKET = "preflight"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """One IAM-checking moto S3 server for the module, with its bucket and a read-only user."""
    with MotoS3(iam=True) as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def read_only(s3: MotoS3) -> dict[str, str]:
    """The environment of a user who may read and list, not write."""
    return s3.add_user("reader", ["s3:GetObject", "s3:ListBucket"])


@pytest.fixture
def aws_env(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """Point this process's AWS_* at ``env`` (pyarrow's cached filesystems are dropped: they hold the keys)."""

    def use(env: dict[str, str]) -> None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        storage._filesystem.cache_clear()

    use(s3.env())
    yield use
    storage._filesystem.cache_clear()


def _objects(s3: MotoS3, prefix: str) -> dict[str, str]:
    """Every object under ``prefix`` with its ETag (the admin's view)."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _uploads(s3: MotoS3, prefix: str = "") -> list[str]:
    """Keys of the unfinished multipart uploads under ``prefix``."""
    found = s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    return sorted(u["Key"] for u in found)


def _put_input(s3: MotoS3, tmp: Path, prefix: str) -> str:
    make_dataset(tmp / "in.parquet", 20)
    s3.client().put_object(Bucket=BUCKET, Key=f"{prefix}/in.parquet", Body=(tmp / "in.parquet").read_bytes())
    return f"s3://{BUCKET}/{prefix}/in.parquet"


@dataclass(frozen=True)
class Case:
    """A bad location or credential: the spec fields, the environment, what the message must say."""

    name: str
    build: Callable[[Path, MotoS3, str, dict[str, str]], tuple[dict[str, Any], dict[str, str]]]
    expect: list[str]


def _local_in(tmp: Path) -> str:
    make_dataset(tmp / "in.parquet", 20)
    return str(tmp / "in.parquet")


def _closed_port_env(s3: MotoS3) -> dict[str, str]:
    return {**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}


def _wrong_secret(s3: MotoS3) -> dict[str, str]:
    return {**s3.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}


def _unknown_key(s3: MotoS3) -> dict[str, str]:
    return {**s3.env(), "AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000"}


CASES = [
    Case("output-bucket-missing",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": "s3://no-such-bucket-here/out.parquet"}, s.env()),
         ["output s3://no-such-bucket-here/out.parquet", "bucket 'no-such-bucket-here' does not exist"]),
    Case("output-read-only-credentials",
         lambda t, s, p, ro: ({"input": _put_input(s, t, p), "output": f"s3://{BUCKET}/{p}/out.parquet"}, ro),
         [f"output s3://{BUCKET}/{{p}}/out.parquet", "may not write it", "s3:PutObject"]),
    Case("ledger-read-only-credentials",
         lambda t, s, p, ro: ({"input": _put_input(s, t, p), "ledger": f"s3://{BUCKET}/{p}/ledger"}, ro),
         [f"ledger s3://{BUCKET}/{{p}}/ledger", "may not write it", "s3:PutObject"]),
    Case("output-key-dot-segment",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": f"s3://{BUCKET}/{p}/./out.parquet"}, s.env()),
         [f"output s3://{BUCKET}/{{p}}/./out.parquet", "'./' segment"]),
    Case("output-key-double-slash",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": f"s3://{BUCKET}/{p}//out.parquet"}, s.env()),
         [f"output s3://{BUCKET}/{{p}}//out.parquet", "'//' segment"]),
    Case("ledger-key-dotdot-segment",
         lambda t, s, p, ro: ({"input": _local_in(t), "ledger": f"s3://{BUCKET}/{p}/../ledger"}, s.env()),
         [f"ledger s3://{BUCKET}/{{p}}/../ledger", "'../' segment"]),
    Case("input-wrong-secret",
         lambda t, s, p, ro: ({"input": _put_input(s, t, p)}, _wrong_secret(s)),
         [f"input s3://{BUCKET}/{{p}}/in.parquet", "AWS_SECRET_ACCESS_KEY"]),
    Case("output-wrong-secret",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": f"s3://{BUCKET}/{p}/out.parquet"}, _wrong_secret(s)),
         [f"output s3://{BUCKET}/{{p}}/out.parquet", "AWS_SECRET_ACCESS_KEY"]),
    Case("input-unknown-access-key",
         lambda t, s, p, ro: ({"input": _put_input(s, t, p)}, _unknown_key(s)),
         [f"input s3://{BUCKET}/{{p}}/in.parquet", "does not know the access key", "AWS_ACCESS_KEY_ID"]),
    Case("output-unknown-access-key",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": f"s3://{BUCKET}/{p}/out.parquet"}, _unknown_key(s)),
         [f"output s3://{BUCKET}/{{p}}/out.parquet", "does not know the access key", "AWS_ACCESS_KEY_ID"]),
    Case("output-endpoint-unreachable",
         lambda t, s, p, ro: ({"input": _local_in(t), "output": f"s3://{BUCKET}/{p}/out.parquet"},
                              _closed_port_env(s)),
         [f"output s3://{BUCKET}/{{p}}/out.parquet", "cannot be reached", "AWS_ENDPOINT_URL", "http://127.0.0.1:"]),
    Case("input-endpoint-unreachable",
         lambda t, s, p, ro: ({"input": _put_input(s, t, p)}, _closed_port_env(s)),
         [f"input s3://{BUCKET}/{{p}}/in.parquet", "cannot be reached", "AWS_ENDPOINT_URL"]),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_object_storage_is_refused_before_any_request(
    tmp_path: Path, s3: MotoS3, read_only: dict[str, str], aws_env, stub, caplog, own_signals, case: Case
) -> None:
    prefix = f"corpus/{case.name}"
    fields, env = case.build(tmp_path, s3, prefix, read_only)
    spec = write_spec(tmp_path, endpoints=[stub.url], **fields)
    before_objects, before_local = _objects(s3, prefix), (tmp_path / "in.parquet").read_bytes()
    before = requests(stub)
    aws_env(env)
    caplog.set_level(logging.ERROR, logger="prefect_swarm.jobs")
    code = job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"])
    message = caplog.text
    assert code == 2, message
    for part in case.expect:
        assert part.format(p=prefix) in message, message
    assert "Nothing was sent to the swarm" in message or "segment" in message, message
    assert "Traceback" not in message and all(r.exc_info is None for r in caplog.records), message
    assert "not-the-secret" not in message
    assert requests(stub) == before
    assert _objects(s3, prefix) == before_objects  # the input as it was; no output, temp or probe object
    assert _uploads(s3, prefix) == []
    assert (tmp_path / "in.parquet").read_bytes() == before_local
    assert not (tmp_path / "job-out.parquet").exists()


@pytest.fixture
def stub_swarm() -> Iterator[str]:
    """One stub-engine replica on the local backend; yields the swarm's name."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    cfg = SwarmConfig.model_validate(stub_swarm_config("storage-preflight-stub"))
    with Swarm(cfg):
        yield cfg.name


CLI_CASES = ["output-bucket-missing", "output-read-only-credentials", "output-wrong-secret"]


def test_object_storage_refused_by_job_submit(
    tmp_path: Path, s3: MotoS3, read_only: dict[str, str], aws_env, stub_swarm: str
) -> None:
    """`prefect-swarm job submit` refuses the same: exit 2, one message, no traceback, nothing on the store."""
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app

    for name in CLI_CASES:  # one swarm for the cases (bringing it up is most of the time)
        case = next(c for c in CASES if c.name == name)
        prefix, tmp = f"cli/{name}", tmp_path / name
        tmp.mkdir()
        fields, env = case.build(tmp, s3, prefix, read_only)
        spec_file = tmp / "spec-in.json"
        spec_file.write_text(json.dumps({"input": str(tmp / "in.parquet"), "output": "o.parquet", **fields}))
        before_objects = _objects(s3, prefix)
        aws_env(env)
        res = CliRunner().invoke(app, ["job", "submit", "-n", stub_swarm, "--spec", str(spec_file)])
        assert res.exit_code == 2, res.output
        assert all(part.format(p=prefix) in res.output for part in case.expect), res.output
        assert "Traceback" not in res.output and res.output.count("Error (ConfigError)") == 1, res.output
        aws_env(s3.env())
        assert _objects(s3, prefix) == before_objects and _uploads(s3, prefix) == []


def test_prepare_job_refuses_what_a_flow_would_submit(
    tmp_path: Path, s3: MotoS3, read_only: dict[str, str], aws_env
) -> None:
    """The flow's path (launch.prepare_job) runs the same pre-flight: read-only keys are found there."""
    from prefect_swarm.launch import prepare_job

    src = _put_input(s3, tmp_path, "flow")
    aws_env(read_only)
    spec = JobSpec(input=src, output=f"s3://{BUCKET}/flow/out.parquet", job_dir=str(tmp_path / "job"), id_column="id")
    with pytest.raises(ConfigError, match=r"output s3://preflight/flow/out.parquet: .*may not write it"):
        prepare_job(spec)
    assert not (tmp_path / "job" / "spec.json").exists()
    aws_env(s3.env())
    assert list(_objects(s3, "flow/")) == ["flow/in.parquet"]


@pytest.mark.smoke
def test_the_probe_leaves_nothing_and_a_good_job_runs(tmp_path: Path, s3: MotoS3, aws_env, stub, own_signals) -> None:
    """With writable keys the pre-flight passes, leaves no probe object, and the job writes its output once."""
    prefix = "good"
    src = _put_input(s3, tmp_path, prefix)
    out = f"s3://{BUCKET}/{prefix}/out.parquet"
    spec = write_spec(tmp_path, input=src, output=out, ledger=f"s3://{BUCKET}/{prefix}/ledger", endpoints=[stub.url])
    before = requests(stub)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    assert requests(stub) - before == 20
    keys = _objects(s3, prefix)
    assert not [k for k in keys if ".prefect-swarm-probe-" in k or k.endswith(".tmp")], keys
    assert {f"{prefix}/in.parquet", f"{prefix}/out.parquet"} <= set(keys)
    assert pq.read_table(out).num_rows == 20 and _uploads(s3, prefix) == []


def test_probes_a_killed_run_left_are_removed_by_the_next_run(
    tmp_path: Path, s3: MotoS3, aws_env, stub, own_signals
) -> None:
    """A kill -9 between a probe's write and its delete leaves a billed object; the next run's check of
    that folder removes it (beside the output and in the ledger), whatever run wrote it."""
    prefix = "killed-probe"
    src = _put_input(s3, tmp_path, prefix)
    left = [f"{prefix}/{probe_name('a' * 32)}", f"{prefix}/ledger/{probe_name('b' * 32)}"]
    for key in left:
        s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"prefect-swarm write probe\n")
    out = f"s3://{BUCKET}/{prefix}/out.parquet"
    spec = write_spec(tmp_path, input=src, output=out, ledger=f"s3://{BUCKET}/{prefix}/ledger", endpoints=[stub.url])
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    keys = _objects(s3, prefix)
    assert not [k for k in keys if is_probe(k.rpartition("/")[2])], keys
    assert pq.read_table(out).num_rows == 20


# ----------------------------------------------------------------------------- multipart uploads
def _open_upload(s3: MotoS3, key: str) -> None:
    """A multipart upload with one part, never completed: what a kill -9 mid-upload leaves."""
    client = s3.client()
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * (5 * 2**20))


def test_a_rerun_aborts_the_uploads_its_killed_commit_and_flush_left(
    tmp_path: Path, s3: MotoS3, aws_env, stub, own_signals
) -> None:
    prefix = "mpu"
    src = _put_input(s3, tmp_path, prefix)
    out = f"s3://{BUCKET}/{prefix}/out.parquet"
    spec = write_spec(tmp_path, input=src, output=out, ledger=f"s3://{BUCKET}/{prefix}/ledger", endpoints=[stub.url])
    killed_commit = f"{prefix}/.out.parquet.{'a' * 32}.tmp"  # publish_file()'s temp key of this output
    killed_flush = f"{prefix}/ledger/00000/part-000007.parquet"  # a ledger part of this job's shard
    others = [f"{prefix}/other.parquet", f"{prefix}/.other.parquet.{'b' * 32}.tmp", f"{prefix}/ledger-2/x"]
    for key in (killed_commit, killed_flush, *others):
        _open_upload(s3, key)
    assert _uploads(s3, prefix) == sorted([killed_commit, killed_flush, *others])
    before = requests(stub)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    assert _uploads(s3, prefix) == sorted(others)  # the job's own are aborted, nobody else's
    assert requests(stub) - before == 20
    got = pq.read_table(out)
    assert got.num_rows == 20 and sorted(got.column("id").to_pylist()) == [f"r{i:06d}" for i in range(20)]
    keys = _objects(s3, prefix)
    assert f"{prefix}/out.parquet" in keys and not [k for k in keys if k.endswith(".tmp")], keys


def test_a_failed_upload_is_aborted_not_left_open(s3: MotoS3, aws_env) -> None:
    """An error while the output streams (a part already up), or when its upload completes, aborts the
    upload at once: no object, no open upload, no temp key."""
    loc = storage.parse(f"s3://{BUCKET}/fail/out.parquet", "output")
    small = functools.partial(storage.S3Upload, min_part_bytes=5 * 2**20)  # S3's least part: one goes up at 5 MiB
    with pytest.raises(RuntimeError, match="boom"), storage.publish_file(loc, uploader=small) as sink:
        sink.write(b"x" * (6 * 2**20))
        assert _uploads(s3, "fail/") == ["fail/out.parquet"]  # straight to its key, not yet visible
        assert _objects(s3, "fail/") == {}
        raise RuntimeError("boom")
    assert _uploads(s3, "fail/") == [] and _objects(s3, "fail/") == {}
    real = storage._s3_client

    class Failing:
        """The store's client whose completion fails, as a network error would, after the parts went up."""

        def __init__(self) -> None:
            self.client = real()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def complete_multipart_upload(self, **kw: Any) -> None:
            raise ConnectionError("Could not connect to the endpoint URL")

    failing = functools.partial(small, client=Failing())
    with pytest.raises(OSError, match="Could not connect"), storage.publish_file(loc, uploader=failing) as sink:
        sink.write(b"y" * (6 * 2**20))
    assert _uploads(s3, "fail/") == [] and _objects(s3, "fail/") == {}  # no temp key, no folder marker


def test_a_store_failing_at_commit_is_one_message(
    tmp_path: Path, s3: MotoS3, read_only: dict[str, str], aws_env, stub, own_signals
) -> None:
    """Keys that lose the right to write after the pre-flight: the commit says so in one JobError, and a
    commit with writable keys then publishes the rows from the ledger without sending them again."""
    from prefect_swarm.exceptions import JobError
    from prefect_swarm.jobs.rows.commit import commit_output

    make_dataset(tmp_path / "in.parquet", 20)
    out = f"s3://{BUCKET}/late/out.parquet"
    spec = write_spec(tmp_path, output=out, endpoints=[stub.url], auto_commit=False)
    before = requests(stub)
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 0
    aws_env(read_only)
    said = r"output s3://preflight/late/out.parquet: .*may not write it.*kept in the ledger"
    with pytest.raises(JobError, match=said):
        commit_output(JobSpec.load(spec))
    aws_env(s3.env())
    assert _objects(s3, "late/") == {} and _uploads(s3, "late/") == []
    assert commit_output(JobSpec.load(spec))["rows"] == 20 and requests(stub) - before == 20
    assert pq.read_table(out).num_rows == 20


def test_keys_that_may_write_but_not_delete_are_refused(
    tmp_path: Path, s3: MotoS3, aws_env, stub, caplog, own_signals
) -> None:
    """The commit deletes its temporary key: keys without s3:DeleteObject are refused up front, naming
    the right. The probe object they wrote cannot be deleted with them: it is the one object left."""
    make_dataset(tmp_path / "in.parquet", 20)
    spec = write_spec(tmp_path, output=f"s3://{BUCKET}/nodelete/out.parquet", endpoints=[stub.url])
    aws_env(s3.add_user("no-deleter", ["s3:GetObject", "s3:PutObject", "s3:ListBucket"]))
    before = requests(stub)
    caplog.set_level(logging.ERROR, logger="prefect_swarm.jobs")
    assert job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"]) == 2
    assert "output s3://preflight/nodelete/out.parquet: " in caplog.text
    assert "may not delete objects in it" in caplog.text and "s3:DeleteObject" in caplog.text, caplog.text
    assert requests(stub) == before
    left = list(_objects(s3, "nodelete/"))
    assert len(left) == 1 and left[0].startswith("nodelete/.prefect-swarm-probe-"), left
    s3.client().delete_object(Bucket=BUCKET, Key=left[0])
