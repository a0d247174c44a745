"""Bad inputs and outputs are refused before any request; null prompts, compressed inputs, output mode.

The corpus runs the job process's entry point (``prefect_swarm.jobs.run.main``) in this process
against a stub engine, and checks for each case: exit 2, a message naming the file (and the
column or line), no request at the stub, and every file under the test folder unchanged (the
input's bytes, no output, no temp file) apart from the job's own folder.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, requests, run_job, run_openai_batch, write_spec

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.builtin import ChatCompletionJob
from prefect_swarm.jobs.rows.commit import manifest_verdict
from prefect_swarm.jobs.rows.input import InputDataset
from prefect_swarm.jobs.rows.output import check_output_location
from prefect_swarm.jobs.run import main as job_main
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, read_json


def _out(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _batch_lines(n: int) -> list[dict]:
    return [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4},
        }
        for i in range(n)
    ]


def _jsonl_bytes(n: int = 5) -> bytes:
    return ("\n".join(json.dumps(x) for x in _batch_lines(n)) + "\n").encode()


# ---------------------------------------------------------------- 3. null prompts


def test_null_prompt_rows_are_error_rows_without_a_request(tmp_path: Path, stub) -> None:
    prompts = [None if i % 10 == 3 else f"question {i}" for i in range(100)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(100)], "prompt": prompts}), tmp_path / "in.parquet")
    spec = write_spec(tmp_path, endpoints=[stub.url])
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert requests(stub) - before == 90
    rows = _out(tmp_path / "job-out.parquet")
    bad = [r for r in rows if r["status"] == "error"]
    assert [r["id"] for r in bad] == [f"r{i}" for i in range(3, 100, 10)]
    assert all(r["error"] == "column 'prompt' is null in this row; no request sent" for r in bad)
    assert all(r["status"] == "ok" and r["text"] for r in rows if r["prompt"] is not None)


def test_all_null_prompt_column_is_bad_input(tmp_path: Path, stub) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "prompt": pa.array([None] * 3, pa.string())}), src)
    spec = write_spec(tmp_path, endpoints=[stub.url])
    before = requests(stub)
    res = run_job(spec)
    assert res.returncode == 2
    assert f"input {src}: column 'prompt' is empty" in res.stderr
    assert requests(stub) == before


# ---------------------------------------------------------------- 11. compressed inputs


@pytest.mark.parametrize("name", ["in.jsonl.gz", "in.jsonl"])
def test_gzip_jsonl_is_read(tmp_path: Path, stub, name: str) -> None:
    """gzip bytes are read whether the name says .gz or not."""
    src = tmp_path / name
    src.write_bytes(gzip.compress(_jsonl_bytes(30)))
    out = run_openai_batch(tmp_path, stub, src)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(30)]
    assert all(o["response"]["status_code"] == 200 for o in out)


@pytest.mark.parametrize("codec", ["NONE", "SNAPPY", "GZIP", "ZSTD", "BROTLI", "LZ4"])
def test_parquet_is_read_whatever_its_page_compression(tmp_path: Path, stub, codec: str) -> None:
    table = pa.table({"id": [f"r{i}" for i in range(40)], "prompt": [f"q {i}" for i in range(40)]})
    pq.write_table(table, tmp_path / "in.parquet", compression=codec)
    res = run_job(write_spec(tmp_path, endpoints=[stub.url]))
    assert res.returncode == 0, res.stderr
    assert [r["id"] for r in _out(tmp_path / "job-out.parquet")] == [f"r{i}" for i in range(40)]


# ---------------------------------------------------------------- 1/2. output location, mode


def test_output_gets_the_umask_mode_not_0600(tmp_path: Path, stub) -> None:
    make_dataset(tmp_path / "in.parquet", 20)
    for umask, mode in ((0o022, 0o644), (0o002, 0o664)):
        name = f"job{umask:03o}"
        spec = write_spec(tmp_path, name, endpoints=[stub.url])
        argv = [sys.executable, "-m", "prefect_swarm.jobs.run", "--spec", str(spec)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=lambda m=umask: os.umask(m))
        assert res.returncode == 0, res.stderr
        assert (tmp_path / f"{name}-out.parquet").stat().st_mode & 0o777 == mode
        assert JobPaths(tmp_path / name).failed_rows.stat().st_mode & 0o777 == mode


def test_check_output_location_is_callable_before_any_swarm(tmp_path: Path) -> None:
    """The control plane calls this at prepare time; it needs only the input and the output path."""
    src = make_dataset(tmp_path / "in.parquet", 5)
    ds = InputDataset(src)
    assert check_output_location(tmp_path / "sub" / "out.parquet", ds) == tmp_path / "sub" / "out.parquet"
    assert not (tmp_path / "sub").exists()  # nothing created
    with pytest.raises(ConfigError, match="is the input"):
        check_output_location(src, ds)


# ---------------------------------------------------------------- 10. verdict


def test_manifest_verdict_against_max_failed_fraction(tmp_path: Path, stub_factory) -> None:
    flaky = stub_factory(error_rate=0.3, seed=3)
    make_dataset(tmp_path / "in.parquet", 300)
    spec = write_spec(tmp_path, endpoints=[flaky.url], max_retries=0)
    assert run_job(spec).returncode == 0
    manifest = read_json(JobPaths(tmp_path / "job").manifest)
    verdict = manifest_verdict(manifest, JobSpec.load(spec).max_failed_fraction)
    assert not verdict.succeeded and verdict.failed == manifest["failed"] > 30 and verdict.rows == 300
    assert "more than max_failed_fraction 0.01" in verdict.message() and "failed.jsonl" in verdict.message()
    assert manifest_verdict(manifest, 0.5).succeeded
    assert manifest_verdict({"rows": 100, "ok": 99, "failed": 1}, 0.01).succeeded
    assert not manifest_verdict({"rows": 100, "ok": 98, "failed": 2}, 0.01).succeeded
    assert JobSpec(input="a.parquet", output="b.parquet").max_failed_fraction == 0.01
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="max_failed_fraction"):
            JobSpec(input="a.parquet", output="b.parquet", max_failed_fraction=bad)


# ---------------------------------------------------------------- the corpus


@dataclass
class Case:
    """One bad input: ``build(tmp)`` writes the files and returns spec fields; ``expect`` are message parts."""

    name: str
    build: Callable[[Path], dict[str, Any]]
    expect: list[str]
    """Substrings of the message; ``{tmp}`` is the test folder."""
    env: dict[str, str] = field(default_factory=dict)


def _parquet(tmp: Path, name: str = "in.parquet", **cols: Any) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


def _ok_parquet(tmp: Path, name: str = "in.parquet") -> Path:
    return _parquet(tmp, name, id=["a", "b", "c"], prompt=["x", "y", "z"])


def _jsonl(tmp: Path, data: bytes, name: str = "in.jsonl") -> dict[str, Any]:
    (tmp / name).write_bytes(data)
    return {"input": str(tmp / name), "id_column": None, "output": str(tmp / "out.jsonl"), "job": "chat"}


def _do(*_effects: Any, **fields: Any) -> dict[str, Any]:
    """Spec fields, after the file-writing calls in the arguments have run."""
    return fields


def _output(tmp: Path, out: str | Path, _: Any = None, **fields: Any) -> dict[str, Any]:
    """An ordinary input and ``out`` as the output (``_``: a file-writing call already run)."""
    _ok_parquet(tmp)
    return {"output": str(out), **fields}


def _folder_input(tmp: Path) -> Path:
    folder = tmp / "data"
    _ok_parquet(tmp, "data/a.parquet")
    _parquet(tmp, "data/b.parquet", id=["d"], prompt=["w"])
    return folder


def _unwritable(tmp: Path) -> dict[str, Any]:
    _ok_parquet(tmp)
    if os.geteuid() == 0:  # root writes anywhere a permission allows it: sysfs refuses new files
        return {"output": "/sys/prefect-swarm-test/out.parquet"}
    locked = tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    return {"output": str(locked / "out.parquet")}


def _symlink_to_input(tmp: Path) -> dict[str, Any]:
    src = _ok_parquet(tmp)
    (tmp / "alias.parquet").symlink_to(src)
    return {"output": str(tmp / "alias.parquet")}


def _truncated_gzip(tmp: Path) -> dict[str, Any]:
    data = gzip.compress(_jsonl_bytes(2000))
    return _jsonl(tmp, data[: len(data) // 2], "in.jsonl.gz")


def _gzip_bad_line(tmp: Path) -> dict[str, Any]:
    lines = _jsonl_bytes(5).splitlines()
    lines[2] = b"{not json"
    return _jsonl(tmp, gzip.compress(b"\n".join(lines) + b"\n"), "in.jsonl.gz")


def _different_schemas(tmp: Path) -> dict[str, Any]:
    _ok_parquet(tmp, "data/a.parquet")
    _parquet(tmp, "data/b.parquet", id=[1], prompt=["w"])
    return {"input": str(tmp / "data")}


def _all_null_in_folder(tmp: Path) -> dict[str, Any]:
    _parquet(tmp, "data/a.parquet", id=["a"], prompt=pa.array([None], pa.string()))
    _parquet(tmp, "data/b.parquet", id=["b"], prompt=pa.array([None], pa.string()))
    return {"input": str(tmp / "data")}


def _no_stats_all_null(tmp: Path) -> dict[str, Any]:
    pq.write_table(
        pa.table({"id": ["a", "b"], "prompt": pa.array([None, None], pa.string())}),
        tmp / "in.parquet",
        write_statistics=False,
    )
    return {}


def _schema(tmp: Path, *fields: str) -> dict[str, Any]:
    """An ordinary input and a response schema file with ``fields`` (strings)."""
    _ok_parquet(tmp)
    schema = {"type": "object", "properties": {f: {"type": "string"} for f in fields}}
    (tmp / "schema.json").write_text(json.dumps(schema))
    return {"job_kwargs": {"response_schema": str(tmp / "schema.json")}}


class ErrorOutputJob(ChatCompletionJob):
    """A job class that names one of its outputs like a result column."""

    outputs = {"text": pa.string(), "error": pa.string()}


CASES: list[Case] = [
    # ---- parquet inputs
    Case("missing-prompt", lambda t: _do(_parquet(t, id=["a"], question=["x"])),
         ["{tmp}/in.parquet", "column 'prompt' is missing"]),
    Case("prompt-int", lambda t: _do(_parquet(t, id=["a", "b"], prompt=[1, 2])),
         ["{tmp}/in.parquet", "column 'prompt' has type int64"]),
    Case("prompt-all-null", lambda t: _do(_parquet(t, id=["a", "b"], prompt=pa.array([None, None], pa.string()))),
         ["{tmp}/in.parquet", "column 'prompt' is empty"]),
    Case("prompt-null-type", lambda t: _do(_parquet(t, id=["a", "b"], prompt=[None, None])),
         ["{tmp}/in.parquet", "column 'prompt' has type null"]),
    Case("prompt-all-null-no-stats", _no_stats_all_null, ["{tmp}/in.parquet", "column 'prompt' is empty"]),
    Case("prompt-all-null-folder", _all_null_in_folder, ["{tmp}/data", "column 'prompt' is empty"]),
    Case("duplicate-ids", lambda t: _do(_parquet(t, id=["a", "a"], prompt=["x", "y"])),
         ["{tmp}/in.parquet", "id column 'id'", "duplicated", "'a'"]),
    Case("null-id", lambda t: _do(_parquet(t, id=["a", None], prompt=["x", "y"])),
         ["{tmp}/in.parquet", "id column 'id' has empty (null) values"]),
    Case("float-id", lambda t: _do(_parquet(t, id=[1.5, 2.5], prompt=["x", "y"])),
         ["{tmp}/in.parquet", "id column 'id' has type double"]),
    Case("no-rows", lambda t: _do(_parquet(t, id=pa.array([], pa.string()), prompt=pa.array([], pa.string()))),
         ["{tmp}/in.parquet", "has no rows"]),
    Case("not-parquet", lambda t: _do((t / "in.parquet").write_bytes(b"PAR1 nope")),
         ["{tmp}/in.parquet", "not a readable parquet file"]),
    Case("truncated-parquet", lambda t: _do((t / "in.parquet").write_bytes(
        _ok_parquet(t).read_bytes()[:200])), ["{tmp}/in.parquet", "not a readable parquet file"]),
    Case("gzipped-parquet", lambda t: _do((t / "in.parquet").write_bytes(
        gzip.compress(_ok_parquet(t).read_bytes()))), ["{tmp}/in.parquet", "gzip-compressed file"]),
    Case("zstd-parquet", lambda t: _do((t / "in.parquet").write_bytes(
        pa.compress(_ok_parquet(t).read_bytes(), codec="zstd", asbytes=True))),
         ["{tmp}/in.parquet", "zstd-compressed file"]),
    Case("missing-input", lambda t: {"input": str(t / "nope.parquet")}, ["{tmp}/nope.parquet", "does not exist"]),
    Case("empty-folder", lambda t: _do((t / "data").mkdir(), input=str(t / "data")),
         ["{tmp}/data", "holds no *.parquet"]),
    Case("folder-schemas-differ", _different_schemas, ["{tmp}/data/b.parquet", "different schema"]),
    Case("missing-id-column", lambda t: _do(_ok_parquet(t), id_column="uid"),
         ["{tmp}/in.parquet", "column 'uid' is missing"]),
    Case("missing-kept-column", lambda t: _do(_ok_parquet(t), input_columns=["id", "nope"]),
         ["{tmp}/in.parquet", "column 'nope' is missing"]),
    Case("output-collision", lambda t: _do(_parquet(t, id=["a"], prompt=["x"], text=["t"])),
         ["{tmp}/in.parquet", "column 'text' would collide"]),
    Case("messages-wrong-type", lambda t: _do(_parquet(t, id=["a"], msgs=[3]), job_kwargs={"messages_column": "msgs"}),
         ["{tmp}/in.parquet", "column 'msgs' has type int64"]),
    Case("missing-sampling-column", lambda t: _do(
        _ok_parquet(t), job_kwargs={"sampling_column": "params"}), ["{tmp}/in.parquet", "column 'params' is missing"]),
    Case("embedding-missing-text", lambda t: _do(_ok_parquet(t), job="embedding"),
         ["{tmp}/in.parquet", "column 'text' is missing"]),
    # ---- names the output owns
    Case("schema-field-status", lambda t: _schema(t, "answer", "status"),
         ["response_schema {tmp}/schema.json: field(s) 'status' would clash", "status, error, http_status",
          "reserved"]),
    Case("schema-field-tokens", lambda t: _schema(t, "prompt_tokens", "attempts"),
         ["field(s) 'prompt_tokens', 'attempts' would clash", "_response are reserved"]),
    Case("input-column-status", lambda t: _do(_parquet(t, id=["a"], prompt=["x"], status=["new"])),
         ["input {tmp}/in.parquet: column(s) 'status' would clash", "reserved", "input_columns"]),
    Case("id-column-error", lambda t: _do(_parquet(t, error=["a"], prompt=["x"]), id_column="error"),
         ["input {tmp}/in.parquet: column(s) 'error' would clash"]),
    Case("job-output-error", lambda t: _do(_ok_parquet(t), job="test_bad_inputs:ErrorOutputJob"),
         ["job test_bad_inputs:ErrorOutputJob: output(s) 'error' would clash", "reserved"]),
    # ---- JSONL inputs
    Case("jsonl-not-json", lambda t: _jsonl(t, _jsonl_bytes(1) + b"{oops\n"),
         ["{tmp}/in.jsonl", "line 2 is not JSON"]),
    Case("jsonl-no-custom-id", lambda t: _jsonl(t, b'{"body": {}}\n'),
         ["{tmp}/in.jsonl", "line 1", "needs 'custom_id'"]),
    Case("jsonl-body-not-object", lambda t: _jsonl(t, b'{"custom_id": "a", "body": "hi"}\n'),
         ["{tmp}/in.jsonl", "line 1", "'body' object"]),
    Case("jsonl-duplicate-ids", lambda t: _jsonl(t, _jsonl_bytes(2) + _jsonl_bytes(1)),
         ["{tmp}/in.jsonl", "id column 'custom_id'", "duplicated", "'req-0'"]),
    Case("jsonl-empty", lambda t: _jsonl(t, b"\n\n"), ["{tmp}/in.jsonl", "has no rows"]),
    Case("jsonl-zstd", lambda t: _jsonl(t, pa.compress(_jsonl_bytes(), codec="zstd", asbytes=True)),
         ["{tmp}/in.jsonl", "zstd-compressed"]),
    Case("jsonl-bzip2", lambda t: _jsonl(t, bz2.compress(_jsonl_bytes()), "in.jsonl.gz"),
         ["{tmp}/in.jsonl.gz", "bzip2-compressed"]),
    Case("jsonl-xz", lambda t: _jsonl(t, lzma.compress(_jsonl_bytes())), ["{tmp}/in.jsonl", "xz-compressed"]),
    Case("jsonl-gzip-truncated", _truncated_gzip, ["{tmp}/in.jsonl.gz", "gzip stream is damaged at line"]),
    Case("jsonl-gzip-bad-line", _gzip_bad_line, ["{tmp}/in.jsonl.gz", "line 3 is not JSON"]),
    Case("jsonl-is-a-folder", lambda t: _do(
        (t / "in.jsonl").mkdir(), input=str(t / "in.jsonl"), id_column=None), ["{tmp}/in.jsonl", "is not a file"]),
    # ---- output locations
    Case("output-is-input", lambda t: _output(t, t / "in.parquet"),
         ["{tmp}/in.parquet", "is the input", "overwrite the input"]),
    Case("output-is-input-via-symlink", _symlink_to_input, ["{tmp}/alias.parquet", "is the input"]),
    Case("output-is-file-in-input-folder", lambda t: {"input": str(_folder_input(t)),
                                                      "output": str(t / "data" / "a.parquet")},
         ["{tmp}/data/a.parquet", "is the input"]),
    Case("output-inside-input-folder", lambda t: {"input": str(_folder_input(t)),
                                                  "output": str(t / "data" / "out.parquet")},
         ["{tmp}/data/out.parquet", "inside the input folder {tmp}/data"]),
    Case("output-deep-inside-input-folder", lambda t: {"input": str(_folder_input(t)),
                                                       "output": str(t / "data" / "x" / "out.parquet")},
         ["{tmp}/data/x/out.parquet", "inside the input folder"]),
    Case("input-inside-output", lambda t: _output(t, t), ["{tmp}/in.parquet", "is inside the output {tmp}"]),
    Case("output-is-a-folder", lambda t: _output(t, t / "res", _=(t / "res").mkdir()),
         ["{tmp}/res", "existing folder"]),
    Case("output-parent-is-a-file", lambda t: _output(t, t / "f" / "o.parquet", _=(t / "f").write_text("x")),
         ["{tmp}/f/o.parquet", "parent {tmp}/f is a file"]),
    Case("output-grandparent-is-a-file", lambda t: _output(
        t, t / "f" / "sub" / "o.parquet", _=(t / "f").write_text("x")), ["{tmp}/f/sub/o.parquet", "{tmp}/f is a file"]),
    Case("output-unwritable", _unwritable, ["out.parquet", "cannot be written"]),
    Case("output-folder-is-a-file", lambda t: _output(t, f"{t}/results/", _=(t / "results").write_text("x")),
         ["{tmp}/results/ names a folder", "{tmp}/results is a file"]),
    Case("output-is-job-spec", lambda t: _output(t, t / "job" / "spec.json"),
         ["{tmp}/job/spec.json", "job folder's own files"]),
    Case("output-is-job-input-index", lambda t: _output(t, t / "job" / "input.json"),
         ["{tmp}/job/input.json", "job folder's own files"]),
    Case("output-in-ledger", lambda t: _output(t, t / "job" / "shards" / "x.parquet"),
         ["{tmp}/job/shards/x.parquet", "job folder's own files"]),
    # ---- the spec itself
    Case("spec-bad-concurrency", lambda t: _do(_ok_parquet(t), concurrency=0),
         ["{tmp}/job/spec.json", "is invalid", "concurrency"]),
    Case("spec-bad-max-failed-fraction", lambda t: _do(_ok_parquet(t), max_failed_fraction=2),
         ["{tmp}/job/spec.json", "max_failed_fraction"]),
    Case("spec-unknown-job", lambda t: _do(_ok_parquet(t), job="nope_mod:Nope"),
         ["job 'nope_mod:Nope'", "cannot import module 'nope_mod'"]),
]  # fmt: skip


def _snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every file and folder under ``root`` (but ``skip``), with its bytes' hash."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            continue
        for d in dirnames:
            found[str(here / d)] = "dir"
        for f in filenames:
            p = here / f
            found[str(p)] = "link" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return found


def test_corpus_has_enough_cases() -> None:
    assert len(CASES) >= 35 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_corpus(tmp_path: Path, stub, caplog, own_signals, case: Case) -> None:
    fields = case.build(tmp_path)
    spec = write_spec(tmp_path, endpoints=[stub.url], **fields)
    before_files = _snapshot(tmp_path, tmp_path / "job")
    before = requests(stub)
    caplog.set_level(logging.ERROR, logger="prefect_swarm.jobs")
    code = job_main(["--spec", str(spec), "--shard-id", "0", "--nshards", "1"])
    message = caplog.text
    assert code == 2, message
    for part in case.expect:
        assert part.format(tmp=tmp_path) in message, message
    assert requests(stub) == before
    assert _snapshot(tmp_path, tmp_path / "job") == before_files  # input intact, no output, no temp file
    assert not JobPaths(tmp_path / "job").shard(0).parts()


CLI_CASES = ["output-is-input", "prompt-all-null", "jsonl-gzip-truncated", "output-inside-input-folder"]


@pytest.fixture
def stub_swarm() -> Iterator[str]:
    """One stub-engine replica on the local backend; yields the swarm's name."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    cfg = SwarmConfig.model_validate(stub_swarm_config("bad-inputs-stub"))
    with Swarm(cfg):
        yield cfg.name


@pytest.mark.parametrize("name", CLI_CASES)
def test_bad_input_through_cli_submit(tmp_path: Path, stub_swarm: str, name: str) -> None:
    """`prefect-swarm job submit` on a stub swarm refuses the same inputs: exit 2, the file named, nothing sent."""
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app

    case = next(c for c in CASES if c.name == name)
    fields = case.build(tmp_path)
    spec = {"input": str(tmp_path / "in.parquet"), "output": str(tmp_path / "job-out.parquet"), "id_column": "id"}
    spec_file = tmp_path / "spec-in.json"
    spec_file.write_text(json.dumps({**spec, **fields}))
    before_files = _snapshot(tmp_path, tmp_path / "nothing")
    res = CliRunner().invoke(app, ["job", "submit", "-n", stub_swarm, "--spec", str(spec_file)])
    text = res.output + (str(res.exception) if res.exception and not isinstance(res.exception, SystemExit) else "")
    assert res.exit_code == 2, text
    assert all(part.format(tmp=tmp_path) in text for part in case.expect), text
    assert _snapshot(tmp_path, tmp_path / "nothing") == before_files
