"""The tail of a job kept full (prefect_swarm.jobs.dispatch.runner: Runner._steal) on the GPU-like simulator.

Once every row is sent, a replica with room takes a copy of the rows expected to end latest on
another one; the first answer wins and the other request is cancelled. Each test drives the real
Runner in this process against simulated replicas (subprocesses) and reads what the runner reported
(one result per row: what the ledger is given) and what the replicas themselves answered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from _jobkit import chat_rows

from prefect_swarm.interfaces.metrics import parse, total
from prefect_swarm.jobs.builtin import ChatCompletionJob
from prefect_swarm.jobs.checkpoint.ledger import STATUS_OK, RowResult
from prefect_swarm.jobs.dispatch.runner import Runner, RunnerConfig
from prefect_swarm.testing.waiting import wait_until

ROWS = 1000
BATCH = 32
KNOBS: dict[str, Any] = {
    "max_num_seqs": BATCH,
    "step_ms": 20,
    "step_ms_per_seq": 0.02,
    "answer_tokens": 16,
    "answer_tokens_spread": 8,
}
"""Replicas batching 32, answers of 8-24 tokens, ~0.4 s an answer with a full batch (~80 rows/s): a job
of ~9 s on a replica and one three times slower."""


def answered(url: str) -> float:
    """Answers the replica sent (its ``vllm:request_success_total``), whether or not the client still waited."""
    return total(parse(httpx.get(url + "/metrics", timeout=5).text), "vllm:request_success_total") or 0.0


class Run:
    """One job's rows through a Runner: the results as the ledger gets them, and when each came."""

    def __init__(self, urls: list[str], n: int, **cfg: Any) -> None:
        self.results: list[RowResult] = []
        self.times: list[float] = []
        self.runner = Runner(
            ChatCompletionJob(), urls, RunnerConfig(control_s=0.25, replica_capacity=BATCH, **cfg), self.report
        )
        self.start = time.monotonic()
        assert asyncio.run(self.runner.run(chat_rows(n)))

    def report(self, result: RowResult) -> None:
        self.results.append(result)
        self.times.append(time.monotonic())

    def tail_share(self) -> float:
        """The last 5 % of rows' share of the request phase (first request to last answer)."""
        times = sorted(self.times)
        return (times[-1] - times[int(0.95 * len(times))]) / (times[-1] - self.start)

    def exactly_once(self, n: int) -> None:
        assert sorted(r.row for r in self.results) == list(range(n)), "a row reported twice or not at all"
        assert all(r.status == STATUS_OK for r in self.results), [r.error for r in self.results if r.error][:3]


def test_a_slow_replica_does_not_hold_the_tail(sim) -> None:
    """One replica three times slower than the other: without copies its last batch (and its short queue)
    holds the job's end for three of the fast replica's answers; with them (the default) the fast replica
    takes the slow one's late rows as it runs dry, and the last 5 % of rows take a smaller share of the
    request phase. Side by side on the same replicas, copies off then on, twice (a loaded machine
    disturbs single runs); every row reported once in every run. How much smaller is a benchmark's
    to say (``bench/tail.py``: 0.40x with four replicas, BENCHMARKS.md); a full suite on two cores
    starves the simulators and the runner alike and measured 0.85x, so the test asserts the direction."""
    fast, slow = sim(**KNOBS), sim(**KNOBS, speed=1 / 3)
    urls = [fast.url, slow.url]
    shares: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):
        for hedge in (False, True):
            run = Run(urls, ROWS, hedge=hedge)
            run.exactly_once(ROWS)
            assert (run.runner.copies_won > 0) is hedge, (hedge, run.runner.copies, run.runner.copies_won)
            shares[hedge].append(run.tail_share())
    assert sum(shares[True]) < sum(shares[False]), shares


def test_a_copy_and_its_original_both_answer_one_row_is_reported(sim) -> None:
    """The replica a row was copied from answers it too (the simulator, unlike vLLM, finishes a request
    whose client left): the replicas together answer more requests than there are rows, the copies that
    lost are cancelled, and the runner reports each row exactly once, with an attempt count that includes
    the copy where the copy won."""
    fast, slow = sim(**KNOBS), sim(**KNOBS, speed=1 / 4)
    run = Run([fast.url, slow.url], ROWS)
    run.exactly_once(ROWS)
    runner = run.runner
    assert runner.copies_won > 0 and runner.copies >= runner.copies_won
    # the originals the copies beat are answered by the slow replica all the same
    sent_slow = next(ep.sent for ep in runner.pool.endpoints if ep.url == slow.url)
    slow_answered = wait_until(
        "the slow replica to answer every request it was sent, the cancelled ones too",
        lambda: answered(slow.url),
        until=lambda n: n >= sent_slow,
        timeout_s=60,
    )
    assert answered(fast.url) + slow_answered >= ROWS + runner.copies_won
    assert max(r.attempts for r in run.results) >= 2  # a row won by its copy counts the copy as an attempt
    assert not runner._flights and not runner._copies  # nothing left in flight


def test_equal_replicas_send_no_copies(sim) -> None:
    """Replicas of one speed end together: a copy would not win, so (almost) none is sent."""
    a, b = sim(**KNOBS), sim(**KNOBS)
    run = Run([a.url, b.url], ROWS)
    run.exactly_once(ROWS)
    assert run.runner.copies <= 0.02 * ROWS, run.runner.copies


def test_no_copies_where_a_request_costs_money(sim) -> None:
    """A job with rate limits (a priced API's) sends no copies, however slow one endpoint is."""
    fast, slow = sim(**KNOBS), sim(**KNOBS, speed=1 / 3)
    run = Run([fast.url, slow.url], 600, requests_per_minute=600_000)
    run.exactly_once(600)
    assert run.runner.copies == 0
