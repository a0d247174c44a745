"""The shard ledger's checkpoints: background writes keep part order, and a failed write is never forgotten."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from prefect_swarm.jobs.checkpoint.ledger import LocalShard, RowResult, ShardLedger, read_ledger
from prefect_swarm.paths import ShardPaths


class FullDisk(LocalShard):
    """The shard's folder, on a disk that is full while ``full`` is set: a part's write fails."""

    full = False

    def write_part(self, seq: int, data: bytes) -> None:
        if self.full:
            raise OSError("disk full")
        super().write_part(seq, data)


def _ledger(root: Path, store: LocalShard | None = None) -> ShardLedger:
    led = ShardLedger(
        ShardPaths(root),
        shard=0,
        nshards=1,
        start=100,
        end=110,
        fingerprint="fp",
        details={},
        outputs={"text": pa.string()},
        store=store,
    )
    led.open()
    return led


def _add(led: ShardLedger, row: int, status: str = "ok") -> None:
    err = None if status == "ok" else "boom"
    led.add(RowResult(row, f"id{row}", status, err, 200, 3, 4, 1.5, 1, {"text": f"t{row}"}))


def test_background_flushes_write_parts_in_order_like_a_plain_flush(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "bg")
    for chunk in ([100, 101, 102], [103, 104], [105]):
        for row in chunk:
            _add(led, row, "error" if row == 104 else "ok")
        led.flush_in_background()
    led.flush("done")  # waits for the pending write first
    ref = _ledger(tmp_path / "sync")
    for chunk in ([100, 101, 102], [103, 104], [105]):
        for row in chunk:
            _add(ref, row, "error" if row == 104 else "ok")
        ref.flush()
    assert [p.name for p in led.paths.parts()] == [p.name for p in ref.paths.parts()]
    got, want = read_ledger(led.paths), read_ledger(ref.paths)
    assert got is not None and want is not None and got.equals(want)
    assert got.column("_row").to_pylist() == list(range(100, 106))
    assert got.column("text").to_pylist()[0] == "t100"
    resumed = _ledger(tmp_path / "bg")
    assert resumed.n_done == 6 and resumed.n_failed == 1 and resumed.seq == 3


def test_a_failed_background_write_is_raised_by_every_later_flush(tmp_path: Path) -> None:
    disk = FullDisk(ShardPaths(tmp_path / "j"))
    led = _ledger(tmp_path / "j", disk)
    _add(led, 100)
    disk.full = True
    led.flush_in_background()
    with pytest.raises(OSError, match="disk full"):
        led.join()
    disk.full = False  # the disk works again: the lost part must still be reported
    _add(led, 101)
    for _ in range(2):
        with pytest.raises(OSError, match="disk full"):
            led.flush()
    with pytest.raises(OSError, match="disk full"):
        led.mark_done()
    assert not led.paths.done_marker.exists()


def test_a_failed_plain_flush_keeps_its_rows_for_the_next_one(tmp_path: Path) -> None:
    disk = FullDisk(ShardPaths(tmp_path / "j"))
    led = _ledger(tmp_path / "j", disk)
    _add(led, 100)
    disk.full = True
    with pytest.raises(OSError, match="disk full"):
        led.flush()
    disk.full = False
    _add(led, 101)
    led.flush()
    table = read_ledger(led.paths)
    assert table is not None and table.column("_row").to_pylist() == [100, 101]
    assert [p.name for p in led.paths.parts()] == ["part-000000.parquet"]
