"""The GPU-like simulator's sleep mode answers as vLLM's OpenAI server does (routes, methods, bodies,
what a completion gets while asleep, wake times by level)."""

from __future__ import annotations

import threading
import time

import httpx

from prefect_swarm.backends.engine import VLLM_DEV_MODE
from prefect_swarm.testing.gpu_sim import GARBLED, MODULE
from prefect_swarm.testing.ports import free_port
from prefect_swarm.testing.stub_engine import StubEngine
from prefect_swarm.testing.waiting import wait_until

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def sim(*flags: str, dev: bool = True, **knobs: object) -> StubEngine:
    """A simulator on a free port, with vLLM's dev mode in its environment when ``dev``."""
    env = {VLLM_DEV_MODE: "1"} if dev else {VLLM_DEV_MODE: "0"}
    return StubEngine(free_port(), "127.0.0.1", *flags, module=MODULE, env=env, step_ms=1, **knobs)


def test_without_dev_mode_the_routes_do_not_exist() -> None:
    with sim("--enable-sleep-mode", dev=False) as s:
        assert httpx.post(s.url + "/sleep").status_code == 404
        assert httpx.post(s.url + "/wake_up").status_code == 404
        got = httpx.get(s.url + "/is_sleeping")
        assert (got.status_code, got.json()) == (404, {"detail": "Not Found"})
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_dev_mode_without_sleep_mode_refuses_to_sleep() -> None:
    with sim() as s:
        assert httpx.get(s.url + "/is_sleeping").json() == {"is_sleeping": False}
        assert httpx.post(s.url + "/sleep?level=1").status_code == 500
        assert httpx.post(s.url + "/wake_up").status_code == 500
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_sleep_refuses_completions_and_wake_by_tags_brings_them_back() -> None:
    with sim("--enable-sleep-mode", sleep_s=0.05, wake_s=0.3) as s:
        assert httpx.get(s.url + "/sleep").status_code == 405
        assert httpx.post(s.url + "/sleep?level=abc").status_code == 500
        slept = httpx.post(s.url + "/sleep?level=1")
        assert (slept.status_code, slept.content) == (200, b"")
        assert httpx.get(s.url + "/is_sleeping").json() == {"is_sleeping": True}
        refused = httpx.post(s.url + "/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503 and "sleeping" in refused.json()["error"]["message"]
        assert httpx.get(s.url + "/health").status_code == 200  # the process is alive: no restart
        assert httpx.get(s.url + "/v1/models").status_code == 200
        assert httpx.post(s.url + "/wake_up?tags=nonsense").status_code == 200  # a no-op, as in vLLM
        t0 = time.monotonic()
        assert httpx.post(s.url + "/wake_up?tags=weights").status_code == 200
        assert time.monotonic() - t0 >= 0.3  # weights copied back from CPU memory
        assert httpx.get(s.url + "/is_sleeping").json() == {"is_sleeping": True}  # the KV cache still sleeps
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT).status_code == 503
        assert httpx.post(s.url + "/wake_up?tags=kv_cache").status_code == 200
        assert httpx.get(s.url + "/is_sleeping").json() == {"is_sleeping": False}
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert httpx.post(s.url + "/wake_up").status_code == 200  # awake already: a no-op


def test_level_1_wake_copies_the_weights_back_and_answers_right() -> None:
    with sim("--enable-sleep-mode", sleep_s=0, wake_s=0.3, wake_level2_s=5) as s:
        before = httpx.post(s.url + "/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        assert httpx.post(s.url + "/sleep?level=1").status_code == 200
        t0 = time.monotonic()
        assert httpx.post(s.url + "/wake_up", timeout=10).status_code == 200
        assert 0.3 <= time.monotonic() - t0 < 3
        after = httpx.post(s.url + "/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        assert after == before != GARBLED


def test_level_2_answers_wrong_until_the_weights_are_reloaded() -> None:
    with sim("--enable-sleep-mode", "--prefix-cache", sleep_s=0, wake_s=5, wake_level2_s=0.5) as s:
        before = httpx.post(s.url + "/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        assert httpx.post(s.url + "/sleep?level=2").status_code == 200
        t0 = time.monotonic()
        assert httpx.post(s.url + "/wake_up?tags=weights", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 3  # reallocated, not copied back: there is nothing to copy
        rpc = {"method": "reload_weights"}
        assert httpx.post(s.url + "/wake_up?tags=kv_cache").status_code == 200
        assert httpx.get(s.url + "/is_sleeping").json() == {"is_sleeping": False}
        wrong = httpx.post(s.url + "/v1/chat/completions", json=CHAT)
        assert wrong.status_code == 200 and wrong.json()["choices"][0]["message"]["content"] == GARBLED
        text = httpx.post(s.url + "/v1/completions", json={"model": "stub-model", "prompt": "hi", "max_tokens": 4})
        assert text.json()["choices"][0]["text"] == GARBLED
        t0 = time.monotonic()
        reloaded = httpx.post(s.url + "/collective_rpc", json=rpc, timeout=10)
        assert (reloaded.status_code, reloaded.json()) == (200, {"results": [None]})
        assert time.monotonic() - t0 >= 0.5  # loaded again from the model's files
        assert httpx.post(s.url + "/reset_prefix_cache").json() == {"success": True}
        after = httpx.post(s.url + "/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        assert after == before
        assert httpx.get(s.url + "/stats").json()["garbled"] == 2


def test_reload_weights_needs_the_weights_awake_and_a_well_formed_call() -> None:
    with sim("--enable-sleep-mode", sleep_s=0, wake_level2_s=0) as s:
        assert httpx.get(s.url + "/collective_rpc").status_code == 405
        assert httpx.post(s.url + "/collective_rpc", content=b"{nope").status_code == 400
        assert httpx.post(s.url + "/collective_rpc", json=["reload_weights"]).status_code == 400
        missing = httpx.post(s.url + "/collective_rpc", json={"args": []})
        assert missing.status_code == 400 and "method" in missing.json()["detail"]
        assert httpx.post(s.url + "/collective_rpc", json={"method": "no_such_method"}).status_code == 500
        assert httpx.post(s.url + "/sleep?level=2").status_code == 200
        assert httpx.post(s.url + "/collective_rpc", json={"method": "reload_weights"}).status_code == 500
        assert httpx.post(s.url + "/wake_up").status_code == 200
        assert httpx.post(s.url + "/collective_rpc", json={"method": "reload_weights"}).status_code == 200
    with sim("--enable-sleep-mode", dev=False) as s:  # dev mode only, as the sleep routes
        assert httpx.post(s.url + "/collective_rpc", json={"method": "reload_weights"}).status_code == 404
        assert httpx.post(s.url + "/reset_prefix_cache").status_code == 404


def test_requests_in_flight_are_aborted_by_sleep() -> None:
    long = {**CHAT, "max_tokens": 100_000, "ignore_eos": True}
    with sim("--enable-sleep-mode", sleep_s=0, max_model_len=200_000) as s:
        got: list[httpx.Response] = []
        client = threading.Thread(target=lambda: got.append(httpx.post(s.url + "/v1/chat/completions", json=long)))
        client.start()
        wait_until(
            "the long request running",
            lambda: httpx.get(s.url + "/stats").json().get("generation_tokens"),
            timeout_s=10,
        )
        assert httpx.post(s.url + "/sleep").status_code == 200
        client.join(10)
        assert [r.status_code for r in got] == [503]
        assert httpx.get(s.url + "/stats").json()["aborted"] == 1
