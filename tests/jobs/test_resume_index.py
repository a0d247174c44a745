"""Resume and status in O(shards), bounded memory: the ledger's progress index and compaction, the input's
metadata kept with the job (status reads no footer), the JSONL line index, the partitioned id check."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, open_ledger, write_spec

from prefect_swarm.exceptions import DatasetError
from prefect_swarm.jobs.checkpoint.ledger import (
    DoneRows,
    LocalShard,
    RowResult,
    ShardLedger,
    latest_positions,
    read_ledger,
)
from prefect_swarm.jobs.checkpoint.plan import job_progress, pending_shards
from prefect_swarm.jobs.rows.input import InputDataset, open_input
from prefect_swarm.jobs.run import main as job_main
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import ShardPaths

START, END = 1000, 1600
NEVER = 10**9
"""A ``compact_every`` no ledger here reaches: a reference ledger that keeps every part."""


def _ledger(root: Path, *, retry_failed: bool = False, start: int = START, end: int = END, **kw: Any) -> ShardLedger:
    led: ShardLedger = open_ledger(root, start, end, retry_failed=retry_failed, **kw)
    return led


def _add(led: ShardLedger, row: int, status: str = "ok") -> None:
    err = None if status == "ok" else "boom"
    led.add(RowResult(row, f"id{row}", status, err, 200, 3, 4, 1.5, 1, {"text": f"t{row}-{status}"}))


def _state(led: ShardLedger) -> tuple:
    pending = led.pending(0, led.total).tolist()
    return (led.n_done, led.n_failed, led.prompt_tokens, led.completion_tokens, sorted(led.errors), pending, led.seq)


def _run_rows(led: ShardLedger, order: list[tuple[int, str]], every: int) -> None:
    for k, (row, status) in enumerate(order, 1):
        _add(led, row, status)
        if k % every == 0:
            led.flush_in_background()
    led.flush()


def _shuffled_order(n: int, seed: int) -> list[tuple[int, str]]:
    """Rows finishing nearly in order (a window of 16 in flight), a few errors, some retried to ok later."""
    rng = random.Random(seed)
    rows = list(range(START, START + n))
    order = []
    for i in range(0, n, 16):
        window = rows[i : i + 16]
        rng.shuffle(window)
        order += [(r, "error" if r % 37 == 0 else "ok") for r in window]
    order += [(r, "ok") for r in range(START, START + n) if r % 74 == 0]  # half the errors answered on a retry
    return order


def test_done_rows_keep_a_position_and_the_few_rows_past_it() -> None:
    rows = DoneRows(10)
    assert rows.add(2) and rows.add(0) and not rows.add(0)
    assert (rows.upto, rows.beyond, len(rows)) == (1, {2}, 2)
    assert rows.add(1) and (rows.upto, rows.beyond) == (3, set())
    assert rows.add_many(np.array([5, 3, 3, 9, 2])) == 3
    assert (rows.upto, rows.beyond, len(rows)) == (4, {5, 9}, 6)
    assert rows.missing(0, 10).tolist() == [4, 6, 7, 8]
    assert rows.missing(2, 6).tolist() == [2]


def test_resume_reads_the_index_and_only_the_parts_after_it(tmp_path: Path) -> None:
    order = _shuffled_order(300, seed=1)
    led = _ledger(tmp_path / "a")
    _run_rows(led, order, every=7)
    assert len(led.seen.beyond) == 0 and led.seen.upto == 300
    resumed = _ledger(tmp_path / "a")
    assert resumed.replayed == 0  # the index covers every part
    assert _state(resumed) == _state(led)
    # the same ledger without its index: every part replayed, the same state
    (tmp_path / "a" / "index.json").unlink()
    full = _ledger(tmp_path / "a")
    assert full.replayed == len(led.paths.parts()) > 1 and _state(full) == _state(led)
    assert full.n_failed == sum(1 for r in range(START, START + 300) if r % 37 == 0 and r % 74 != 0)


def test_a_kill_between_a_part_and_the_index_is_replayed_from_the_parts(tmp_path: Path) -> None:
    order = _shuffled_order(400, seed=2)
    led = _ledger(tmp_path / "k")
    for k, (row, status) in enumerate(order[:200], 1):
        _add(led, row, status)
        if k % 50 == 0:
            led.flush()
    old_index = (tmp_path / "k" / "index.json").read_text()
    for row, status in order[200:260]:  # finished after the index: out of order past the position
        _add(led, row, status)
    led.flush()
    (tmp_path / "k" / "index.json").write_text(old_index)  # as if killed after the part, before its index
    resumed = _ledger(tmp_path / "k")
    assert _state(resumed) == _state(led)
    done = {r for r, _ in order[:260]}
    assert resumed.first_pending() == min(r for r in range(START, END) if r not in done) - START


def test_retry_failed_sends_the_error_rows_again_from_the_first_of_them(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "r")
    for row in range(START, END):
        _add(led, row, "error" if row in (START + 5, START + 300) else "ok")
    led.flush("done")
    again = _ledger(tmp_path / "r", retry_failed=True)
    assert not again.complete and again.n_left == 2 and again.first_pending() == 5
    assert again.pending(0, 100).tolist() == [5] and again.pending(250, 350).tolist() == [50]
    _add(again, START + 5)
    assert again.pending(0, 100).tolist() == [] and again.first_pending() == 300
    _add(again, START + 300)
    assert again.complete and again.n_failed == 0


def _latest(root: Path) -> dict[int, str]:
    table = read_ledger(ShardPaths(root))
    assert table is not None
    pos = latest_positions(table.column("_row").to_numpy(), START, END)
    texts = table.column("text").to_pylist()
    return {START + i: texts[p] for i, p in enumerate(pos.tolist()) if p >= 0}


def test_compaction_keeps_the_part_count_bounded_and_each_rows_latest_write(tmp_path: Path) -> None:
    order = _shuffled_order(320, seed=3)
    led = _ledger(tmp_path / "c", compact_every=4)
    ref = _ledger(tmp_path / "ref", compact_every=NEVER)
    _run_rows(led, order, every=5)
    _run_rows(ref, order, every=5)
    assert len(ref.paths.parts()) > 60 and led.compactions > 10
    assert len(led.paths.parts()) <= 4
    assert _latest(tmp_path / "c") == _latest(tmp_path / "ref")
    merged = pq.read_table(led.paths.parts()[0], columns=["_row"]).column("_row").to_numpy()
    assert merged.size > 250 and np.unique(merged).size == merged.size  # superseded writes dropped
    assert _state(_ledger(tmp_path / "c", compact_every=4)) == _state(_ledger(tmp_path / "ref", compact_every=NEVER))


class _KilledAtDelete(LocalShard):
    """The shard's folder, where a delete is killed once ``armed``: as a kill after a merged part is
    written, before the parts it replaces are deleted."""

    armed = False

    def delete(self, names: list[str]) -> None:
        if self.armed:
            raise KeyboardInterrupt
        super().delete(names)


def test_a_kill_in_the_middle_of_a_compaction_loses_nothing(tmp_path: Path) -> None:
    order = _shuffled_order(120, seed=4)
    store = _KilledAtDelete(ShardPaths(tmp_path / "m"))
    led = _ledger(tmp_path / "m", compact_every=4, store=store)
    ref = _ledger(tmp_path / "ref", compact_every=NEVER)
    _run_rows(ref, order, every=10)
    for k, (row, status) in enumerate(order[:39], 1):
        _add(led, row, status)
        if k % 10 == 0:
            led.flush()
    store.armed = True
    for row, status in order[39:40]:
        _add(led, row, status)
    with pytest.raises(KeyboardInterrupt):
        led.flush()
    left = [p.name for p in led.paths.parts()]
    assert len(left) == 4  # merged into the last part number, the others still there
    resumed = _ledger(tmp_path / "m", compact_every=4)
    _run_rows(resumed, order[40:], every=10)
    assert _latest(tmp_path / "m") == _latest(tmp_path / "ref")
    assert _state(_ledger(tmp_path / "m"))[:5] == _state(_ledger(tmp_path / "ref"))[:5]


# ---------------------------------------------------------------- input metadata, polling


@contextmanager
def _replaced(files: dict[Path, bytes]) -> Iterator[None]:
    """Each file of ``files`` holds the bytes given (its length) while the block runs, its mtime kept:
    the kept metadata of the input still describes it, and a read of it sees the new bytes."""
    saved = {f: (f.read_bytes(), f.stat()) for f in files}
    try:
        for f, data in files.items():
            assert len(data) == len(saved[f][0])
            f.write_bytes(data)
            os.utime(f, ns=(saved[f][1].st_atime_ns, saved[f][1].st_mtime_ns))
        yield
    finally:
        for f, (data, st) in saved.items():
            f.write_bytes(data)
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def _unreadable(*files: Path) -> AbstractContextManager[None]:
    """``files`` hold zeros while the block runs (same size and mtime): a read of one's footer fails,
    so a block that succeeds read none of them."""
    return _replaced({f: bytes(f.stat().st_size) for f in files})


def test_status_polls_read_no_input_footer(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(6):
        make_dataset(folder / f"f{k}.parquet", 50, row_group=10, ids=[f"f{k}-{i}" for i in range(50)])
    spec = JobSpec.load(write_spec(tmp_path, input=str(folder), shards=3))
    first = open_input(spec)  # the job's one read of the footers (validate_input does this)
    assert spec.paths.input_index.exists() and first.num_rows == 300
    files = sorted(folder.glob("*.parquet"))
    with _unreadable(*files):  # a footer read would fail
        for _ in range(3):
            progress = job_progress(spec)
            assert pending_shards(spec) == [0, 1, 2]
        ds = open_input(spec)
    assert progress["total"] == 300 and [s["total"] for s in progress["shards"]] == [100, 100, 100]
    # a shard reads only its own files' footers
    with _unreadable(*(f for f in files if f.name not in ("f2.parquet", "f3.parquet"))):
        got = [i for _, b in ds.iter_range(100, 200, ["id"], 64) for i in b.column(0).to_pylist()]
    assert got == [f"f{k}-{i}" for k in (2, 3) for i in range(50)]
    # a changed input is read afresh: the kept metadata is for its old sizes and mtimes
    make_dataset(folder / "f5.parquet", 70, row_group=10, ids=[f"n{i}" for i in range(70)])
    assert open_input(spec).num_rows == 320 and json.loads(spec.paths.input_index.read_text())["num_rows"] == 320


def test_sizing_and_the_pilot_take_the_kept_metadata(tmp_path: Path) -> None:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.pilot import pilot_spec
    from prefect_swarm.sizing import auto_shards, size_for_swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(6):
        make_dataset(folder / f"f{k}.parquet", 1000, row_group=250, ids=[f"f{k}-{i}" for i in range(1000)])
    spec = JobSpec.load(write_spec(tmp_path, input=str(folder)))  # shards left to the swarm
    open_input(spec)  # the job's one read of the footers
    cfg = SwarmConfig.model_validate(stub_swarm_config("sized", replicas=2, engine={"capacity": 4096}))
    assert auto_shards(cfg) == 3 and auto_shards(cfg, 2_500) == 2  # the row count matters here
    files = sorted(folder.glob("*.parquet"))
    with _unreadable(*files):  # a footer read would fail
        assert size_for_swarm(spec, cfg).shards == 3
    no_job = spec.model_copy(update={"input": str(folder / "f0.parquet"), "job_dir": None})
    (tmp_path / "pilot").mkdir()
    with _unreadable(*files[1:]):
        assert size_for_swarm(no_job, cfg).shards == 1  # no job folder yet: its footers are read
        # only the rows it copies (the first file) and the copy it checks; no footer of f1..f5
        pilot, total = pilot_spec(spec, 300, tmp_path / "pilot")
    assert total == 6000 and pq.read_metadata(pilot.input).num_rows == 300


def test_a_jsonl_input_is_indexed_once_and_each_shard_seeks_to_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"

    def line(i: int) -> str:
        return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"i": i}})

    lines = []
    for i in range(95):
        lines.append(line(i))
        if i % 13 == 0:
            lines.append("")  # blank lines do not count as rows
    path.write_text("\n".join(lines) + "\n")
    spec = JobSpec.load(write_spec(tmp_path, input=str(path), id_column="custom_id", output=str(tmp_path / "o.jsonl")))
    ds = InputDataset.for_job(path, spec.paths.input_index, offset_every=10)
    assert ds.num_rows == 95 and len(ds.line_offsets) == 10
    with _unreadable(path):  # a recount would find one line of zeros
        again = open_input(spec)
    assert again.num_rows == 95  # the kept index, not a recount
    got = [c for _, b in again.iter_range(37, 64, ["custom_id"], 8) for c in b.column(0).to_pylist()]
    assert got == [f"c{i}" for i in range(37, 64)]
    # seeked, not read from line 0: with the lines before row 80 blanked, read from the start the rows would shift
    text, row80 = path.read_bytes(), again.line_offsets[8]
    assert row80[0] == 80
    blanked = re.sub(rb"[^\n]", b" ", text[: row80[1]]) + text[row80[1] :]
    with _replaced({path: blanked}):
        first = next(again.iter_range(85, 95, None, 8))
    assert first[0] == 85 and first[1].column("custom_id").to_pylist() == [f"c{i}" for i in range(85, 93)]
    # a damaged line past the seek point is named by its line number in the file
    lines[lines.index(line(90))] = "{oops"
    path.write_text("\n".join(lines) + "\n")
    fresh = InputDataset(path, offset_every=10)
    assert fresh.line_offsets[-1][0] == 90
    with pytest.raises(DatasetError, match=f"line {lines.index('{oops') + 1} is not JSON"):
        list(fresh.iter_range(85, 95, None, 8))


def test_gzip_jsonl_keeps_no_offsets_and_reads_correctly(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl.gz"
    rows = [json.dumps({"custom_id": f"c{i}", "body": {"i": i}}) for i in range(30)]
    path.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    ds = InputDataset(path)
    assert ds.compression == "gzip" and ds.line_offsets[:1] == []
    got = [c for _, b in ds.iter_range(12, 20, ["custom_id"], 4) for c in b.column(0).to_pylist()]
    assert got == [f"c{i}" for i in range(12, 20)]


# ---------------------------------------------------------------- bounded id check


def _checked_ids(ds: InputDataset, caplog: pytest.LogCaptureFixture, **kw: Any) -> tuple[int, ...]:
    """Check ``ds``'s ids; return what the check says it held: (ids, partitions, most hashes at once)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="prefect_swarm.jobs.rows.input"):
        ds.check_unique_ids("id", **kw)
    said = re.search(r"checked (\d+) ids of .* in (\d+) partition\(s\), at most (\d+) in memory", caplog.text)
    assert said, caplog.text
    return tuple(int(g) for g in said.groups())


def test_the_partitioned_id_check_finds_duplicates_and_only_them(tmp_path: Path, caplog) -> None:
    n = 5000
    ids = [f"id-{i}" for i in range(n)]
    clean = make_dataset(tmp_path / "clean.parquet", n, ids=ids)
    ds = InputDataset(clean)
    checked, parts, most = _checked_ids(ds, caplog, partition_rows=600)
    assert (checked, parts) == (n, 9) and most < 1200  # one partition in memory at a time
    dup = make_dataset(tmp_path / "dup.parquet", n, ids=[*ids[:-1], "id-1234"])
    with pytest.raises(DatasetError, match=r"1 duplicated values \(e.g. 'id-1234'\)"):
        InputDataset(dup).check_unique_ids("id", partition_rows=600)
    ints = make_dataset(tmp_path / "ints.parquet", n, ids=[*range(n - 1), 17])
    with pytest.raises(DatasetError, match=r"duplicated values \(e.g. 17\)"):
        InputDataset(ints).check_unique_ids("id", partition_rows=600)
    assert _checked_ids(InputDataset(clean), caplog) == (n, 1, n)  # small input: one in-memory sort


def test_a_real_shard_resumes_from_the_index(tmp_path: Path, stub, own_signals) -> None:
    """A job process stopped half-way, then rerun: the rerun reads the index and sends only the rest."""
    make_dataset(tmp_path / "in.parquet", 600, row_group=100)
    spec_path = write_spec(tmp_path, endpoints=[stub.url], checkpoint_every=50)
    spec = JobSpec.load(spec_path)
    root = spec.paths.shard(0).root
    assert job_main(["--spec", str(spec_path), "--shard-id", "0", "--nshards", "1"]) == 0
    index = json.loads((root / "index.json").read_text())
    assert index["upto"] == 600 and index["beyond"] == [] and index["next_part"] == len(list(root.glob("part-*")))
    # drop the last two parts and rewind the index as a kill -9 would have left them
    parts = sorted(root.glob("part-*.parquet"))
    kept_rows = sum(pq.read_metadata(p).num_rows for p in parts[:-2])
    for p in parts[-2:]:
        p.unlink()
    (root / "DONE").unlink()
    index.update(upto=kept_rows - 50, next_part=len(parts) - 3)  # an index one part behind
    (root / "index.json").write_text(json.dumps(index))
    before = stub.stats().get("requests", 0)
    assert job_main(["--spec", str(spec_path), "--shard-id", "0", "--nshards", "1"]) == 0
    assert stub.stats().get("requests", 0) - before == 600 - kept_rows
    table = read_ledger(ShardPaths(root), ["_row"])
    assert table is not None and sorted(set(table.column("_row").to_pylist())) == list(range(600))
    shutil.rmtree(root)


def test_append_part_writes_what_a_flush_of_the_same_rows_writes(tmp_path: Path) -> None:
    """The bulk path (benchmarks' synthetic ledgers): the same parts, index and state as added rows."""
    order = _shuffled_order(200, seed=5)
    ref = _ledger(tmp_path / "ref")
    _run_rows(ref, order, every=50)
    bulk = _ledger(tmp_path / "bulk")
    parts = [pq.read_table(p) for p in ref.paths.parts()]
    for k, table in enumerate(parts):
        bulk.append_part(table, index=k < len(parts) - 1)  # the last one as a kill -9 leaves it: not indexed
    assert _state(bulk) == _state(ref)
    index = json.loads((tmp_path / "bulk" / "index.json").read_text())
    assert index["next_part"] == len(parts) - 1
    assert _state(_ledger(tmp_path / "bulk")) == _state(ref)  # the unindexed part replayed on resume


def test_an_index_that_counts_a_missing_part_is_not_trusted(tmp_path: Path) -> None:
    """A part the index counts is gone (deleted by hand, or a kill between a compaction's deletes and
    its index): the resume replays what is there, so the rows of the lost part are sent again."""
    led = _ledger(tmp_path)
    _run_rows(led, [(r, "ok") for r in range(START, START + 100)], every=50)
    first = sorted(ShardPaths(tmp_path).root.glob("part-*"))[0]
    lost = set(pq.read_table(first, columns=["_row"]).column("_row").to_pylist())
    first.unlink()
    again = _ledger(tmp_path)
    assert again.n_done == 100 - len(lost)
    assert set(again.pending(0, again.total).tolist()) >= {r - START for r in lost}
