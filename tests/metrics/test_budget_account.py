"""The swarm's one spend account (prefect_swarm.budget): admission before every request, one account
that several processes draw on, the reservation replaced by the answer's cost, GPU time admitted up to
the swarm's next check, and a stop that sends nothing queued behind the rate limit."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import time
from pathlib import Path

import pytest

from prefect_swarm.budget import (
    GRANT_SHARE,
    Account,
    GpuClock,
    SwarmBudget,
    TokenPurse,
    answer_usd,
    final_word,
    worst_case_usd,
)
from prefect_swarm.config.cost import CostConfig
from prefect_swarm.jobs.dispatch.ratelimit import RateLimiter
from prefect_swarm.testing.stub_engine import answer

PRICES = {"input_usd_per_million": 100.0, "output_usd_per_million": 400.0}


def _budget(tmp_path: Path, cap: float, epoch: float = 1.0) -> SwarmBudget:
    cost = CostConfig(**PRICES, max_cost_usd=cap)
    return SwarmBudget(swarm="s", cost=cost, at=time.time(), account=str(tmp_path / "budget.json"), epoch=epoch)


def _body(i: int, max_tokens: int = 16) -> bytes:
    req = {"model": "m", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": max_tokens}
    return json.dumps(req).encode()


def _reserve(admission: TokenPurse | GpuClock, body: bytes) -> float | None:
    return asyncio.run(admission.reserve(body))


def _spend_until_refused(budget_json: str, holder: str, seed: int, out: multiprocessing.Queue) -> None:
    """One job process: reserve, settle at a cost below the reservation, until the account refuses."""
    rng = random.Random(seed)
    purse = TokenPurse(SwarmBudget.model_validate_json(budget_json), holder)
    spent, sent = 0.0, 0
    while (reserved := _reserve(purse, _body(sent))) is not None:
        usage = {"prompt_tokens": 3, "completion_tokens": rng.randint(1, 16)}
        cost = answer_usd(purse.cost, json.dumps({"usage": usage}).encode())
        assert cost is not None and cost <= reserved
        purse.settle(reserved, 200, json.dumps({"usage": usage}).encode())
        spent, sent = spent + cost, sent + 1
    purse.close()
    out.put((spent, sent, purse.reached))


def test_several_processes_on_one_account_never_pass_the_cap(tmp_path: Path) -> None:
    """4 processes (as 2 jobs x 2 shards would) draw on one account at once: together they spend at most
    the cap, the account's spend is exactly theirs, and what is left is less than one request plus the
    grants the others still held when the last was refused."""
    cap, procs = 0.5, 4
    budget = _budget(tmp_path, cap)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    workers = [
        ctx.Process(target=_spend_until_refused, args=(budget.model_dump_json(), f"job{i % 2}/{i}/h:1", i, out))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(10)
    total = sum(r[0] for r in results)
    spend = Account(Path(budget.account or ""), budget.epoch).read()
    assert spend.held_usd == 0 and spend.holders == 0, spend  # every process settled on close
    assert spend.spent_usd == pytest.approx(total, abs=1e-5)
    assert total <= cap, total
    one_request = worst_case_usd(budget.cost, _body(0))
    assert cap - total <= one_request + procs * GRANT_SHARE * cap, (cap - total, results)
    # each stopped at the cap (one started late on a loaded machine may find it spent already)
    assert all("budget reached" in (r[2] or "") for r in results) and sum(r[1] for r in results) > 0, results


def test_an_answer_replaces_its_reservation_and_no_answer_keeps_it(tmp_path: Path) -> None:
    purse = TokenPurse(_budget(tmp_path, 1.0), "j/0/h:1")
    worst = _reserve(purse, _body(0, max_tokens=100))
    assert worst == pytest.approx(worst_case_usd(purse.cost, _body(0, max_tokens=100)))
    purse.settle(worst or 0, 200, json.dumps({"usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode())
    error = _reserve(purse, _body(1))
    purse.settle(error or 0, 429, b'{"error": "slow down"}')  # an error answer is not billed
    lost = _reserve(purse, _body(2))
    purse.settle(lost or 0, 0, b"")  # no answer at all: the provider may have billed it
    purse.close()
    assert Account(tmp_path / "budget.json", 1.0).read().spent_usd == pytest.approx(
        (100 * 10 + 400 * 5) / 1e6 + (lost or 0), abs=1e-6
    )


def test_a_reservation_without_room_waits_for_the_answers_in_flight_and_is_refused_once_none_is(
    tmp_path: Path,
) -> None:
    """Two requests in flight fill the cap; a third waits for them (their answers cost less than their
    worst case) instead of stopping the job. Once nothing is in flight and still no room: refused, at
    once, however the sums of the settled floats round."""

    async def scenario() -> tuple[float | None, float | None, str | None]:
        body = _body(0)
        worst = worst_case_usd(CostConfig(**PRICES), body)
        purse = TokenPurse(_budget(tmp_path, worst * 2.5), "j/0/h:1")
        a, b = await purse.reserve(body), await purse.reserve(body)
        third = asyncio.ensure_future(purse.reserve(body))
        await asyncio.sleep(0.05)
        assert not third.done()  # no room: it waits, it is not refused while answers may give room back
        cheap = json.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
        purse.settle(a or 0, 200, cheap)
        admitted = await asyncio.wait_for(third, 1)
        purse.settle(b or 0, 200, cheap)
        purse.settle(admitted or 0, 0, b"")  # no answer: kept whole
        for _ in range(40):  # many small settles: the sum of floats in flight drifts, the count does not
            r = await purse.reserve(_body(1, max_tokens=1))
            if r is None:
                break
            purse.settle(r, 200, cheap)
        refused = await asyncio.wait_for(purse.reserve(_body(2, max_tokens=4000)), 1)
        return admitted, refused, purse.reached

    admitted, refused, reached = asyncio.run(scenario())
    assert admitted is not None and refused is None
    assert "budget reached" in (reached or ""), reached


def test_a_reservation_is_never_below_what_the_engine_bills() -> None:
    """The worst case covers the stub engine's usage, with and without max_tokens, with n."""
    cost = CostConfig(**PRICES)
    for req in (
        {"messages": [{"role": "user", "content": "say " + "word " * 50}], "max_tokens": 8},
        {"messages": [{"role": "user", "content": "say 1"}]},
        {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 12, "n": 3},
        {"prompt": "x " * 200, "max_tokens": 1},
    ):
        body = json.dumps({"model": "m", **req}).encode()
        path = "/v1/completions" if "prompt" in req else "/v1/chat/completions"
        billed = answer_usd(cost, json.dumps(answer(path, req, "m")).encode())
        assert billed is not None and billed <= worst_case_usd(cost, body), req


def test_a_swarm_brought_up_again_starts_a_fresh_account_and_old_jobs_spend_nothing(tmp_path: Path) -> None:
    old = TokenPurse(_budget(tmp_path, 0.05, epoch=1.0), "old/0/h:1")
    while (r := _reserve(old, _body(0))) is not None:
        old.settle(r, 0, b"")  # every reservation kept: the account fills up
    assert Account(tmp_path / "budget.json", 1.0).spent() >= 0.05 - 0.02
    new = TokenPurse(_budget(tmp_path, 0.05, epoch=2.0), "new/0/h:1")
    assert _reserve(new, _body(0)) is not None  # the swarm came up again: its account starts at 0
    assert Account(tmp_path / "budget.json", 2.0).read().spent_usd == 0
    late = TokenPurse(_budget(tmp_path, 0.05, epoch=1.0), "old/1/h:2")
    assert _reserve(late, _body(0)) is None  # a process of the swarm's last life spends nothing of this one


def test_gpu_time_is_admitted_until_the_swarm_would_pass_its_cap_by_its_next_check() -> None:
    now = time.time()
    cost = CostConfig(max_gpu_hours=1.0)
    # 2 GPUs, 0.995 GPU-hours used: 18 s of GPU time left, 9 s of wall time; 5 s ahead: 4 s to admit
    clock = GpuClock(SwarmBudget(swarm="s", cost=cost, gpu_hours=0.995, at=now, gpus=2), ahead_s=5.0)
    assert clock.deadline == pytest.approx(now + 4.0, abs=0.01)
    assert _reserve(clock, b"{}") == 0.0
    spent = GpuClock(SwarmBudget(swarm="s", cost=cost, gpu_hours=0.999, at=now, gpus=2), ahead_s=5.0)
    assert _reserve(spent, b"{}") is None and _reserve(spent, b"{}") is None
    assert "budget reached" in (spent.reached or "") and "(max_gpu_hours)" in (spent.reached or "")
    priced = CostConfig(gpu_hour_usd=10.0, max_cost_usd=10.0)
    assert GpuClock(SwarmBudget(swarm="s", cost=priced, gpu_hours=0.5, at=now, gpus=1), 0).deadline == pytest.approx(
        now + 1800, abs=0.01
    )


def test_a_stop_while_waiting_for_the_rate_limit_sends_nothing_queued() -> None:
    """The drain waits for what is in flight; a request queued behind the limit leaves at once, uncounted."""

    async def scenario() -> tuple[int | None, int | None, float]:
        limiter = RateLimiter(requests_per_minute=6)  # one every 10 s
        stop = asyncio.Event()
        first = await limiter.acquire(b"{}", stop)
        asyncio.get_running_loop().call_later(0.2, stop.set)
        began = time.monotonic()
        second = await limiter.acquire(b"{}", stop)
        return first, second, time.monotonic() - began

    first, second, waited = asyncio.run(scenario())
    assert first == 0 and second is None
    assert waited < 2.0, waited


def test_the_final_word_gives_the_spend_the_cap_and_the_rows_left() -> None:
    word = final_word("ext", CostConfig(**PRICES, max_cost_usd=0.5), spent_usd=0.4981, rows_left=289)
    assert word == (
        "swarm 'ext': budget reached: $0.4981 of $0.5 (max_cost_usd) at exit; 289 rows left: "
        "a rerun with a larger budget resumes them"
    )
