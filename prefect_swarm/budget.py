"""The swarm's one spend account: what a cap is, what has been spent, what is reserved, and the final word.

A cap is the swarm's ``backend.cost`` (``max_gpu_hours``, ``max_cost_usd``; a flow run's own caps tighten
it for that run: :meth:`~prefect_swarm.config.cost.CostConfig.tightened`). Every way a job reaches a
swarm (the CLI attached or detached, flows, pipelines, `job retry`, every backend) goes through
:func:`prefect_swarm.launch.for_swarm`, which puts the swarm's :class:`SwarmBudget` into the job spec.
The job processes hold it by **admission**: the runner asks an :class:`Admission` before EVERY request
is sent (after its wait for the rate limits), and a request that would pass the cap is never sent; the
job then stops issuing at once (a stop sends nothing that is queued: the requests in flight finish).

* **Token-priced caps** (a priced provider behind an external swarm): :class:`TokenPurse`. A request
  reserves its worst-case cost (:func:`worst_case_usd`: its prompt at one token per
  ``PROMPT_BYTES_PER_TOKEN`` bytes of body, plus ``max_tokens`` x ``n`` completion tokens,
  ``DEFAULT_COMPLETION_TOKENS`` when the request sets no ``max_tokens``); the answer's usage replaces
  the reservation (an HTTP error answer: nothing; no answer at all: the reservation stays spent, the
  provider may have billed it). The account is the swarm's: :class:`Account`, a JSON file in the
  swarm's folder changed only under a file lock, shared by every process of every job on the swarm
  (several shard processes of several jobs). A process takes grants from it (at most ``GRANT_SHARE`` of
  the cap at a time, less as the cap nears) and reserves within them, so a request costs no lock; a
  grant counts as spent until its process settles it (a process killed -9 leaves its last grant counted:
  at most ``GRANT_SHARE`` of the cap). So a token-priced cap is never passed while answers stay within
  their request's ``max_tokens``.
* **GPU-time caps** (``max_gpu_hours``, or ``max_cost_usd`` at a GPU-hour price): :class:`GpuClock`.
  The swarm's GPU-hours (its backend's figure at submit, counted on at the GPUs it held) are reserved
  ``CHECK_AHEAD_S`` ahead (the swarm's time until its next check): past the cap by then, no request is
  sent. The swarm itself is stopped at the cap by its sidecar (the local watchdogs, the Slurm LB job)
  and by whoever waits on a job (:class:`BudgetGuard`); a GPU-hour cap is passed by at most the time
  from the cap to the swarm's stop (docs/budgets.md gives the measured figures).

The final word (:func:`final_word`) is the spend when the job's processes have exited, the cap and the
rows left: the CLI's message, `job status`, the flow's state message, the ``budget-reached`` event and
the cost report all give it. A rerun with a larger cap resumes from the checkpoints: each row once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import Field

from prefect_swarm.config.base import StrictModel
from prefect_swarm.config.cost import CostConfig
from prefect_swarm.exceptions import BudgetReached
from prefect_swarm.paths import atomic_write_json, file_lock, read_json

log = logging.getLogger("prefect_swarm.cost")

BUDGET_REACHED = "budget reached"
"""Names a stop at the budget in every message of one (the guard's, a sidecar's stop reason in ``status``)."""
WARN_AT = 0.8
"""Share of a budget at which the guard warns (once)."""
CHECK_AHEAD_S = 5.0
"""A GPU-time cap is reserved this far ahead: the longest wait of a swarm's sidecar between two checks
(the Slurm LB job's; the local watchdogs check every second)."""
GRANT_SHARE = 0.01
"""The largest grant a process takes from a token account at once, as a share of the cap."""
PROMPT_BYTES_PER_TOKEN = 2
"""A request's prompt is reserved at one token per this many bytes of its JSON body (a token is at least
one character of text, and the body's JSON keys and quoting outweigh the chat template's tokens)."""
DEFAULT_COMPLETION_TOKENS = 256
"""Completion tokens reserved for a request that sets no ``max_tokens`` (set it for a tight cap)."""


class BudgetGuard:
    """Hold a swarm to its budget when it is checked from outside its requests (a sidecar, whoever waits on
    a job): :meth:`check` warns once at 80 % and raises BudgetReached past it.

    ``usage`` reads the swarm's ``(GPU-hours, resource shape)`` (from its serving backend's
    ``gpu_usage``); it is asked at most every ``every_s`` seconds (sacct and cloud APIs are not free).
    ``bill``: the swarm's spend in USD when it is not GPU time (its token :class:`Account`).
    """

    def __init__(
        self,
        name: str,
        cost: CostConfig,
        usage: Callable[[], tuple[float | None, str | None]],
        every_s: float = 5.0,
        bill: Callable[[], float | None] | None = None,
    ) -> None:
        self.name, self.cost, self.usage, self.every_s, self.bill = name, cost, usage, every_s, bill
        self.next_at = 0.0
        self.warned = False

    def check(self) -> None:
        """Raise BudgetReached when the swarm is past its budget (a usage that cannot be read is let pass)."""
        if not self.cost.capped or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        try:
            hours, shape = self.usage()
        except Exception as exc:  # a budget is not a reason to fail on a flaky accounting call
            log.warning("swarm %s: could not read its GPU usage for the budget: %s", self.name, exc)
            return
        verdict = self.cost.budget(hours, shape, usd=self.bill() if self.bill is not None else None)
        if verdict is None:
            return
        share, text = verdict
        if share >= 1:
            raise BudgetReached(f"swarm '{self.name}': {BUDGET_REACHED}: {text}")
        if share >= WARN_AT and not self.warned:
            self.warned = True
            log.warning("swarm %s: %.0f%% of its budget used: %s", self.name, 100 * share, text)


class SwarmBudget(StrictModel):
    """A swarm's budget as its job processes hold it (``JobSpec.budget``, filled at submit): the caps and
    the price, and where its spend is: the swarm's GPU-hours when the job was submitted (its backend's
    figure), counted on at the GPUs it held then, or its token :class:`Account` (``account``). So a job
    stops at the cap also when nobody waits on it (``--detach``); each submission takes a fresh figure."""

    swarm: str
    cost: CostConfig
    gpu_hours: Annotated[float, Field(ge=0)] = 0.0
    """The swarm's GPU-hours at ``at``."""
    at: float
    """Unix time of ``gpu_hours``."""
    gpus: Annotated[int, Field(ge=0)] = 0
    """GPUs the swarm held then."""
    shape: str | None = None
    account: str | None = None
    """The swarm's token account (:attr:`~prefect_swarm.paths.SwarmPaths.budget_account`): set, the cap is
    held on tokens (:class:`TokenPurse`), not GPU time."""
    epoch: float = 0.0
    """When the swarm was brought up (its record's ``created_at``): an account of an older epoch starts afresh."""

    def used(self, now: float | None = None) -> float:
        """GPU-hours the swarm has used by ``now`` (default: now)."""
        now = time.time() if now is None else now
        return self.gpu_hours + self.gpus * max(0.0, now - self.at) / 3600.0

    def token_account(self) -> Account:
        """The swarm's token account (``account`` must be set)."""
        assert self.account is not None
        return Account(Path(self.account), self.epoch)

    def admission(self, holder: str) -> Admission:
        """What the runner asks before each request of process ``holder`` (``job/shard/pid``)."""
        if self.account is not None and self.cost.max_cost_usd is not None:
            return TokenPurse(self, holder)
        return GpuClock(self)


class Admission(Protocol):
    """The budget's seam in the runner: asked before every request is sent, told what its answer cost.

    Duties: :meth:`reserve` never waits on the network (a file lock at most; it may wait for this
    process's own requests in flight to settle); once it has refused, it refuses every later request
    (``reached`` says why); :meth:`close` settles what is still reserved as spent."""

    reached: str | None
    """Why a request was refused (the cap and the spend), None while requests are admitted."""

    async def reserve(self, body: bytes) -> float | None:
        """Reserve the worst-case cost of a request with this ``body``; None: refused (it is not sent)."""
        ...

    def release(self, reserved: float) -> None:
        """A reservation whose request was not sent after all (the runner stopped meanwhile)."""
        ...

    def settle(self, reserved: float, status: int, answer: bytes) -> None:
        """The request reserved at ``reserved`` ended: ``status`` 200 with ``answer`` (its usage is its cost),
        another status (an error answer costs nothing), 0 (no answer: the reservation stays spent)."""
        ...

    def close(self) -> None:
        """The process stops issuing: reservations not settled count as spent; the rest goes back."""
        ...


def completion_limit(req: Any) -> int:
    """A request's most completion tokens: ``max_completion_tokens`` or ``max_tokens``, times ``n``."""
    if not isinstance(req, dict):
        return DEFAULT_COMPLETION_TOKENS
    limit = req.get("max_completion_tokens") or req.get("max_tokens")
    each = int(limit) if isinstance(limit, int | float) and limit > 0 else DEFAULT_COMPLETION_TOKENS
    n = req.get("n")
    return each * (int(n) if isinstance(n, int) and n > 1 else 1)


def worst_case_usd(cost: CostConfig, body: bytes) -> float:
    """What a request with this JSON ``body`` can cost at most at ``cost``'s token prices."""
    try:
        req = json.loads(body)
    except ValueError:
        req = None
    return cost.token_usd(len(body) // PROMPT_BYTES_PER_TOKEN + 1, completion_limit(req)) or 0.0


def answer_usd(cost: CostConfig, answer: bytes) -> float | None:
    """What a 200 answer cost (its ``usage`` at the token prices); None when it reports no usage."""
    try:
        usage = json.loads(answer).get("usage") or {}
        pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return None
    return cost.token_usd(pt, ct) if pt or ct else None


@dataclass(frozen=True)
class Spend:
    """A token account as read: settled spend, grants not yet settled (counted as spent), by whom."""

    spent_usd: float
    held_usd: float
    holders: int

    @property
    def total(self) -> float:
        """What counts against the cap: settled spend and every grant still held."""
        return round(self.spent_usd + self.held_usd, 6)


class Account:
    """The swarm's token account: ``{epoch, spent_usd, held: {holder: usd}}`` in its folder, changed only
    under the account's file lock (safe for many processes of many jobs; on a shared filesystem with
    working ``flock``, across nodes). An account of an older epoch (the swarm brought up since) is read as
    empty and rewritten by the next change."""

    def __init__(self, path: Path, epoch: float = 0.0) -> None:
        self.path, self.epoch = path, epoch
        self.lock = path.with_suffix(".lock")

    def _read(self) -> dict[str, Any]:
        doc = read_json(self.path) or {}
        if float(doc.get("epoch") or 0.0) < self.epoch:
            return {"epoch": self.epoch, "spent_usd": 0.0, "held": {}}
        doc.setdefault("spent_usd", 0.0)
        doc.setdefault("held", {})
        return doc

    def read(self) -> Spend:
        """The account now."""
        with file_lock(self.lock):
            doc = self._read()
        held = doc["held"]
        return Spend(round(float(doc["spent_usd"]), 6), round(sum(held.values()), 6), len(held))

    def spent(self) -> float:
        """What counts against the cap now (:attr:`Spend.total`)."""
        return self.read().total

    def settled(self, prefix: str, timeout_s: float) -> Spend:
        """The account once no holder named ``prefix...`` (a job's processes: :func:`holder_name`) holds a
        grant any more, or after ``timeout_s`` (what they still hold then counts as spent)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with file_lock(self.lock):
                doc = self._read()
            if not any(h.startswith(prefix) for h in doc["held"]) or time.monotonic() > deadline:
                held = doc["held"]
                return Spend(round(float(doc["spent_usd"]), 6), round(sum(held.values()), 6), len(held))
            time.sleep(0.1)

    def exchange(self, holder: str, settled: float, keep: float, need: float, cap: float) -> float:
        """One change of ``holder``'s part: ``settled`` USD it spent since its last exchange join the spend;
        it keeps ``keep`` reserved and asks ``need`` more (0: none, it is leaving when ``keep`` is 0 too).
        Returns what it holds now: ``keep`` plus a grant of at least ``need`` when the cap leaves room for
        it (up to ``GRANT_SHARE`` of the cap more), else ``keep`` alone."""
        with file_lock(self.lock):
            doc = self._read()
            if float(doc.get("epoch") or 0.0) > self.epoch:  # the swarm came up again since: not ours to spend
                return 0.0
            doc["epoch"] = self.epoch
            doc["spent_usd"] = round(float(doc["spent_usd"]) + settled, 9)
            held: dict[str, float] = doc["held"]
            held.pop(holder, None)
            free = cap - doc["spent_usd"] - sum(held.values()) - keep
            grant = 0.0
            if need > 0 and need <= free + 1e-12:
                grant = need + max(0.0, min(cap * GRANT_SHARE, (free - need) / 4))
            mine = round(keep + grant, 9)
            if mine > 0:
                held[holder] = mine
            atomic_write_json(self.path, doc)
        return mine


class TokenPurse:
    """A process's purse on the swarm's token :class:`Account` (see the module doc): reservations are
    made within the grant it holds; a top-up takes the account's lock."""

    def __init__(self, budget: SwarmBudget, holder: str) -> None:
        assert budget.cost.max_cost_usd is not None
        self.budget, self.cost, self.cap = budget, budget.cost, budget.cost.max_cost_usd
        self.account, self.holder = budget.token_account(), holder
        self.held = 0.0
        """What the account holds for this process."""
        self.settled = 0.0
        """Spend settled here since the last exchange (not yet in the account's ``spent_usd``)."""
        self.out = 0.0
        """Reservations of requests in flight."""
        self.inflight = 0
        """Requests in flight (a count: a sum of floats drifts from 0)."""
        self.answers = 0
        self._refused_at = -1
        """Answers settled so far, and their number when the account last had no room: requests waiting for
        room ask it again once per answer between them, not once each (a lock and a write each)."""
        self.reached: str | None = None
        self._answered = asyncio.Event()

    async def reserve(self, body: bytes) -> float | None:
        """See :meth:`Admission.reserve`: without room, wait while this process's own requests in flight
        may give some back (their answers usually cost less than reserved); refused once none is left."""
        need = worst_case_usd(self.cost, body)
        while self.reached is None and not self._fits(need):
            if not self.inflight:
                spent = self.account.spent()
                self.reached = (
                    f"swarm '{self.budget.swarm}': {BUDGET_REACHED}: ${spent:.4g} spent or reserved of "
                    f"${self.cap:g} (max_cost_usd); the next request could cost ${need:.4g}: not sent"
                )
                break
            self._answered.clear()
            await self._answered.wait()
        if self.reached is not None:
            return None
        self.out += need
        self.inflight += 1
        return need

    def _fits(self, need: float) -> bool:
        """Whether ``need`` more fits the grant held, after a top-up from the account when it does not."""
        if self.settled + self.out + need <= self.held + 1e-12:
            return True
        if self._refused_at == self.answers and self.inflight:
            return False  # no room since the last answer came: wait for the next one
        self.held = self.account.exchange(self.holder, self.settled, self.out, need, self.cap)
        self.settled = 0.0
        if self.out + need <= self.held + 1e-12:
            return True
        self._refused_at = self.answers
        return False

    def release(self, reserved: float) -> None:
        """See :meth:`Admission.release`."""
        self._done(reserved)

    def settle(self, reserved: float, status: int, answer: bytes) -> None:
        """See :meth:`Admission.settle`."""
        self._done(reserved)
        if status == 200:
            cost = answer_usd(self.cost, answer)
            self.settled += reserved if cost is None else cost
        elif not status:
            self.settled += reserved

    def _done(self, reserved: float) -> None:
        """A reservation is no longer in flight: wake the requests waiting for room."""
        self.inflight -= 1
        self.answers += 1
        self.out = self.out - reserved if self.inflight else 0.0
        self._answered.set()

    def close(self) -> None:
        """See :meth:`Admission.close`."""
        self.account.exchange(self.holder, self.settled + self.out, 0.0, 0.0, self.cap)
        self.held = self.settled = self.out = 0.0


class GpuClock:
    """Admission on GPU time: no request once the swarm would be past its cap by its next check."""

    def __init__(self, budget: SwarmBudget, ahead_s: float = CHECK_AHEAD_S) -> None:
        self.budget, self.ahead_s = budget, ahead_s
        self.reached: str | None = None
        self.deadline = self._deadline()
        """Unix time from which no request is admitted (a comparison a request: the clock is known ahead)."""

    def _deadline(self) -> float:
        budget, cost = self.budget, self.budget.cost
        price = cost.price(budget.shape)
        caps = [cost.max_gpu_hours] if cost.max_gpu_hours is not None else []
        if cost.max_cost_usd is not None and price:
            caps.append(cost.max_cost_usd / price)
        if not caps:
            return float("inf")
        left_h = min(caps) - budget.gpu_hours
        if left_h <= 0:
            return float("-inf")
        return float("inf") if not budget.gpus else budget.at + left_h * 3600 / budget.gpus - self.ahead_s

    async def reserve(self, body: bytes) -> float | None:
        """See :meth:`Admission.reserve` (reserves no money: the swarm's clock runs whatever is sent)."""
        if self.reached is None and time.time() < self.deadline:
            return 0.0
        if self.reached is None:
            budget = self.budget
            verdict = budget.cost.budget(budget.used(time.time() + self.ahead_s), budget.shape)
            self.reached = (
                f"swarm '{budget.swarm}': {BUDGET_REACHED}: {verdict[1] if verdict else 'at its cap'} by its next "
                f"check ({self.ahead_s:g}s ahead): no request sent past it"
            )
        return None

    def release(self, reserved: float) -> None:
        """Nothing reserved."""

    def settle(self, reserved: float, status: int, answer: bytes) -> None:
        """Nothing to settle: GPU time is the swarm's clock."""

    def close(self) -> None:
        """Nothing held."""


def holder_name(job: str, shard: int) -> str:
    """A process's name in a token account: ``job/shard/host:pid``."""
    return f"{job}/{shard}/{socket.gethostname()}:{os.getpid()}"


def final_word(
    swarm: str,
    cost: CostConfig,
    *,
    spent_usd: float | None = None,
    gpu_hours: float | None = None,
    shape: str | None = None,
    rows_left: int | None = None,
) -> str:
    """The message of a stop at the budget, with the spend at exit: ``swarm 'x': budget reached: $0.4981 of
    $0.5 (max_cost_usd) at exit; 289 rows left: a rerun with a larger budget resumes them``."""
    verdict = cost.budget(gpu_hours, shape, usd=spent_usd)
    text = verdict[1] if verdict is not None else "spend unknown"
    left = "" if rows_left is None else f"; {rows_left:,} row{'' if rows_left == 1 else 's'} left"
    return f"swarm '{swarm}': {BUDGET_REACHED}: {text} at exit{left}: a rerun with a larger budget resumes them"


def stopped_by_budget(progress: dict[str, Any]) -> str | None:
    """The message of a shard that stopped itself at the swarm's budget (a progress file's ``stopped``,
    or the first such shard of a job's progress)."""
    for shard in progress.get("shards") or [progress]:
        stopped = shard.get("stopped") or {}
        if stopped.get("cause") == "budget":
            return str(stopped.get("message"))
    return None


def job_view(budget: SwarmBudget | None, progress: dict[str, Any]) -> dict[str, Any] | None:
    """The budget part of a job's cost report (`job status`): the caps, the swarm's spend (its token
    account now: settled, and still reserved; else its GPU-hours as of the shards' last progress), the
    share of the tightest cap, the job's rows left, and the stop message of a shard that stopped itself
    at the cap; None without a budget."""
    if budget is None:
        return None
    latest = max((float(s.get("updated_at") or 0) for s in progress.get("shards") or []), default=0.0)
    view = report(budget, None if budget.account else budget.used(latest or None))
    left = max(int(progress.get("total") or 0) - int(progress.get("done") or 0), 0)
    return {**view, "rows_left": left, "stopped": stopped_by_budget(progress)}


def report(budget: SwarmBudget, gpu_hours: float | None = None) -> dict[str, Any]:
    """The caps, the spend now (a token account's settled spend and what is still reserved; else the
    swarm's ``gpu_hours``), the share of the tightest cap and its text."""
    cost = budget.cost
    out: dict[str, Any] = {"max_cost_usd": cost.max_cost_usd, "max_gpu_hours": cost.max_gpu_hours}
    if budget.account is not None:
        spend = budget.token_account().read()
        out.update(spent_usd=spend.spent_usd, reserved_usd=spend.held_usd, source="tokens")
        verdict = cost.budget(None, usd=spend.total)
    else:
        out.update(gpu_hours=None if gpu_hours is None else round(gpu_hours, 6), source="gpu-time")
        verdict = cost.budget(gpu_hours, budget.shape)
    out.update(share=None if verdict is None else round(verdict[0], 4), text=None if verdict is None else verdict[1])
    return out


__all__ = [
    "BUDGET_REACHED",
    "CHECK_AHEAD_S",
    "Account",
    "Admission",
    "BudgetGuard",
    "GpuClock",
    "Spend",
    "SwarmBudget",
    "TokenPurse",
    "answer_usd",
    "final_word",
    "holder_name",
    "job_view",
    "report",
    "stopped_by_budget",
    "worst_case_usd",
]
