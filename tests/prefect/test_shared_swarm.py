"""Two concurrent runs on one swarm, through the real worker: one bring-up, one stop, after both.

Each run holds a lease on the swarm; the first brings it up, the second waits for it and shares
it; whichever ends first only releases its lease, the last one stops the swarm.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, run_logs, stub_swarm, swarm_processes
from stack import PrefectStack, job_variables

from prefect_swarm.state import StateStore
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _run_and_logs(run_id: Any) -> tuple[Any, list[str]]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read() -> tuple[Any, list[str]]:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return run, [entry.message for entry in logs]

    return asyncio.run(read())


def _two_runs(
    cfg: dict[str, Any],
    swarm_home: Path,
    tmp_path: Path,
    sizes: dict[str, int],
    sample: Callable[[dict[str, Any]], None] = lambda runs: None,
    **params: Any,
) -> dict[str, Any]:
    """Start a 'big' (2 shards) and a 'small' run on ``cfg`` at once; wait until both are final
    (calling ``sample`` with the runs at each look)."""
    from prefect.deployments import run_deployment

    runs: dict[str, Any] = {}
    for label, n in sizes.items():
        runs[label] = run_deployment(
            "batch-inference/on-demand",
            timeout=0,
            flow_run_name=f"{cfg['name']}-{label}",
            job_variables=job_variables(swarm_home),
            parameters={
                "swarm": cfg,
                "job": job_options(concurrency=2),
                "input": str(prompts(tmp_path / f"{label}.parquet", n)),
                "output": str(tmp_path / f"{label}-out.parquet"),
                "shards": 2 if label == "big" else 1,
                **params,
            },
        )

    def final(label: str) -> bool:
        sample(runs)
        state = _run_and_logs(runs[label].id)[0].state
        return state is not None and state.is_final()

    wait_until("both runs final", lambda: all(final(label) for label in runs), timeout_s=400, poll_s=1)
    return runs


def test_two_runs_share_one_swarm(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    cfg = stub_swarm("shared", latency_ms=40)
    t0 = time.monotonic()
    runs = _two_runs(cfg, swarm_home, tmp_path, {"big": 800, "small": 60})
    took = time.monotonic() - t0
    done = {label: _run_and_logs(run.id)[0] for label, run in runs.items()}
    for label, run in done.items():
        assert run.state.type.value == "COMPLETED", (label, run.state)
    for label, n in (("big", 800), ("small", 60)):
        table = pq.read_table(tmp_path / f"{label}-out.parquet")
        assert table.num_rows == n and set(table.column("status").to_pylist()) == {"ok"}, label

    text = _final_texts(runs)
    ups = {label: t.count("Brought up swarm 'shared'") for label, t in text.items()}
    shares = {label: t.count("Swarm 'shared' is already up") for label, t in text.items()}
    stops = {label: t.count("Swarm 'shared' stopped") for label, t in text.items()}
    assert sum(ups.values()) == 1 and sum(shares.values()) == 1, (ups, shares)
    last = max(done, key=lambda label: done[label].end_time)
    assert stops[last] == 1 and sum(stops.values()) == 1, (stops, last)
    first = min(done, key=lambda label: done[label].end_time)
    assert "stays up: still held by flow-run:" in text[first]
    rec = StateStore().require_swarm("shared")
    assert rec.phase == "STOPPED" and StateStore().list_leases("shared") == []
    assert not swarm_processes(swarm_home, "shared", cfg["port"])
    print(
        f"two runs on one swarm: both Completed in {took:.0f} s; brought up by {max(ups, key=ups.__getitem__)}, "
        f"shared by {max(shares, key=shares.__getitem__)}, stopped once by {last} (ended last)"
    )


def _final_texts(runs: dict[str, Any]) -> dict[str, str]:
    """Each run's log, once its last line has reached the API (the flow processes send their last
    logs after the run is final)."""
    return {label: "\n".join(run_logs(run.id)) for label, run in runs.items()}


def _engine_pids(port: int) -> frozenset[int]:
    """PIDs of the stub engines serving on ``port`` (one replica)."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        if any(a == "--port" and b == str(port) for a, b in itertools.pairwise(argv)):
            found.add(int(proc.info["pid"]))
    return frozenset(found)


def test_exclusive_runs_take_turns(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    """``sharing: exclusive`` in the swarm config (no flow parameter): the runs take turns, and the
    queued one takes the swarm over from the first (same config): one bring-up, one stop, the same
    engine process for both."""
    hold = tmp_path / "hold"
    hold.touch()  # the rows wait (not the readiness probe) until the queued run holds the swarm
    engine = {"hold_while": str(hold), "hold_prompt": "say hello"}
    cfg = {**stub_swarm("exclusive", latency_ms=20, engine=engine), "sharing": "exclusive"}
    engines: set[frozenset[int]] = set()

    def sample(runs: dict[str, Any]) -> None:
        engines.add(_engine_pids(cfg["port"]))
        if hold.exists() and any(
            "this run holds it while it waits" in line for run in runs.values() for line in _run_and_logs(run.id)[1]
        ):
            hold.unlink()

    runs = _two_runs(cfg, swarm_home, tmp_path, {"big": 200, "small": 40}, sample)
    done = {label: _run_and_logs(run.id)[0] for label, run in runs.items()}
    states = {label: (run.state.name, run.state.message) for label, run in done.items()}
    assert all(run.state.type.value == "COMPLETED" for run in done.values()), states
    for label, n in (("big", 200), ("small", 40)):
        table = pq.read_table(tmp_path / f"{label}-out.parquet")
        assert table.num_rows == n and set(table.column("status").to_pylist()) == {"ok"}, label

    text = _final_texts(runs)
    assert sum("Swarm 'exclusive' stopped" in t for t in text.values()) == 1, text
    assert all("waiting for the concurrency limit 'swarm:exclusive'" in t for t in text.values())
    acquired = {label: _logged_at(run.id, "Acquired the concurrency limit") for label, run in runs.items()}
    first, second = sorted(done, key=lambda label: acquired[label])
    # the slot is let go when the first run's body ends, after it let go of the swarm (its last log
    # line in the body) and a moment before Prefect sets its end time, which the second may precede
    let_go = _logged_at(runs[first].id, "stays up: still held by")
    assert let_go <= acquired[second], f"the second run did not wait for the first: {let_go} > {acquired[second]}"
    # one at a time, one swarm: the first brought it up, the queued one held it while waiting and shared it
    assert "Brought up swarm 'exclusive'" in text[first] and "Brought up swarm" not in text[second], text[second]
    assert "this run holds it while it waits" in text[second] and "is already up" in text[second]
    assert "Swarm 'exclusive' stopped" in text[second] and "stays up: still held by flow-run:" in text[first]
    running = [pids for pids in engines if pids]
    assert len(set(running)) == 1 and len(next(iter(running))) == 1, engines  # the same engine process throughout
    assert not _engine_pids(cfg["port"])
    print(f"exclusive: {first} then {second} on one engine (pid {sorted(running[0])}); the second took it over")


def _logged_at(run_id: Any, text: str) -> Any:
    """When the flow run first logged a line containing ``text``."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read() -> Any:
        async with get_client() as client:
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return min(x.timestamp for x in logs if text in x.message)

    return asyncio.run(read())


def test_exclusive_limit_created_by_a_run_starting_at_the_same_moment(prefect_api: PrefectStack) -> None:
    """Prefect's upsert reads, then creates: another run may create ``swarm:<name>`` in between
    (the create answers 409). That run's limit is the one we wait on; we do not fail."""
    from prefect import get_client
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound

    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.tasks.swarm import swarm_use

    raced: list[str] = []

    class LosingTheRace(SyncPrefectClient):
        """A client whose first read finds no limit, then another run creates it (before our create)."""

        def read_global_concurrency_limit_by_name(self, name: str) -> Any:
            if not raced:
                raced.append(name)
                with get_client(sync_client=True) as other:
                    other.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
                raise ObjectNotFound(http_exc=Exception(name))
            return super().read_global_concurrency_limit_by_name(name)

    with swarm_use(
        SwarmConfig(name="raced", model="m"), "exclusive", prefect_client=lambda: LosingTheRace(prefect_api.api_url)
    ):
        with get_client(sync_client=True) as client:
            held = client.read_global_concurrency_limit_by_name("swarm:raced")
        assert held.limit == 1 and held.active_slots == 1
    assert raced == ["swarm:raced"]


def test_sharing_is_a_config_field_the_flow_parameter_overrides(prefect_api: PrefectStack) -> None:
    """The config's ``sharing`` decides unless the flow's ``sharing`` parameter is given."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    from prefect_swarm.blocks import SwarmSpec
    from prefect_swarm.config import load_config
    from prefect_swarm.tasks.swarm import swarm_use

    cfg = load_config(data={**stub_swarm("solo"), "sharing": "exclusive"}, use_defaults_file=False)
    assert SwarmSpec.from_config(cfg).to_config().sharing == "exclusive"  # the block form has it too
    with get_client(sync_client=True) as client:
        with swarm_use(cfg.model_copy(update={"name": "by-param"}), "shared"), pytest.raises(ObjectNotFound):
            client.read_global_concurrency_limit_by_name("swarm:by-param")  # the parameter wins
        with swarm_use(cfg):  # no parameter: the config's exclusive
            held = client.read_global_concurrency_limit_by_name("swarm:solo")
            assert held.limit == 1 and held.active_slots == 1
        assert client.read_global_concurrency_limit_by_name("swarm:solo").active_slots == 0


def test_bad_sharing_names_the_field() -> None:
    from prefect_swarm.config import load_config
    from prefect_swarm.exceptions import ConfigError

    with pytest.raises(ConfigError, match="sharing") as err:
        load_config(data={**stub_swarm("bad"), "sharing": "solo"}, use_defaults_file=False)
    assert "shared" in str(err.value) and "exclusive" in str(err.value)
