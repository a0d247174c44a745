"""Output as a dataset (an output name ending with '/'): part files by shard, a manifest, _SUCCESS last.

A commit killed with SIGKILL at random points and rerun holds each row exactly once; a reader
during a commit sees the previous complete output or the new one; a rerun after the commit
sends nothing; a folder holding another job's dataset, or a file of the folder's name, is refused
before any request.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, requests, run_job, write_spec
from test_commit import _fake_ledger

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.checkpoint.ledger import ledger_schema
from prefect_swarm.jobs.checkpoint.plan import pending_shards
from prefect_swarm.jobs.rows import output
from prefect_swarm.jobs.rows.commit import commit_output, shard_token, write_shard_output
from prefect_swarm.jobs.shard import validate_input
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import TEMP_SUFFIX
from prefect_swarm.testing.waiting import wait_until

N = 6000


@pytest.fixture
def job(tmp_path: Path) -> tuple[JobSpec, dict[int, dict[str, Any]]]:
    make_dataset(tmp_path / "in.parquet", N, row_group=700)
    spec = JobSpec.load(write_spec(tmp_path, shards=3, endpoints=["http://127.0.0.1:9"], output=f"{tmp_path}/out/"))
    return spec, _fake_ledger(spec, N, seed=7)


def _check_once(out: Path, latest: dict[int, dict[str, Any]]) -> pa.Table:
    """The dataset holds each input row exactly once, with its last write; files and manifest agree."""
    table = pds.dataset(out, format="parquet").to_table().sort_by(output.POSITION_COLUMN)
    assert table.column(output.POSITION_COLUMN).to_pylist() == list(range(N))
    assert table.column("id").to_pylist() == [f"r{i:06d}" for i in range(N)]
    assert table.column("text").to_pylist() == [latest[i]["text"] for i in range(N)]
    manifest = json.loads((out / output.MANIFEST).read_text())
    parts = sorted(p.name for p in out.iterdir() if p.name.startswith("part-"))
    assert parts == sorted(f["path"] for f in manifest["files"])
    for f in manifest["files"]:
        data = (out / f["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (f["bytes"], f["sha256"])
    assert manifest["rows"] == N and (out / output.SUCCESS).exists()
    return table


def test_dataset_layout_manifest_and_readers(job, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, latest = job
    m = commit_output(spec, bucket_rows=300, parts=output.PartSizes(60_000, 700))  # several files per shard
    out = Path(spec.output)
    table = _check_once(out, latest)
    inside = json.loads((out / output.MANIFEST).read_text())
    assert (inside["job_id"], inside["fingerprint"], inside["commit"]) == (spec.job_id, m["fingerprint"], m["commit"])
    assert m["files"] == len(inside["files"]) > 3 and m["rows"] == N
    names = [f["path"] for f in inside["files"]]
    assert names == sorted(names) and names[0] == output.part_name(0, 0, shard_token(spec, 0, m["fingerprint"]))
    # the files in name order are the input order; row groups are gathered, not one per batch
    in_order = pa.concat_tables(pq.read_table(out / n) for n in names)
    assert in_order.column("id").equals(table.column("id"))
    groups = [pq.ParquetFile(out / n).metadata.num_row_groups for n in names]
    assert max(groups) <= 2, groups
    single = pq.read_table(out / names[0])
    assert single.schema.names[-1] == output.POSITION_COLUMN
    import pandas as pd

    assert len(pd.read_parquet(out)) == N  # pandas reads the folder as one table
    assert commit_output(spec) == m  # unchanged ledger: nothing written again
    assert not list(out.parent.glob(f".out.*{TEMP_SUFFIX}"))


def test_shards_write_their_files_and_the_commit_only_publishes(job) -> None:
    """Each finished shard writes its own part files (as its job process does); the commit then reads
    no ledger row and rewrites no byte: it links the files into place and writes the manifest (each
    published file is the shard's own inode: a merge would have written new ones)."""
    spec, latest = job
    records = [write_shard_output(spec, i) for i in range(spec.shards)]
    assert all(r is not None and r["files"] for r in records)
    m = commit_output(spec)
    out = Path(spec.output)
    _check_once(out, latest)
    written = {f["path"] for r in records if r for f in r["files"]}
    assert {f["path"] for f in json.loads((out / output.MANIFEST).read_text())["files"]} == written
    parts = out.parent / ".out.parts"
    for r in records:  # the published files are the shards' own (hard links), not copies
        assert r is not None
        for f in r["files"]:
            assert (out / f["path"]).stat().st_ino == (parts / r["token"] / f["path"]).stat().st_ino
    assert m["files"] == len(written)


_COMMIT = (
    "import sys\n"
    "from prefect_swarm.jobs.rows import output\n"
    "from prefect_swarm.jobs.rows.commit import commit_output\n"
    "from prefect_swarm.jobs.spec import JobSpec\n"
    "small = output.PartSizes(part_bytes=40_000, row_group_rows=400)\n"
    "commit_output(JobSpec.load(sys.argv[1]), force=sys.argv[2] == 'force', bucket_rows=250, parts=small)\n"
)


def _commit_process(spec: JobSpec, force: bool = False) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", _COMMIT, str(spec.paths.spec), "force" if force else "-"]
    return subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_commit_killed_at_random_points_then_rerun_holds_each_row_once(job) -> None:
    spec, latest = job
    spec.save()
    t0 = time.monotonic()
    assert _commit_process(spec).wait(timeout=120) == 0  # a whole commit, timed (and published once)
    took = time.monotonic() - t0
    out = Path(spec.output)
    _rewrite(spec, latest, "v2")  # a new ledger: the next commits replace the output
    rng = random.Random(11)
    kills = tries = 0
    while kills < 3 and tries < 12:  # a loaded machine makes one commit slower than the next
        tries += 1
        proc = _commit_process(spec)
        wait = rng.uniform(0.1, 0.9) * took
        time.sleep(wait)  # the point: a kill at a random moment of the commit
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        else:  # it published before the kill: the next one gets new answers to publish, and less time
            took = min(took, wait)
            _rewrite(spec, latest, f"v{tries + 2}")
        proc.wait(timeout=60)
        if (out / output.SUCCESS).exists():  # after any kill: the old or the new dataset, whole
            got = pds.dataset(out, format="parquet").to_table()
            assert sorted(got.column(output.POSITION_COLUMN).to_pylist()) == list(range(N))
    assert kills >= 2, f"{tries} commits, {kills} killed; the others published before the kill ({took:.2f} s)"
    commit_output(spec, bucket_rows=250)
    _check_once(out, latest)
    assert not list(out.parent.glob(f".out.*{TEMP_SUFFIX}"))


def _rewrite(spec: JobSpec, latest: dict[int, dict[str, Any]], tag: str, n: int = N) -> None:
    """Append a ledger part to every shard rewriting each of its rows' answers (as a rerun would)."""
    from prefect_swarm.jobs.api import load_job
    from prefect_swarm.jobs.rows.input import shard_range

    schema = ledger_schema(load_job(spec.job, spec.job_kwargs).outputs, keep_raw=False)
    for i in range(spec.shards):
        start, end = shard_range(n, i, spec.shards)
        rows = [{**latest[r], "text": f"{tag} {r}", "status": "ok", "error": None} for r in range(start, end)]
        latest.update({r["_row"]: r for r in rows})
        paths = spec.paths.shard(i)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), paths.part(len(paths.parts())))


def test_a_reader_during_a_commit_sees_the_old_or_the_new_output(job) -> None:
    spec, latest = job
    spec.save()
    commit_output(spec, bucket_rows=250)
    out = Path(spec.output)
    old = [latest[i]["text"] for i in range(N)]
    _rewrite(spec, latest, "v2")
    new = [latest[i]["text"] for i in range(N)]
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                got = pds.dataset(out, format="parquet").to_table().sort_by(output.POSITION_COLUMN)
            except (FileNotFoundError, OSError):  # listed before a swap, opened after: read again
                continue
            texts = got.column("text").to_pylist()
            seen.append("old" if texts == old else "new" if texts == new else f"partial ({got.num_rows} rows)")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert _commit_process(spec).wait(timeout=120) == 0
        wait_until("the reader to see the new output", lambda: seen[-1], until=lambda s: s == "new", timeout_s=30)
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) <= {"old", "new"}, sorted(set(seen))
    assert seen[-1] == "new" and "old" in seen


def test_another_jobs_dataset_or_a_file_of_that_name_is_refused(job, tmp_path: Path) -> None:
    spec, _ = job
    commit_output(spec)
    validate_input(spec)  # its own dataset: a rerun may replace it
    other = spec.model_copy(update={"job_kwargs": {"sampling": {"max_tokens": 99}}})
    with pytest.raises(ConfigError, match=r"holds another job's dataset \(.*out/_manifest.json"):
        validate_input(other)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"names a folder, but .*file is a file"):
        validate_input(spec.model_copy(update={"output": f"{tmp_path}/file/"}))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holding files that are not a dataset's"):
        validate_input(spec.model_copy(update={"output": f"{tmp_path}/mixed/"}))
    with pytest.raises(ConfigError, match="is inside the output folder"):
        validate_input(spec.model_copy(update={"output": f"{tmp_path}/"}))
    with pytest.raises(ValueError, match=r"a folder .* is a parquet dataset"):
        JobSpec.model_validate({**spec.model_dump(), "output_format": "openai-batch"})


def test_a_rerun_after_a_committed_dataset_sends_nothing(tmp_path: Path, stub) -> None:
    make_dataset(tmp_path / "in.parquet", 300)
    spec_file = write_spec(tmp_path, output=f"{tmp_path}/ds/", endpoints=[stub.url])
    before = requests(stub)
    proc = run_job(spec_file)
    assert proc.returncode == 0, proc.stderr
    assert requests(stub) - before == 300
    spec = JobSpec.load(spec_file)
    table = pds.dataset(tmp_path / "ds", format="parquet").to_table()
    assert table.num_rows == 300 and (tmp_path / "ds" / output.SUCCESS).exists()
    assert pending_shards(spec) == []  # the flow and `job submit` bring up no swarm for it
    again = run_job(spec_file)
    assert again.returncode == 0, again.stderr
    assert requests(stub) - before == 300


def test_a_cli_job_lets_go_of_its_swarm_before_the_commit(tmp_path: Path) -> None:
    """`job submit` (waiting): once the last row is answered the job's hold on the swarm is dropped, before
    the commit; a detached job whose rows are all answered holds it no more (its last process may still
    be publishing)."""
    from prefect_swarm import launch
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.holding import dead_owners
    from prefect_swarm.state import StateStore, keep_lease
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    make_dataset(tmp_path / "in.parquet", 200)
    cfg = SwarmConfig.model_validate(stub_swarm_config("let-go", replicas=1, latency_ms=1))
    held_at_commit: list[list[str]] = []

    class Watched(StateStore):
        """The state database, noting the swarm's holders when a commit records its output (the
        commit's record of a job holds its manifest's ``rows``; a progress update holds none)."""

        def update_job(self, job_id: str, **fields: Any) -> Any:
            if "rows" in (fields.get("progress") or {}):
                held_at_commit.append([x.owner for x in self.list_leases("let-go")])
            return super().update_job(job_id, **fields)

    with Swarm(cfg) as swarm:
        store = Watched()
        store.put_lease(keep_lease("let-go"))  # as `up` leaves it: the swarm stays up for the next job
        fields = {"input": str(tmp_path / "in.parquet"), "id_column": "id", "shards": 2}
        spec = JobSpec(output=f"{tmp_path}/a/", auto_commit=False, **fields)
        rec = launch.submit_job(swarm, spec, detach=False, store=store)
        assert rec.status == "SUCCEEDED" and held_at_commit, held_at_commit
        assert not [o for o in held_at_commit[0] if o.startswith("job:")], held_at_commit
        detached = launch.submit_job(swarm, JobSpec(output=f"{tmp_path}/b/", **fields), detach=True)
        leases = [x for x in store.list_leases("let-go") if x.owner == f"job:{detached.id}"]
        assert leases
        wait_until(
            "every shard of the detached job done",
            lambda: pending_shards(JobSpec.model_validate(detached.spec)),
            until=lambda pending: not pending,
            timeout_s=60,
        )
        assert f"job:{detached.id}" in dead_owners(leases, store)
        launch.wait_job(detached.id)
    assert pds.dataset(tmp_path / "b", format="parquet").to_table().num_rows == 200
