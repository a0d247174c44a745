"""The in-flight loop of the job runner (prefect_swarm.jobs.dispatch.control) against the GPU-like simulator.

Each test drives the real Runner in this process against simulated replicas (subprocesses, continuous
batching on a clock) and reads what the replicas themselves report (their /metrics) and what the
runner did (the loop's log, the endpoints' counters).
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _jobkit import CHAT_PATH, chat_rows

from prefect_swarm.interfaces.metrics import engine_targets, parse, total, write_file_sd
from prefect_swarm.jobs.builtin import ChatCompletionJob
from prefect_swarm.jobs.checkpoint.ledger import RowResult
from prefect_swarm.jobs.dispatch.control import FD_RESERVE, process_cap, queue_margin
from prefect_swarm.jobs.dispatch.runner import Item, Runner, RunnerConfig, prefix_key
from prefect_swarm.testing.gpu_sim import SimOptions
from prefect_swarm.testing.waiting import wait_until


def engine_load(url: str) -> tuple[float, float]:
    """(running, waiting) as the replica reports them."""
    samples = parse(httpx.get(url + "/metrics", timeout=5).text)
    return total(samples, "vllm:num_requests_running") or 0.0, total(samples, "vllm:num_requests_waiting") or 0.0


class Drive:
    """Run a Runner over ``n`` rows in a thread; sample the replicas' load meanwhile."""

    def __init__(self, urls: list[str], n: int, **cfg: Any) -> None:
        self.results: list[RowResult] = []
        self.runner = Runner(
            ChatCompletionJob(),
            urls,
            RunnerConfig(
                control_s=0.25, max_retries=20, backoff_base_s=0.05, backoff_max_s=0.2, drain_seconds=0.5, **cfg
            ),
            self.results.append,
        )
        self.n = n
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.outstanding_peak = 0

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.runner.run(chat_rows(self.n))

    def __enter__(self) -> Drive:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.runner.request_stop)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the runner did not stop"

    def outstanding(self) -> int:
        return sum(ep.outstanding for ep in self.runner.pool.endpoints)

    def watch(self, seconds: float, every: float = 0.05) -> None:
        """Track the peak of requests outstanding for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.outstanding_peak = max(self.outstanding_peak, self.outstanding())
            time.sleep(every)

    def wait(self, timeout: float = 120) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the runner did not finish"


def load_samples(url: str, seconds: float, every: float = 0.2) -> list[tuple[float, float]]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(engine_load(url))
        time.sleep(every)
    return out


def test_loop_keeps_a_replica_full_with_a_short_queue(sim) -> None:
    """The job assumes 256 (vLLM's default) but the replica batches 64: within seconds the loop holds
    it at 64 running with a short queue (without the loop 272 would be in flight: 208 waiting)."""
    engine = sim(max_num_seqs=64, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, answer_tokens_spread=8)
    margin = queue_margin(256)
    with Drive([engine.url], 1_000_000):  # not declared: the loop starts from 256
        # "within seconds": 3 s on a quiet machine; on a loaded one the loop's samples come later
        def full_with_a_short_queue() -> bool:
            running, waiting = engine_load(engine.url)
            return running >= 60 and waiting <= 2 * margin

        wait_until("the replica full with a short queue", full_with_a_short_queue, timeout_s=20)
        seen = load_samples(engine.url, 3.0)  # and it stays short
    running = sorted(r for r, _ in seen)
    waiting = [w for _, w in seen]
    assert running[len(running) // 2] >= 60, seen  # full: the batch does not run short of requests
    assert sorted(waiting)[len(waiting) // 2] <= 2 * margin, seen  # short queue (median)
    assert max(waiting) <= 4 * margin, seen


@pytest.mark.parametrize("hidden", [128, 512, 1024])
def test_loop_finds_a_batch_it_is_not_told(sim, hidden: int) -> None:
    """The config does not say what the replica batches (the loop starts from 256): it finds the batch
    from the replica's /metrics and fills it (running at least 95 % of it, by the replica's own
    count), with a short queue: below 256 by the standing queue, above it by growing while the queue
    stays short and the running batch keeps rising."""
    engine = sim(max_num_seqs=hidden, step_ms=40, step_ms_per_seq=0.02, answer_tokens=64, answer_tokens_spread=16)
    with Drive([engine.url], 1_000_000) as drive:
        wait_until("the runner's control loop", lambda: drive.runner.control, timeout_s=30)
        ep, filled = drive.runner.pool.endpoints[0], []

        def full_with_a_short_queue() -> bool:
            if not ep.found:  # the loop still grows: a window between two growths may look settled
                return False
            filled.append(load_samples(engine.url, 1.0, every=0.1))
            margin = drive.runner.control.margin_of(ep)
            return (
                sorted(r for r, _ in filled[-1])[len(filled[-1]) // 2] >= 0.95 * hidden
                and sorted(w for _, w in filled[-1])[len(filled[-1]) // 2] <= 3 * margin
            )

        # quiet: ~5 s (a growth of half the limit every 3 control steps; below 256, the first answers
        # drain the queue of what was sent at the start); a loaded machine samples later
        wait_until(f"a batch of {hidden} full with a short queue", full_with_a_short_queue, timeout_s=60)
        seen = load_samples(engine.url, 2.0, every=0.1)  # and it stays so
        margin = drive.runner.control.margin_of(ep)
    assert sorted(r for r, _ in seen)[len(seen) // 2] >= 0.95 * hidden, seen
    assert sorted(w for _, w in seen)[len(seen) // 2] <= 3 * margin, (seen, margin)
    assert 0.9 * hidden <= ep.found <= hidden, ep.found  # the batch it found is the replica's
    assert ep.limit <= 1.5 * (hidden + margin), ep.limit  # found: no growth without end


def test_a_declared_capacity_wins(sim) -> None:
    """The config declares 64 while the replica batches 128: the job never sends it more than 64 plus
    the margin (the declared batch is what the user wants used there)."""
    engine = sim(max_num_seqs=128, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, answer_tokens_spread=8)
    seen: list[tuple[float, float]] = []
    with Drive([engine.url], 1_000_000, replica_capacity=64) as drive:

        def used() -> bool:  # the median of a 1-s window: answers leave a batch in bursts
            window = load_samples(engine.url, 1.0, every=0.1)
            seen.extend(window)
            return sorted(r for r, _ in window)[len(window) // 2] >= 56

        wait_until("the replica running about the declared 64", used, timeout_s=60)  # and it is used
        drive.watch(4.0, every=0.02)
        seen += load_samples(engine.url, 1.0)
    assert drive.outstanding_peak <= 64 + queue_margin(64), drive.outstanding_peak
    assert max(r for r, _ in seen) <= 64 + queue_margin(64), seen


def test_one_flat_sample_does_not_stop_the_growth() -> None:
    """The loop alone, fed the samples of a replica batching 1024 from a first guess of 256: one window
    where the running batch does not rise (a burst of answers left) is noise, not the engine's most;
    the growth goes on until a queue stands, and the batch under it is the one found."""
    from prefect_swarm.jobs.dispatch.control import Controller
    from prefect_swarm.jobs.dispatch.runner import EndpointPool

    pool = EndpointPool(["http://replica"])
    ctl = Controller(pool, capacity=None, nshards=1, cap=100_000)
    ep = pool.endpoints[0]
    hidden, noisy = 1024, {3}
    for step in range(60):
        ep.outstanding = math.ceil(ep.limit)  # the job uses its limit
        running = min(hidden, ep.outstanding)
        if step in noisy:
            running = ep.grew_from or running  # this window's answers left in a burst
        ctl._by_metrics(ep, running, max(0, ep.outstanding - hidden))
    assert ep.found == hidden, (ep.found, ep.limit)
    assert hidden <= ep.limit <= hidden + 2 * ctl.margin_of(ep), ep.limit


def test_slow_replica_gets_less(sim) -> None:
    """Two replicas batching 64, one four times slower: each is kept full with a short queue (the slow
    one does not hoard requests in its queue) and the fast one answers about four times the rows."""
    fast = sim(max_num_seqs=64, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, answer_tokens_spread=8)
    slow = sim(max_num_seqs=64, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, answer_tokens_spread=8, speed=0.25)
    with Drive([fast.url, slow.url], 1_000_000, replica_capacity=64) as drive:
        wait_until(  # both batches filled once before the window is measured
            "both replicas running their batch",
            lambda: (engine_load(fast.url)[0], engine_load(slow.url)[0]),
            until=lambda running: running[0] >= 60 and running[1] >= 48,
            timeout_s=60,
        )
        by_url = {ep.url: ep for ep in drive.runner.pool.endpoints}
        sent_fast, sent_slow = by_url[fast.url].sent, by_url[slow.url].sent
        seen_slow = load_samples(slow.url, 4.0)
        seen_fast = load_samples(fast.url, 0.5)
        sent_fast, sent_slow = by_url[fast.url].sent - sent_fast, by_url[slow.url].sent - sent_slow
    assert sent_fast > 2.5 * sent_slow, (sent_fast, sent_slow)  # 4x faster: ~4x the rows
    # the slow one's batch stays mostly full (its median; a loaded machine refills it late now and then)
    assert sorted(r for r, _ in seen_slow)[len(seen_slow) // 2] >= 48, seen_slow
    assert max(r for r, _ in seen_fast) >= 60, seen_fast
    assert sorted(w for _, w in seen_slow)[len(seen_slow) // 2] <= 2 * queue_margin(64), seen_slow


def test_replica_added_mid_job_gets_traffic(sim, tmp_path: Path) -> None:
    first = sim(max_num_seqs=32, step_ms=40, answer_tokens=16)
    listing = tmp_path / "targets.json"
    write_file_sd(listing, engine_targets("s", [(0, first.url.split("://")[1])]))
    with Drive([first.url], 1_000_000, replica_capacity=32, replicas_file=str(listing)) as drive:
        wait_until("the job under way", lambda: len(drive.results), until=lambda n: n > 0, timeout_s=30)
        second = sim(max_num_seqs=32, step_ms=40, answer_tokens=16)
        write_file_sd(listing, engine_targets("s", [(0, first.url.split("://")[1]), (1, second.url.split("://")[1])]))
        # the new replica is kept full too (by its own /metrics); a loaded machine takes longer
        wait_until(
            "the added replica running 30", lambda: engine_load(second.url)[0], until=lambda r: r >= 30, timeout_s=60
        )
        endpoints = [ep.url for ep in drive.runner.pool.endpoints]
    assert endpoints == [first.url, second.url]


def test_behind_a_load_balancer_the_replica_list_is_not_followed(sim, tmp_path: Path) -> None:
    engine = sim(max_num_seqs=16, step_ms=5, answer_tokens=4)
    listing = tmp_path / "targets.json"
    write_file_sd(listing, engine_targets("s", [(0, "127.0.0.1:1"), (1, "127.0.0.1:2")]))
    with Drive([engine.url], 3000, replica_capacity=16, replicas_file=str(listing)) as drive:
        drive.wait()
    assert [ep.url for ep in drive.runner.pool.endpoints] == [engine.url]
    assert drive.runner.control is not None and drive.runner.control.follows is False
    assert len(drive.results) == 3000


def test_without_metrics_the_loop_follows_latency(sim) -> None:
    """/metrics answers 404: the loop says so, keeps the replica at its declared capacity plus margin
    (latency stays flat) and every row is answered."""
    engine = sim(max_num_seqs=64, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, no_metrics=True)
    assert httpx.get(engine.url + "/metrics").status_code == 404
    with Drive([engine.url], 1500, replica_capacity=64) as drive:  # ~15 s of batches of 64
        drive.watch(2.0)
        drive.wait()
    ep = drive.runner.pool.endpoints[0]
    assert ep.metrics_ok is False
    assert len(drive.results) == 1500 and all(r.status == "ok" for r in drive.results)
    assert 60 <= drive.outstanding_peak <= 64 + queue_margin(64)


FLOOD = """
import asyncio, sys, aiohttp
async def main(url, n):
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "flood"}]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def loop():
            while True:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
        await asyncio.gather(*(loop() for _ in range(n)))
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


class Flood:
    """Another client of the replica, in its own process: ``n`` requests in flight all the time."""

    def __init__(self, url: str, n: int) -> None:
        self.argv = [sys.executable, "-c", FLOOD, url, str(n)]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Flood:
        self.proc = subprocess.Popen(self.argv)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def test_without_metrics_rising_latency_cuts_the_limit(sim) -> None:
    """No /metrics: once another client floods the replica (its queue, hence the latency, grows past
    twice what this job saw), the job's limit there falls and stays down while the flood lasts."""
    engine = sim(max_num_seqs=16, step_ms=40, step_ms_per_seq=0, answer_tokens=4, no_metrics=True)
    with Drive([engine.url], 1_000_000, replica_capacity=16) as drive:
        ep = drive.runner.pool.endpoints[0]
        wait_until(  # the loop has given up on /metrics and knows the latency's floor
            "the latency fallback at the replica's share",
            lambda: (ep.metrics_ok, ep.lat_floor_ms, ep.limit),
            until=lambda seen: seen[0] is False and seen[1] < float("inf") and seen[2] >= 16,
            timeout_s=30,
        )
        before = ep.limit
        with Flood(engine.url, 150):
            # the latency tells a queue one latency late (~2 s here, longer on a loaded machine)
            wait_until("the limit cut", lambda: ep.limit, until=lambda n: n < 0.6 * before, timeout_s=60)
            after = []
            for _ in range(4):  # and it stays down while the flood lasts
                time.sleep(0.5)
                after.append(ep.limit)
    assert max(after) < 0.6 * before, (before, after)


def test_429s_back_the_limit_off(stub_factory) -> None:
    busy = stub_factory(rate_429=0.5, retry_after_s=0.01, latency_ms=20, seed=3)
    with Drive([busy.url], 1_000_000, replica_capacity=128) as drive:
        # within 2 s quiet; a loaded machine runs the control loop less often
        half = 0.5 * (128 + queue_margin(128))
        wait_until(
            f"the limit below {half}",
            lambda: drive.runner.pool.endpoints[0].limit,
            until=lambda n: n < half,
            timeout_s=20,
        )


def test_explicit_concurrency_is_a_cap(sim) -> None:
    engine = sim(max_num_seqs=64, step_ms=5, answer_tokens=8)
    with Drive([engine.url], 4000, replica_capacity=64, concurrency=20) as drive:
        drive.watch(2.0, every=0.01)
        seen = load_samples(engine.url, 0.5)
        drive.wait()
    assert drive.outstanding_peak <= 20
    assert max(r + w for r, w in seen) <= 20
    assert len(drive.results) == 4000


def test_shards_share_a_replica(sim) -> None:
    """Two processes' worth of runners (nshards=2) on one replica: each starts at half of it; together
    they keep it full without a long queue."""
    engine = sim(max_num_seqs=64, step_ms=40, step_ms_per_seq=0.02, answer_tokens=16, answer_tokens_spread=8)
    with (
        Drive([engine.url], 1_000_000, replica_capacity=64, nshards=2) as a,
        Drive([engine.url], 1_000_000, replica_capacity=64, nshards=2) as b,
    ):
        wait_until(  # both loops have filled it once before the window is measured
            "the replica running its batch",
            lambda: engine_load(engine.url),
            until=lambda load: load[0] >= 60 and load[1] <= 3 * queue_margin(64),
            timeout_s=60,
        )
        seen = load_samples(engine.url, 2.0)
        shares = (a.runner.pool.endpoints[0].limit, b.runner.pool.endpoints[0].limit)
    assert sorted(r for r, _ in seen)[len(seen) // 2] >= 60, seen
    # short: two loops each judging the replica on its own (without sharing, 2 x 72 would leave 80 waiting)
    assert sorted(w for _, w in seen)[len(seen) // 2] <= 3 * queue_margin(64), seen
    assert all(s >= 16 for s in shares), shares


def test_concurrency_above_the_fd_limit_is_clamped_with_a_warning() -> None:
    cap, warning = process_cap(10**9)
    assert cap < 10**9 and warning is not None
    assert "RLIMIT_NOFILE" in warning and f"clamped to {cap}" in warning and str(cap + FD_RESERVE) in warning
    assert process_cap(8) == (8, None)


def test_simulator_throughput_curve() -> None:
    """The documented curve (module doc of prefect_swarm.testing.gpu_sim)."""
    opts = SimOptions()
    assert [round(opts.rows_per_s(b)) for b in (16, 64, 128, 256)] == [32, 110, 187, 288]
    assert round(opts.rows_per_s(1), 1) == 2.1


def test_simulator_long_tail_of_answer_lengths() -> None:
    """``long_tail``: that share of the answers (a seeded draw per request body) is ``long_tail_x`` as long."""
    from prefect_swarm.testing.gpu_sim import answer_tokens

    opts = SimOptions(answer_tokens=32, long_tail=0.05, long_tail_x=8)
    lengths = [answer_tokens({"max_tokens": 1024}, f"row {i}".encode(), opts) for i in range(4000)]
    assert set(lengths) == {32, 256} and 0.04 < lengths.count(256) / 4000 < 0.06
    assert lengths == [answer_tokens({"max_tokens": 1024}, f"row {i}".encode(), opts) for i in range(4000)]
    assert answer_tokens({"max_tokens": 100}, b"row 7", opts) <= 100  # never past max_tokens


def test_simulator_batches_and_reports_like_vllm(sim) -> None:
    """Requests beyond max_num_seqs wait; one request alone takes its answer's tokens in steps; the
    answer's usage and the token counters agree."""
    engine = sim(max_num_seqs=4, step_ms=100, step_ms_per_seq=0, answer_tokens=10, prefill_ms_per_token=0)

    async def burst() -> tuple[list[float], tuple[float, float], dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(i: int) -> tuple[float, dict[str, Any]]:
                t = time.monotonic()
                body = {"model": "stub-model", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 50}
                r = await client.post(engine.url + CHAT_PATH, json=body)
                return time.monotonic() - t, r.json()

            tasks = [asyncio.create_task(one(i)) for i in range(8)]
            await asyncio.sleep(0.4)
            load = engine_load(engine.url)
            done = await asyncio.gather(*tasks)
        return [d for d, _ in done], load, done[0][1]

    took, load, answer = asyncio.run(burst())
    assert load == (4.0, 4.0)  # four run, four wait
    assert answer["usage"]["completion_tokens"] == 10 and answer["usage"]["prompt_tokens"] == 2
    first, second = sorted(took)[:4], sorted(took)[4:]
    assert all(0.95 <= t <= 1.9 for t in first), took  # 10 steps of 100 ms
    assert all(t >= 1.95 for t in second), took  # after the first batch left
    samples = parse(httpx.get(engine.url + "/metrics").text)
    assert total(samples, "vllm:request_success_total") == 8
    assert total(samples, "vllm:generation_tokens_total") == 80


def test_simulator_prefix_cache_skips_prefill(sim) -> None:
    engine = sim(prefix_cache=True, block_size=4, step_ms=1, answer_tokens=1)
    shared = " ".join(f"w{i}" for i in range(40))
    for i in range(3):
        body = {"model": "stub-model", "messages": [{"role": "user", "content": f"{shared} tail{i}"}]}
        assert httpx.post(engine.url + CHAT_PATH, json=body, timeout=10).status_code == 200
    samples = parse(httpx.get(engine.url + "/metrics").text)
    assert total(samples, "vllm:prefix_cache_queries_total") == 3 * 41
    assert total(samples, "vllm:prefix_cache_hits_total") == 2 * 40  # the 40 shared words, twice


def test_prefix_affinity_sends_a_shared_prefix_to_one_replica(sim) -> None:
    """Rows of two long shared prefixes on two replicas with room, each caching one prefix: with
    affinity each prefix meets its replica's cache; spread over both, they would evict each other."""
    # each replica's cache holds one prefix (18 blocks of 16 tokens), not two
    a = sim(prefix_cache=True, block_size=16, prefix_cache_blocks=20, step_ms=5, answer_tokens=4)
    b = sim(prefix_cache=True, block_size=16, prefix_cache_blocks=20, step_ms=5, answer_tokens=4)

    def body(prefix: str, i: int) -> bytes:
        text = f"{prefix} question {i}"
        return json.dumps({"model": "stub-model", "messages": [{"role": "user", "content": text}]}).encode()

    prefixes = [" ".join(f"p{k}w{i}" for i in range(300)) for k in range(2)]

    def keyed(n: int) -> Iterator[Item]:
        for i in range(n):
            data = body(prefixes[i % 2], i)
            yield Item(i, str(i), CHAT_PATH, data, prefix_key(data))

    assert all(prefix_key(body(p, i)) == prefix_key(body(p, 0)) for p in prefixes for i in (1, 99))
    results: list[RowResult] = []
    runner = Runner(ChatCompletionJob(), [a.url, b.url], RunnerConfig(replica_capacity=256), results.append)
    asyncio.run(runner.run(keyed(400)))
    assert len(results) == 400
    hits = queries = 0.0
    for engine in (a, b):
        samples = parse(httpx.get(engine.url + "/metrics").text)
        hits += total(samples, "vllm:prefix_cache_hits_total") or 0
        queries += total(samples, "vllm:prefix_cache_queries_total") or 0
    assert hits / queries > 0.9  # each prefix prefilled once, on its replica
    assert prefix_key(b"x" * 100) == 0  # a short body shares no long prefix
    owners = {key: ep.url for key, ep in runner.pool.owners.items()}
    assert sorted(owners.values()) == sorted([a.url, b.url])  # one prefix each: the keys are spread


def test_concurrency_zero_is_refused_before_anything() -> None:
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app
    from prefect_swarm.jobs.spec import JobSpec

    res = CliRunner().invoke(app, ["job", "submit", "-n", "nowhere", "--input", "x.parquet", "--concurrency", "0"])
    assert res.exit_code == 2 and "--concurrency" in res.output and "greater than or equal to" in res.output, res.output
    with pytest.raises(ValueError, match="concurrency"):
        JobSpec(input="in.parquet", output="out.parquet", concurrency=0)


def test_a_process_left_alone_fills_the_replica_at_once() -> None:
    """Eight processes shared a replica batching 1024 (found); seven are done (the end of a job): the one
    left holds its share (34: an eighth of the 256 it started from) and sees the room. It takes what the
    replica misses in one step (before: half its limit a step, 34 -> 51); while all eight share the
    replica, one step adds what it misses, no more."""
    from prefect_swarm.jobs.dispatch.control import Controller
    from prefect_swarm.jobs.dispatch.runner import EndpointPool

    def loop() -> tuple[Controller, Any]:
        pool = EndpointPool(["http://replica"])
        ctl = Controller(pool, capacity=None, nshards=8, cap=100_000)
        ep = pool.endpoints[0]
        ep.found = ep.peak = 1024.0
        return ctl, ep

    ctl, ep = loop()
    for _ in range(3):  # one judgment: HISTORY samples
        ep.outstanding = math.ceil(ep.limit)
        ctl._by_metrics(ep, min(1024, ep.outstanding), max(0, ep.outstanding - 1024))
    assert ep.limit >= 0.95 * 1024, ep.limit

    loops = [loop() for _ in range(8)]
    for _ in range(3):
        held = [math.ceil(ep.limit * 0.9) for _, ep in loops]  # the replica misses a tenth
        for (ctl, ep), n in zip(loops, held, strict=True):
            ep.outstanding = n
            ctl._by_metrics(ep, min(1024, sum(held)), max(0, sum(held) - 1024))
    total = sum(ep.limit for _, ep in loops)
    assert 1024 <= total <= 1024 + 2 * ctl.margin_of(loops[0][1]), total
