"""The one sleep/wake path (prefect_swarm.backends.sleep) against the GPU-like simulator: the replica
leaves rotation before its engine sleeps and rejoins only after it answers; an engine that refuses to
sleep goes back in rotation; bad requests are refused before anything is touched."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from prefect_swarm.backends.engine import VLLM_DEV_MODE
from prefect_swarm.backends.sleep import Sleeper, asleep
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import BackendError, ConfigError
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing.gpu_sim import GARBLED, MODULE
from prefect_swarm.testing.ports import free_port
from prefect_swarm.testing.stub_engine import StubEngine


def _cfg(sleep_mode: bool = True) -> SwarmConfig:
    return SwarmConfig.model_validate({
        "name": "s", "model": "stub-model", "replicas": 1, "gpus_per_replica": 0,
        "engine": {"kind": "command", "command": ["x"], "sleep_mode": sleep_mode}, "backend": {"type": "local"},
    })  # fmt: skip


def _sleeper(tmp_path: Path, url: str, events: list[str], cfg: SwarmConfig | None = None) -> Sleeper:
    paths = SwarmPaths(tmp_path / "s").ensure()

    def leave(i: int, u: str) -> None:
        events.append(f"leave {i} asleep-marked={i in asleep(paths)}")

    def rejoin(i: int) -> None:
        events.append(f"rejoin {i} asleep-marked={i in asleep(paths)}")

    return Sleeper(cfg or _cfg(), paths, None, url_of=lambda i: url, leave=leave, rejoin=rejoin, drain_s=5)


def _answer(url: str) -> str:
    """The text of one chat completion (the simulator's is a pure function of the request)."""
    chat = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return str(httpx.post(url + "/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"])


def test_leaves_rotation_before_sleeping_and_rejoins_after_answering(tmp_path: Path) -> None:
    with StubEngine(free_port(), "127.0.0.1", "--enable-sleep-mode", module=MODULE, env={VLLM_DEV_MODE: "1"},
                    sleep_s=0, wake_s=0.1) as sim:  # fmt: skip
        events: list[str] = []
        sleeper = _sleeper(tmp_path, sim.url, events)
        (report,) = sleeper.sleep([0], level=2)
        assert (report.asleep, report.level, report.url) == (True, 2, sim.url)
        assert events == ["leave 0 asleep-marked=True"]
        assert sleeper.sleep([0])[0].level == 2  # asleep already: reported as it is
        (woke,) = sleeper.wake([0])
        assert not woke.asleep and asleep(sleeper.paths) == {}
        assert events == ["leave 0 asleep-marked=True", "rejoin 0 asleep-marked=False"]
        assert sleeper.wake([0])[0].seconds == 0.0  # awake: nothing to do


def test_a_level_2_wake_reloads_the_weights_before_the_replica_rejoins(tmp_path: Path) -> None:
    with StubEngine(free_port(), "127.0.0.1", "--enable-sleep-mode", module=MODULE, env={VLLM_DEV_MODE: "1"},
                    sleep_s=0, wake_s=0, wake_level2_s=0.3) as sim:  # fmt: skip
        before = _answer(sim.url)
        events: list[str] = []
        sleeper = _sleeper(tmp_path, sim.url, events)
        sleeper.sleep([0], level=2)
        (woke,) = sleeper.wake([0])
        assert (woke.asleep, woke.level) == (False, 2) and woke.seconds >= 0.3  # the reload took its time
        assert events[-1] == "rejoin 0 asleep-marked=False"
        after = _answer(sim.url)
        assert after == before != GARBLED
        assert httpx.get(sim.url + "/stats").json().get("garbled", 0) == 0  # not even the wake's own probe


def test_a_level_2_wake_that_stopped_half_way_is_finished_by_the_next(tmp_path: Path) -> None:
    with StubEngine(free_port(), "127.0.0.1", "--enable-sleep-mode", module=MODULE, env={VLLM_DEV_MODE: "1"},
                    sleep_s=0, wake_s=0, wake_level2_s=0) as sim:  # fmt: skip
        before = _answer(sim.url)
        sleeper = _sleeper(tmp_path, sim.url, [])
        sleeper.sleep([0], level=2)
        assert httpx.post(sim.url + "/wake_up").status_code == 200  # woken by hand, without the reload
        assert _answer(sim.url) == GARBLED
        assert 0 in asleep(sleeper.paths)  # still out of rotation: no client sees the wrong answers
        sleeper.wake([0])
        after = _answer(sim.url)
        assert after == before and asleep(sleeper.paths) == {}


def test_an_engine_that_refuses_to_sleep_goes_back_in_rotation(tmp_path: Path) -> None:
    with StubEngine(free_port(), "127.0.0.1", module=MODULE, env={VLLM_DEV_MODE: "1"}) as sim:  # no sleep mode
        events: list[str] = []
        sleeper = _sleeper(tmp_path, sim.url, events)
        with pytest.raises(BackendError, match="HTTP 500") as err:
            sleeper.sleep([0])
        assert "--enable-sleep-mode" in (err.value.hint or "")
        assert asleep(sleeper.paths) == {} and events == ["leave 0 asleep-marked=True", "rejoin 0 asleep-marked=False"]


def test_bad_requests_are_refused_before_anything_is_touched(tmp_path: Path) -> None:
    events: list[str] = []
    with pytest.raises(ConfigError, match=r"engine\.sleep_mode"):
        _sleeper(tmp_path, "http://127.0.0.1:9", events, _cfg(sleep_mode=False)).sleep([0])
    with pytest.raises(ConfigError, match="replica 3"):
        _sleeper(tmp_path, "http://127.0.0.1:9", events).sleep([3])
    with pytest.raises(ConfigError, match="level 3"):
        _sleeper(tmp_path, "http://127.0.0.1:9", events).sleep([0], level=3)
    assert events == []
