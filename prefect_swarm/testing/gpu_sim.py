"""A GPU-like engine simulator: continuous batching on a clock, for throughput tests and benchmarks.

    python -m prefect_swarm.testing.gpu_sim --port 8000 [--max-num-seqs 256] [--step-ms 15]
        [--step-ms-per-seq 0.05] [--prefill-ms-per-token 0.02] [--answer-tokens 32] [--prefix-cache]
        [--long-tail 0.05 --long-tail-x 8]

It speaks the stub engine's HTTP (same routes, same OpenAI-shaped answers and 400s, same
``--api-key`` and ``--startup-delay-s``: :class:`~prefect_swarm.testing.stub_engine.StubProtocol`
underneath), but answers on an engine's schedule instead of at once, so a client's in-flight
control matters as it does on a GPU:

- **Continuous batching.** Requests wait in a FIFO queue; at each engine step up to
  ``max_num_seqs`` sequences run. A request admitted at a step boundary joins the batch there; each
  step generates one token for every running sequence; a sequence leaves the batch (and its answer
  is sent) at the end of the step that generates its last token.
- **Step time** grows with the running batch: ``(step_ms + step_ms_per_seq x running +
  prefill_ms_per_token x prompt tokens admitted this step) / speed``. A prompt's tokens are its
  words (the stub's count). A cached prefix skips its prefill (below).
- **Answer length**: ``answer_tokens`` (default 32), or a seeded draw uniform in ``answer_tokens ±
  answer_tokens_spread`` (a pure function of the request body and ``--seed``), never more than the
  request's ``max_tokens``; with ``ignore_eos: true`` in the request, exactly ``max_tokens``.
  ``long_tail`` (a share, 0 by default) of the answers are ``long_tail_x`` times as long (the same
  seeded draw decides which): a long tail of answer lengths, as free-form generation has.
- **Prefix cache** (``--prefix-cache``, per replica): prompts are cut in blocks of ``block_size``
  tokens, each identified by the hash of everything up to it; the leading blocks already cached are
  not prefilled. LRU over ``prefix_cache_blocks`` blocks.
- **/metrics** in vLLM's names: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (tokens held by running sequences / ``kv_cache_tokens``),
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
  ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (in tokens, as vLLM V1);
  ``--no-metrics`` answers it with a 404 (an engine without metrics). ``--speed`` divides every step
  time (a slower GPU).

**Sleep mode**, as vLLM's OpenAI server has it (``--enable-sleep-mode``, routes only with
``VLLM_SERVER_DEV_MODE=1`` in the environment; CUDA and ROCm only on a real vLLM):

- Without dev mode the routes do not exist: ``/sleep``, ``/wake_up``, ``/is_sleeping`` answer 404
  ``{"detail":"Not Found"}`` (FastAPI's). With dev mode but without ``--enable-sleep-mode``,
  ``POST /sleep`` and ``POST /wake_up`` fail with a 500 (vLLM asserts "Sleep mode is not enabled in
  the model config") and ``GET /is_sleeping`` says false. A route asked with the wrong method is a 405.
- ``POST /sleep?level=1|2`` (default 1; a level that is not a whole number is a 500, as vLLM's
  ``int()`` raises): requests waiting or running are aborted (answered 503: vLLM's ``mode=abort``),
  the engine takes ``--sleep-s`` to offload, then answers 200 with an empty body. Level 1 keeps the
  weights in CPU memory; any other level discards them. Sleeping again is a no-op 200.
- ``POST /wake_up[?tags=weights&tags=kv_cache]`` (no tags: both) wakes what the tags name and answers
  200 with an empty body once done: weights take ``--wake-s`` after level 1 (copied back from CPU
  memory) and are reallocated at once after level 2, as is the KV cache. An unknown tag, or waking an
  engine that is awake, is a no-op 200 (vLLM logs a warning).
- **After a level-2 sleep the weights are gone**: once woken, their memory holds nothing the model
  learnt, and until ``POST /collective_rpc`` ``{"method": "reload_weights"}`` has loaded them again
  (``--wake-level2-s``; completions are refused meanwhile) every completion answers 200 with a wrong
  text, marked ``GARBLED`` (a real vLLM answers gibberish, as fluently). ``reload_weights`` while the
  weights still sleep is a 500 (there is no memory to load into). ``POST /reset_prefix_cache``
  answers ``{"success": bool}`` (false while requests run) and empties the prefix cache, as vLLM's.
  ``/collective_rpc`` (a JSON object with a ``method``: else 400; a method the workers lack: 500)
  and ``/reset_prefix_cache`` exist only in dev mode too, with or without sleep mode.
- ``GET /is_sleeping`` -> ``{"is_sleeping": bool}``: true from the moment ``/sleep`` is asked until
  every tag is awake again.
- While asleep (and while going to sleep or waking) completions answer 503 with an OpenAI error body
  (vLLM's protected routes); ``/health``, ``/v1/models`` and ``/metrics`` answer as usual.
- A cold start (process start to ``/health`` 200, the model load) is ``--startup-delay-s`` (the stub's).

Throughput curve (defaults, answers of T = 32 tokens, short prompts): with B sequences running,
a step takes ``15 + 0.05 B`` ms and B / T rows finish per step, so

    rows/s(B) = B / (T x (15 + 0.05 B) ms):   B=1: 2.1   B=16: 32   B=64: 110   B=128: 187   B=256: 288

One request alone is slow; a replica reaches its best only with ``max_num_seqs`` requests in
flight, as a real GPU does. Queued requests beyond ``max_num_seqs`` add latency, not throughput.

Cheap in CPU: one asyncio loop, one timer per engine step (not per token, not per sequence:
finishing sequences are filed by the step they end at), so eight replicas fit on one core.
Deterministic: the schedule depends only on arrival order and the knobs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import urllib.parse
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from prefect_swarm.backends.engine import VLLM_DEV_MODE
from prefect_swarm.testing.stub_engine import (
    StubOptions,
    StubProtocol,
    _prompt_text,
    answer,
    serve_until_signalled,
    vllm_metrics,
)
from prefect_swarm.testing.stub_engine import parse_args as stub_parse_args

MODULE = "prefect_swarm.testing.gpu_sim"
"""``module`` for :func:`~prefect_swarm.testing.stub_engine.engine_command` and ``StubEngine``."""


@dataclass
class SimOptions:
    """The simulated engine's knobs (see the module doc)."""

    max_num_seqs: int = 256
    step_ms: float = 15.0
    step_ms_per_seq: float = 0.05
    prefill_ms_per_token: float = 0.02
    answer_tokens: int = 32
    answer_tokens_spread: int = 0
    long_tail: float = 0.0
    long_tail_x: float = 8.0
    prefix_cache: bool = False
    prefix_cache_blocks: int = 8192
    block_size: int = 16
    kv_cache_tokens: int = 262_144
    speed: float = 1.0
    """Divides every step time (0.5: a replica half as fast)."""
    seed: int = 0
    metrics: bool = True
    """Serve ``/metrics`` (off: 404, as SGLang without ``--enable-metrics``)."""
    sleep_mode: bool = False
    """``--enable-sleep-mode``: ``/sleep`` and ``/wake_up`` work (they also need dev mode)."""
    dev_mode: bool = False
    """``VLLM_SERVER_DEV_MODE=1`` in the environment: the sleep routes exist."""
    sleep_s: float = 0.2
    """Seconds ``/sleep`` takes (offloading the weights, freeing the KV cache)."""
    wake_s: float = 0.5
    """Seconds waking the weights takes after a level-1 sleep (copied back from CPU memory)."""
    wake_level2_s: float = 2.0
    """Seconds ``reload_weights`` takes (a level-2 sleep discarded the weights: loaded again)."""

    def step_s(self, running: int, prefill_tokens: int) -> float:
        """Seconds one engine step takes."""
        ms = self.step_ms + self.step_ms_per_seq * running + self.prefill_ms_per_token * prefill_tokens
        return ms / 1000 / self.speed

    def rows_per_s(self, batch: int, tokens: int | None = None) -> float:
        """The throughput curve: rows/s with ``batch`` sequences running (prefill left out)."""
        return batch / ((tokens or self.answer_tokens) * self.step_s(batch, 0))


@dataclass(slots=True)
class Seq:
    """One request in the engine."""

    proto: StubProtocol
    payload: bytes
    prompt_words: list[str]
    tokens: int
    kv_tokens: int = 0


@dataclass
class Engine:
    """The scheduler: a waiting queue, a running batch, one timer per step."""

    opts: SimOptions
    stats: Counter[str] = field(default_factory=Counter)
    waiting: deque[Seq] = field(default_factory=deque)
    ending: dict[int, list[Seq]] = field(default_factory=dict)
    """Step index -> sequences whose last token that step generates."""
    running: int = 0
    kv_tokens: int = 0
    step: int = 0
    busy: bool = False
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
    asleep: set[str] = field(default_factory=set)
    """Tags (``weights``, ``kv_cache``) now asleep; empty when awake."""
    paused: int = 0
    """Sleep or wake transitions under way: completions are refused meanwhile."""
    level: int = 0
    """The level of the last sleep (0: never slept)."""
    weights_lost: bool = False
    """A level-2 sleep discarded the weights and ``reload_weights`` has not loaded them since."""

    @property
    def refusing(self) -> bool:
        """Completions are refused: asleep, or going to sleep or waking."""
        return bool(self.asleep) or self.paused > 0

    def abort_all(self, send: Any) -> int:
        """Drop every waiting and running sequence, answering each with ``send(seq)``; return how many."""
        seqs = [*self.waiting, *(seq for batch in self.ending.values() for seq in batch)]
        self.waiting.clear()
        self.ending.clear()
        self.running = self.kv_tokens = 0
        for seq in seqs:
            send(seq)
        return len(seqs)

    async def sleep(self, level: int) -> None:
        """Offload (level 1) or discard the weights and free the KV cache; ``sleep_s`` long."""
        if self.asleep:
            return  # vLLM: "Executor is already sleeping." (a warning)
        self.paused += 1
        try:
            await asyncio.sleep(self.opts.sleep_s)
        finally:
            self.paused -= 1
        self.asleep, self.level = {"weights", "kv_cache"}, level
        self.weights_lost = self.weights_lost or level != 1
        self.cache.clear()

    async def wake(self, tags: list[str]) -> None:
        """Wake ``tags`` (all when empty); unknown tags or an awake engine are a no-op, as in vLLM."""
        wanted = set(tags) or set(self.asleep)
        if not self.asleep or not wanted <= self.asleep:
            return
        self.paused += 1
        try:
            if "weights" in wanted and self.level == 1:
                await asyncio.sleep(self.opts.wake_s)  # after level 2 only reallocated: nothing to copy
        finally:
            self.paused -= 1
        self.asleep -= wanted

    async def reload_weights(self) -> bool:
        """Load the weights again (``wake_level2_s``); False (nothing done) while they sleep."""
        if "weights" in self.asleep:
            return False
        self.paused += 1
        try:
            await asyncio.sleep(self.opts.wake_level2_s)
        finally:
            self.paused -= 1
        self.weights_lost = False
        return True

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests hold blocks, as vLLM's."""
        if self.running or self.waiting:
            return False
        self.cache.clear()
        return True

    def submit(self, seq: Seq) -> None:
        """Queue a request; wake the engine when idle."""
        self.waiting.append(seq)
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().call_soon(self._begin_step)

    def _admit(self) -> int:
        """Move waiting sequences into the batch; return the prompt tokens to prefill this step."""
        prefill = 0
        while self.waiting and self.running < self.opts.max_num_seqs:
            seq = self.waiting.popleft()
            prefill += self._prefill_tokens(seq.prompt_words)
            seq.kv_tokens = len(seq.prompt_words) + seq.tokens
            self.kv_tokens += seq.kv_tokens
            self.running += 1
            self.ending.setdefault(self.step + seq.tokens - 1, []).append(seq)
        return prefill

    def _prefill_tokens(self, words: list[str]) -> int:
        """Tokens of ``words`` to prefill: all of them, less a cached prefix (which this prompt then caches)."""
        n = len(words)
        self.stats["prompt_tokens"] += n
        if not self.opts.prefix_cache:
            return n
        bs, cache, hit = self.opts.block_size, self.cache, 0
        h = 0
        missed = False
        for end in range(bs, n + 1, bs):
            h = hash((h, *words[end - bs : end]))
            if not missed and h in cache:
                cache.move_to_end(h)
                hit += bs
            else:
                missed = True
                cache[h] = None
        while len(cache) > self.opts.prefix_cache_blocks:
            cache.popitem(last=False)
        self.stats["prefix_queries"] += n
        self.stats["prefix_hits"] += hit
        return n - hit

    def _begin_step(self) -> None:
        prefill = self._admit()
        if not self.running:
            self.busy = False
            return
        loop = asyncio.get_running_loop()
        loop.call_later(self.opts.step_s(self.running, prefill), self._end_step)

    def _end_step(self) -> None:
        self.stats["generation_tokens"] += self.running
        for seq in self.ending.pop(self.step, ()):
            self.running -= 1
            self.kv_tokens -= seq.kv_tokens
            self.stats["ok"] += 1
            seq.proto.send(200, seq.payload)
        self.step += 1
        self._begin_step()

    def metrics(self, model: str) -> str:
        """vLLM-shaped ``/metrics``."""
        stats = Counter(self.stats)
        stats["running"] = self.running
        queries, hits = self.stats["prefix_queries"], self.stats["prefix_hits"]
        extra = (
            ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.", queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", hits),
        )
        usage = min(1.0, self.kv_tokens / max(1, self.opts.kv_cache_tokens))
        return vllm_metrics(model, stats, waiting=len(self.waiting), kv_usage=usage, extra=extra)


def answer_tokens(req: dict[str, Any], body: bytes, opts: SimOptions) -> int:
    """How many tokens the answer to ``req`` has (see the module doc)."""
    limit = req.get("max_completion_tokens") or req.get("max_tokens")
    if req.get("ignore_eos") and isinstance(limit, int):
        return max(1, limit)
    n = opts.answer_tokens
    if opts.answer_tokens_spread or opts.long_tail:
        draw = random.Random(hashlib.sha256(body + str(opts.seed).encode()).digest())
        spread = opts.answer_tokens_spread
        n += draw.randint(-spread, spread) if spread else 0
        if draw.random() < opts.long_tail:
            n = round(n * opts.long_tail_x)
    if isinstance(limit, int):
        n = min(n, limit)
    return max(1, n)


class SimProtocol(StubProtocol):
    """The stub's HTTP connection, with completions scheduled by :class:`Engine` and its ``/metrics``."""

    engine: Engine = Engine(SimOptions())
    stats: Counter[str] = Counter()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        """Route one request (``/metrics`` from the engine, the dev routes; the rest as the stub)."""
        route, _, query = path.partition("?")
        if route in DEV_ROUTES:
            if not self.refused(method, path, headers):
                self.dev_route(method, route, urllib.parse.parse_qs(query), body)
        elif path.startswith("/metrics") and not self.engine.opts.metrics:
            self.send(404, b'{"error":{"message":"not found"}}')
        elif path.startswith("/metrics"):
            text = self.engine.metrics(self.opts.model)
            self.send(200, text.encode(), content_type="text/plain; version=0.0.4")
        else:
            super().handle(method, path, headers, body)

    def dev_route(self, method: str, route: str, query: dict[str, list[str]], body: bytes) -> None:
        """vLLM's dev-mode routes as it answers them (see the module doc)."""
        engine = self.engine
        if not engine.opts.dev_mode:
            self.send(404, b'{"detail":"Not Found"}')
        elif method != DEV_ROUTES[route]:
            self.send(405, b'{"detail":"Method Not Allowed"}')
        elif route == "/collective_rpc":
            self.collective_rpc(body)
        elif route == "/reset_prefix_cache":
            self.send(200, json.dumps({"success": engine.reset_prefix_cache()}).encode())
        elif route == "/is_sleeping":
            self.send(200, json.dumps({"is_sleeping": engine.refusing}).encode())
        elif not engine.opts.sleep_mode:
            self.send(500, b"Internal Server Error", content_type="text/plain; charset=utf-8")
        elif route == "/sleep":
            try:
                level = int(query.get("level", ["1"])[0])
            except ValueError:
                self.send(500, b"Internal Server Error", content_type="text/plain; charset=utf-8")
                return
            self.stats["aborted"] += engine.abort_all(_abort)
            self._after(engine.sleep(level))
        else:
            self._after(engine.wake(query.get("tags", [])))

    def collective_rpc(self, body: bytes) -> None:
        """``POST /collective_rpc``: only ``reload_weights`` is a method the simulated workers have."""
        try:
            req = json.loads(body or b"null")
        except ValueError as exc:
            self.send(400, json.dumps({"detail": f"JSON decode error: {exc}"}).encode())
            return
        if not isinstance(req, dict):
            self.send(400, b'{"detail":"Request body must be a JSON object"}')
        elif req.get("method") is None:
            self.send(400, b'{"detail":"Missing \'method\' in request body"}')
        elif req["method"] != "reload_weights":
            self.send(500, b"Internal Server Error", content_type="text/plain; charset=utf-8")
        else:

            async def run() -> None:
                if await self.engine.reload_weights():
                    self.send(200, b'{"results":[null]}')
                else:
                    self.send(500, b"Internal Server Error", content_type="text/plain; charset=utf-8")

            _keep(asyncio.get_running_loop().create_task(run()))

    def _after(self, transition: Any) -> None:
        """Answer 200 with an empty body once ``transition`` (a coroutine) has finished."""

        async def run() -> None:
            await transition
            self.send(200, b"")

        _keep(asyncio.get_running_loop().create_task(run()))

    def complete(self, path: str, headers: dict[str, str], body: bytes) -> None:
        """Queue a completion in the engine; its answer is sent when its last token is generated.
        While the engine sleeps it is refused with a 503, as vLLM's protected routes are."""
        self.stats["requests"] += 1
        req = self.accepted(headers, body)
        if req is None:
            return
        engine = self.engine
        if engine.refusing:
            self.stats["refused_asleep"] += 1
            self.send(503, SLEEPING)
            return
        words = _prompt_text(req).split() or [""]
        tokens = answer_tokens(req, body, engine.opts)
        out = answer(path, req, self.opts.model)
        out["usage"] = {"prompt_tokens": len(words), "completion_tokens": tokens, "total_tokens": len(words) + tokens}
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        if out.get("choices"):
            out["choices"][0]["finish_reason"] = "length" if tokens == limit else "stop"
        if engine.weights_lost:  # woken from level 2 without reload_weights: the weights are noise
            self.stats["garbled"] += 1
            for choice in out.get("choices", []):
                if "message" in choice:
                    choice["message"]["content"] = GARBLED
                else:
                    choice["text"] = GARBLED
        engine.submit(Seq(self, json.dumps(out).encode(), words, tokens))


DEV_ROUTES = {
    "/sleep": "POST",
    "/wake_up": "POST",
    "/is_sleeping": "GET",
    "/collective_rpc": "POST",
    "/reset_prefix_cache": "POST",
}
"""vLLM's dev-mode routes the simulator serves (sleep mode's and what a level-2 wake needs) -> their method."""

GARBLED = "GARBLED: weights discarded by a level-2 sleep and not reloaded"
"""The text of every answer between a level-2 wake and ``reload_weights``."""

SLEEPING = json.dumps(
    {"error": {"message": "The model is sleeping; wake it up first.", "type": "ServiceUnavailableError", "code": 503}}
).encode()
"""What a completion gets while the engine sleeps."""

_ABORTED = json.dumps(
    {"error": {"message": "Request aborted: the engine went to sleep.", "type": "ServiceUnavailableError", "code": 503}}
).encode()

_TRANSITIONS: set[asyncio.Task[None]] = set()
"""Sleep and wake transitions under way (kept referenced until done)."""


def _keep(task: asyncio.Task[None]) -> None:
    """Keep ``task`` referenced until it is done."""
    _TRANSITIONS.add(task)
    task.add_done_callback(_TRANSITIONS.discard)


def _abort(seq: Seq) -> None:
    seq.proto.send(503, _ABORTED)


async def serve(host: str, port: int, opts: StubOptions, sim: SimOptions) -> None:
    """Serve until signalled."""
    SimProtocol.opts = opts
    SimProtocol.engine = Engine(sim)
    SimProtocol.stats = SimProtocol.engine.stats  # one set of counters: /stats and /metrics agree
    await serve_until_signalled(SimProtocol, host, port)


def parse_args(argv: list[str] | None = None) -> tuple[str, int, StubOptions, SimOptions]:
    """CLI arguments to (host, port, HTTP options, engine options); unknown flags are the stub's or ignored."""
    d = SimOptions()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most sequences in a batch")
    ap.add_argument("--step-ms", type=float, default=d.step_ms, help="fixed part of an engine step")
    ap.add_argument("--step-ms-per-seq", type=float, default=d.step_ms_per_seq, help="step time per running seq")
    ap.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token)
    ap.add_argument("--answer-tokens", type=int, default=d.answer_tokens)
    ap.add_argument("--answer-tokens-spread", type=int, default=d.answer_tokens_spread)
    ap.add_argument("--long-tail", type=float, default=d.long_tail, help="share of answers long_tail_x as long")
    ap.add_argument("--long-tail-x", type=float, default=d.long_tail_x)
    ap.add_argument("--prefix-cache", action="store_true", help="cache prompt prefixes (per replica)")
    ap.add_argument("--prefix-cache-blocks", type=int, default=d.prefix_cache_blocks)
    ap.add_argument("--block-size", type=int, default=d.block_size)
    ap.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens)
    ap.add_argument("--speed", type=float, default=d.speed, help="step times are divided by this")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--no-metrics", action="store_true", help="answer /metrics with a 404")
    ap.add_argument("--enable-sleep-mode", action="store_true", help="vLLM's flag: /sleep and /wake_up work")
    ap.add_argument("--sleep-s", type=float, default=d.sleep_s, help="seconds /sleep takes")
    ap.add_argument("--wake-s", type=float, default=d.wake_s, help="seconds waking takes after a level-1 sleep")
    ap.add_argument("--wake-level2-s", type=float, default=d.wake_level2_s, help="seconds reload_weights takes")
    a, rest = ap.parse_known_args(argv)
    if a.max_num_seqs < 1 or a.speed <= 0 or a.answer_tokens < 1 or a.block_size < 1:
        ap.error("--max-num-seqs, --answer-tokens and --block-size must be >= 1 and --speed > 0")
    sim = SimOptions(
        max_num_seqs=a.max_num_seqs,
        step_ms=a.step_ms,
        step_ms_per_seq=a.step_ms_per_seq,
        prefill_ms_per_token=a.prefill_ms_per_token,
        answer_tokens=a.answer_tokens,
        answer_tokens_spread=a.answer_tokens_spread,
        long_tail=a.long_tail,
        long_tail_x=a.long_tail_x,
        prefix_cache=a.prefix_cache,
        prefix_cache_blocks=a.prefix_cache_blocks,
        block_size=a.block_size,
        kv_cache_tokens=a.kv_cache_tokens,
        speed=a.speed,
        seed=a.seed,
        metrics=not a.no_metrics,
        sleep_mode=a.enable_sleep_mode,
        dev_mode=os.environ.get(VLLM_DEV_MODE, "0") not in ("", "0"),
        sleep_s=a.sleep_s,
        wake_s=a.wake_s,
        wake_level2_s=a.wake_level2_s,
    )
    host, port, opts = stub_parse_args(rest)
    return host, port, opts, sim


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    asyncio.run(serve(*parse_args(argv)))


if __name__ == "__main__":
    main()
