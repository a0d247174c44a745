"""prefect_swarm.testing.ports: the free port blocks tests give their swarms."""

from __future__ import annotations

import socket

import pytest

from prefect_swarm.testing.ports import _ephemeral_start, free_port_block


@pytest.mark.parametrize("workers", [2, 4, 7])
def test_xdist_workers_pick_from_parts_of_the_range_that_do_not_overlap(
    monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Each worker of ``pytest -n N`` picks from its own part: two tests running at once on two
    workers cannot both be handed one block (each then binds it seconds later)."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    seen: dict[int, set[int]] = {}
    for k in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{k}")
        seen[k] = {free_port_block(3) for _ in range(40)}
    parts = [(min(s), max(s) + 2) for s in seen.values()]
    assert all(low >= 20000 and high < _ephemeral_start() for low, high in parts)
    for k, (low, high) in enumerate(parts):
        for other, (olow, ohigh) in enumerate(parts):
            assert k == other or high < olow or ohigh < low, (parts, k, other)


def test_outside_xdist_the_whole_range_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")  # no worker name: not a worker
    picked = [free_port_block(2) for _ in range(40)]
    middle = (20000 + _ephemeral_start()) // 2
    assert 20000 <= min(picked) < middle < max(picked) < _ephemeral_start() - 1


def test_a_taken_port_is_never_handed_out() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"no block of 1 free ports found between {port} and {port + 2}"):
            free_port_block(1, start=port, end=port + 2)  # only ``port`` can be a base here
