"""The stub engine's hold: ``--hold-while FILE`` holds answers while the file exists; with
``--hold-prompt REGEX`` only the answers to prompts it matches (a readiness probe's ``ping`` goes
through, so a swarm comes up while its job's rows wait)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from prefect_swarm.testing.ports import free_port
from prefect_swarm.testing.stub_engine import StubEngine
from prefect_swarm.testing.waiting import wait_until


def chat(text: str) -> dict[str, object]:
    return {"model": "stub-model", "messages": [{"role": "user", "content": text}], "max_tokens": 4}


def held_request(s: StubEngine, text: str) -> tuple[threading.Thread, list[int]]:
    """Send ``text`` in a thread, once the engine counts it running (held); the list gets its status."""
    answered: list[int] = []

    def send() -> None:
        answered.append(httpx.post(s.url + "/v1/chat/completions", json=chat(text), timeout=60).status_code)

    thread = threading.Thread(target=send)
    thread.start()
    wait_until("the held request to arrive", lambda: s.stats()["running"] == 1, timeout_s=15)
    return thread, answered


def test_a_matching_prompt_waits_for_the_file_and_others_are_answered(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    with StubEngine(free_port(), hold_while=str(hold), hold_prompt="say hello") as s:
        held, answered = held_request(s, "say hello 1")
        assert httpx.post(s.url + "/v1/chat/completions", json=chat("ping"), timeout=10).status_code == 200
        assert answered == [] and s.stats()["running"] == 1  # still held
        hold.unlink()
        held.join(timeout=30)
        assert answered == [200] and s.stats()["running"] == 0


def test_without_a_prompt_regex_every_answer_waits(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    with StubEngine(free_port(), hold_while=str(hold)) as s:
        held, answered = held_request(s, "ping")
        hold.unlink()
        held.join(timeout=30)
        assert answered == [200]
