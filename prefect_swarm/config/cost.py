"""The price of GPU time (``backend.cost``), its caps, and the figures a price turns GPU-hours into.

    backend:
      type: slurm
      cost: {gpu_hour_usd: 2.5, max_cost_usd: 40}   # or per shape (Lepton): {per_shape: {gpu.h100-sxm: 3.2}}

Every backend config derives from :class:`Priced`, so every backend (and its Prefect block) takes
the same ``cost`` section. Without a price, costs are reported as GPU-hours only (``usd`` null).

The caps (``max_gpu_hours``, ``max_cost_usd``) are fields here; who holds a swarm to them, its spend
account and the message of a stop at one are :mod:`prefect_swarm.budget`'s.

:func:`projection` is the one rule for a job's projected wall time, GPU-hours and USD (rows left /
rows/s; GPUs x wall time; x the price), used by the CLI's wait, `job status`, the flow's progress
artifact and `validate --estimate`; :func:`projection_text` is its one line of text.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from prefect_swarm.config.base import StrictModel
from prefect_swarm.exceptions import ConfigError

Usd = Annotated[float, Field(ge=0)]
"""An amount of US dollars, zero allowed."""


class CostConfig(StrictModel):
    """What one GPU-hour costs: one price, or one per resource shape (a shape's price wins)."""

    gpu_hour_usd: Usd | None = Field(default=None, description="Price of one GPU for one hour, in USD; null: unknown.")
    per_shape: dict[str, Usd] = Field(
        default_factory=dict,
        description="Price of one GPU-hour per resource shape (e.g. Lepton's gpu.h100-sxm), in USD; "
        "overrides gpu_hour_usd for that shape.",
    )
    input_usd_per_million: Usd | None = Field(
        default=None,
        description="Price of one million prompt tokens, in USD (a priced provider behind an external swarm); "
        "with it a job's cost is its tokens x the token prices, not GPU time.",
    )
    output_usd_per_million: Usd | None = Field(
        default=None,
        description="Price of one million completion tokens, in USD; default: input_usd_per_million.",
    )
    max_gpu_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Budget: stop the jobs and tear the swarm down once it has used this many GPU-hours.",
    )
    max_cost_usd: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Budget: stop the jobs and tear the swarm down once its GPU time costs this much (needs a price).",
    )

    @model_validator(mode="after")
    def _cost_cap_needs_a_price(self) -> CostConfig:
        """A ``max_cost_usd`` without a price could never be reached: refused, not silently ignored."""
        if self.max_cost_usd is not None and self.gpu_hour_usd is None and not self.per_shape and not self.token_priced:
            raise ValueError(
                f"max_cost_usd={self.max_cost_usd:g} needs a price: without one the cap can never be reached. "
                "Set backend.cost.gpu_hour_usd (or per_shape, or a provider's input_usd_per_million), or cap by "
                "max_gpu_hours instead."
            )
        return self

    def price(self, shape: str | None = None) -> float | None:
        """USD per GPU-hour for ``shape`` (None: no price set)."""
        if shape is not None and shape in self.per_shape:
            return self.per_shape[shape]
        return self.gpu_hour_usd

    def figures(self, gpu_hours: float | None, tokens: int | None = None, shape: str | None = None) -> dict[str, Any]:
        """``{gpu_hours, usd, usd_per_million_tokens}`` (null where a figure is unknown)."""
        price = self.price(shape)
        usd = None if gpu_hours is None or price is None else round(gpu_hours * price, 4)
        per_m = round(usd / tokens * 1e6, 4) if usd is not None and tokens else None
        hours = None if gpu_hours is None else round(gpu_hours, 6)
        return {"gpu_hours": hours, "usd": usd, "usd_per_million_tokens": per_m}

    @property
    def token_priced(self) -> bool:
        """Tokens have a price (``input_usd_per_million`` / ``output_usd_per_million``)."""
        return self.input_usd_per_million is not None or self.output_usd_per_million is not None

    def token_usd(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """USD of these tokens at the token prices (output defaults to input, input to output); None without one."""
        if not self.token_priced:
            return None
        into = self.input_usd_per_million if self.input_usd_per_million is not None else self.output_usd_per_million
        out = self.output_usd_per_million if self.output_usd_per_million is not None else into
        return round(((into or 0.0) * prompt_tokens + (out or 0.0) * completion_tokens) / 1e6, 6)

    def budget(
        self, gpu_hours: float | None, shape: str | None = None, usd: float | None = None
    ) -> tuple[float, str] | None:
        """``(share of the tightest cap used, "X of Y")``; None without a cap or a figure to hold it to.
        ``usd``: the bill when it is not GPU time (a priced provider's tokens, :meth:`token_usd`)."""
        if gpu_hours is None and usd is None:
            return None
        found = []
        if self.max_gpu_hours is not None and gpu_hours is not None:
            found.append(
                (gpu_hours / self.max_gpu_hours, f"{gpu_hours:.4g} of {self.max_gpu_hours:g} GPU-hours (max_gpu_hours)")
            )
        usd = self.figures(gpu_hours, shape=shape)["usd"] if usd is None else usd
        if self.max_cost_usd is not None and usd is not None:
            share = usd / self.max_cost_usd if self.max_cost_usd else float("inf")
            found.append((share, f"${usd:.4g} of ${self.max_cost_usd:g} (max_cost_usd)"))
        return max(found) if found else None

    def tightened(self, max_gpu_hours: float | None = None, max_cost_usd: float | None = None) -> CostConfig:
        """This price with a run's own caps (a flow run's ``max_gpu_hours`` / ``max_cost_usd``): for
        each cap the lower of the two wins; None leaves the swarm's. A cost cap needs a price."""
        if max_cost_usd is not None and self.gpu_hour_usd is None and not self.per_shape and not self.token_priced:
            raise ConfigError(
                f"max_cost_usd={max_cost_usd:g} needs a price: set backend.cost.gpu_hour_usd (or per_shape) "
                "in the swarm config, or cap the run by max_gpu_hours instead."
            )
        return self.model_copy(
            update={
                "max_gpu_hours": _lower(self.max_gpu_hours, max_gpu_hours),
                "max_cost_usd": _lower(self.max_cost_usd, max_cost_usd),
            }
        )

    @property
    def capped(self) -> bool:
        """A budget is set."""
        return self.max_gpu_hours is not None or self.max_cost_usd is not None


def _lower(a: float | None, b: float | None) -> float | None:
    """The tighter of two caps (None: no cap)."""
    return b if a is None else a if b is None else min(a, b)


def held_gpu_hours(started_at: Iterable[float | None], gpus_each: int, now: float | None = None) -> float:
    """GPU-hours of replicas that each hold ``gpus_each`` GPUs from their start times until ``now``
    (wall time x GPUs; an unknown start counts nothing): the local backend's ``gpu_usage``, and the
    figure its watchdogs hold the swarm's budget to."""
    now = time.time() if now is None else now
    return sum(max(0.0, now - (t if t is not None else now)) for t in started_at) * max(gpus_each, 0) / 3600.0


class Priced(StrictModel):
    """The common base of every backend config: the price of its GPU time."""

    cost: CostConfig = Field(
        default_factory=CostConfig,
        description="Price of GPU time: gpu_hour_usd, or per_shape prices; costs are reported as "
        "GPU-hours, USD and USD per million tokens.",
    )


def recorded_cost(config: Mapping[str, Any] | None) -> CostConfig:
    """The price section of a recorded (redacted) swarm config; no price when there is none."""
    backend = (config or {}).get("backend") or {}
    return CostConfig.model_validate(backend.get("cost") or {})


def swarm_gpus(config: Mapping[str, Any] | None) -> int:
    """GPUs a swarm config holds: replicas x gpus_per_replica."""
    config = config or {}
    return int(config.get("replicas") or 0) * max(int(config.get("gpus_per_replica") or 0), 0)


def job_cost(progress: Mapping[str, Any], swarm_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A job's share of its swarm: the wall time of its shards' latest runs (first start to last
    progress) x the swarm's GPUs, priced by the swarm's ``backend.cost``; tokens from the progress."""
    shards = [s for s in progress.get("shards") or [] if s.get("started_at") and s.get("updated_at")]
    wall_s = max(s["updated_at"] for s in shards) - min(s["started_at"] for s in shards) if shards else 0.0
    pt, ct = int(progress.get("prompt_tokens") or 0), int(progress.get("completion_tokens") or 0)
    hours = max(wall_s, 0.0) * swarm_gpus(swarm_config) / 3600.0
    cost = recorded_cost(swarm_config)
    out = {**cost.figures(hours, pt + ct), "source": "wall", "wall_s": round(wall_s, 2)}
    usd = cost.token_usd(pt, ct)
    if usd is not None:  # a priced provider: its tokens are the bill
        per_m = round(usd / (pt + ct) * 1e6, 4) if pt + ct else None
        out.update(usd=usd, usd_per_million_tokens=per_m, source="tokens")
    return out


MIN_ELAPSED_S = 5.0
"""A running job is projected once its shards have run this long (as of a checkpoint) and answered rows."""

NO_PRICE = "no price: set backend.cost.gpu_hour_usd"


def projection(
    *,
    done: int,
    total: int,
    rate_rows_s: float,
    elapsed_s: float,
    gpus: int,
    cost: CostConfig,
    shape: str | None = None,
    min_elapsed_s: float = MIN_ELAPSED_S,
    tail_s: float = 0.0,
) -> dict[str, Any]:
    """The projected time and cost of a whole input, the one rule every view uses (the CLI's wait,
    `job status`, the flow's progress artifact, `validate --estimate`).

    ``done`` of ``total`` rows are answered; ``elapsed_s`` seconds have run at ``rate_rows_s``. The
    rows left take ``(total - done) / rate`` seconds; the wall time of the whole input is
    ``elapsed + left``; GPU-hours = ``gpus`` x that wall time (the swarm's GPUs are held for all of it,
    busy or not); USD = GPU-hours x the price (``usd`` null without one: ``price`` says so).
    ``ready`` is false (no figures, ``reason`` says why) until ``min_elapsed_s`` have run and the
    rate is positive: the first seconds measure the ramp, not the swarm. ``tail_s``: seconds the last
    rows take beyond the rate (their longest answers), added while rows are left."""
    left = max(int(total) - int(done), 0)
    price = cost.price(shape)
    out: dict[str, Any] = {
        "rows_done": int(done),
        "rows_total": int(total),
        "rows_left": left,
        "elapsed_s": round(max(elapsed_s, 0.0), 2),
        "rate_rows_s": round(max(rate_rows_s, 0.0), 2),
        "gpus": int(gpus),
        "price_usd_per_gpu_hour": price,
        "price": f"${price:g}/GPU-hour" if price is not None else NO_PRICE,
    }
    unknown = dict.fromkeys(("remaining_s", "wall_s", "gpu_hours", "gpu_hours_left", "usd", "usd_left"))
    if rate_rows_s <= 0 or elapsed_s < min_elapsed_s:
        why = f"measuring: projected after {min_elapsed_s:g}s of running with rows answered"
        return {**out, **unknown, "ready": False, "reason": why}
    remaining = left / rate_rows_s + (max(tail_s, 0.0) if left else 0.0)
    wall = max(elapsed_s, 0.0) + remaining
    whole = cost.figures(gpus * wall / 3600.0, shape=shape)
    rest = cost.figures(gpus * remaining / 3600.0, shape=shape)
    return {
        **out,
        "ready": True,
        "reason": None,
        "remaining_s": round(remaining, 1),
        "wall_s": round(wall, 1),
        "gpu_hours": whole["gpu_hours"],
        "gpu_hours_left": rest["gpu_hours"],
        "usd": whole["usd"],
        "usd_left": rest["usd"],
    }


def job_projection(
    progress: Mapping[str, Any], swarm_config: Mapping[str, Any] | None, *, min_elapsed_s: float = MIN_ELAPSED_S
) -> dict[str, Any]:
    """:func:`projection` of a running job from its progress (:func:`~prefect_swarm.jobs.checkpoint.plan.job_progress`:
    rows done and total, the running shards' rows/s) and its swarm's recorded config (GPUs, price).

    Everything is as of the shards' last progress writes (their checkpoints: every ``checkpoint_every``
    rows or ``checkpoint_seconds``): elapsed = the latest write of a running shard less the earliest
    start of one, so the figures do not drift between two checkpoints. ``min_elapsed_s``: see
    :func:`projection` (`top`, a live view, shows its ETA from the first checkpoint with rows: 0).

    The rate counts, per running shard, the rows it answered this run plus the requests it had in
    flight (``in_flight``) over its running time: a shard keeps its in-flight window full, so every
    answer was sent one latency before it came, and those in flight now are answered at the same pace.
    The rows answered alone over the running time would count the first answers' latency (seconds
    without answers) against the rate: 25 % slow at 10 s of a job whose first answers take 2 s.

    The tail, from the answer lengths seen: the last rows in flight end with their answers, the longest
    of them last, while the rate counts each at the mean latency; the rows left take ``left / rate``
    plus the longest answer's extra time, ``mean latency x (longest / mean length - 1)`` (``answers`` in
    the running shards' progress, the largest of theirs): nothing for even lengths, seconds for a long
    tail of answer lengths."""
    running = [
        s
        for s in progress.get("shards") or []
        if s.get("state") == "running" and s.get("started_at") and s.get("updated_at")
    ]
    elapsed = (
        max(float(s["updated_at"]) for s in running) - min(float(s["started_at"]) for s in running) if running else 0.0
    )
    done, total = int(progress.get("done") or 0), int(progress.get("total") or 0)
    rate = _rate(progress, running)
    tail = max((_tail(s) for s in running), default=0.0) if done < total else 0.0
    return projection(
        done=done,
        total=total,
        rate_rows_s=rate,
        tail_s=tail,
        elapsed_s=elapsed,
        gpus=swarm_gpus(swarm_config),
        cost=recorded_cost(swarm_config),
        min_elapsed_s=min_elapsed_s,
    )


def _tail(shard: Mapping[str, Any]) -> float:
    """A running shard's longest answer's time beyond the mean (seconds; 0 when it does not tell)."""
    seen = shard.get("answers")
    if not isinstance(seen, Mapping) or not seen.get("tokens_mean"):
        return 0.0
    ratio = float(seen.get("tokens_longest") or 0) / float(seen["tokens_mean"])
    return max(0.0, float(seen.get("latency_mean_s") or 0.0) * (ratio - 1))


def _rate(progress: Mapping[str, Any], running: list[Mapping[str, Any]]) -> float:
    """The running shards' rows/s (see :func:`job_projection`); their summed ``rate_rows_s`` where one
    does not tell ``in_flight`` (written by an older version)."""
    if not running:
        return 0.0
    if any(s.get("in_flight") is None or s.get("rows_this_run") is None for s in running):
        return float(progress.get("rate_rows_s") or 0.0)
    rates = []
    for s in running:
        seconds = float(s["updated_at"]) - float(s["started_at"])
        rates.append((int(s["rows_this_run"]) + int(s["in_flight"])) / seconds if seconds > 0 else 0.0)
    return sum(rates)


def projection_text(p: Mapping[str, Any] | None) -> str | None:
    """One line for people: the CLI's wait and `job status`, the flow's progress artifact, `validate --estimate`."""
    if not p:
        return None
    if not p.get("ready"):
        return f"projection: {p.get('reason')}"
    head = (
        f"projection: {p['rows_done']:,}/{p['rows_total']:,} rows at {p['rate_rows_s']:,.1f} rows/s: "
        f"{duration(p['remaining_s'])} left, {duration(p['wall_s'])} for the whole input"
    )
    if not p["gpus"]:
        return f"{head}; no GPUs in the swarm config, so no GPU-hours"
    hours = f"{p['gpu_hours']:.4g} GPU-hours ({p['gpus']} GPU{'' if p['gpus'] == 1 else 's'})"
    if p.get("usd") is None:
        return f"{head}; {hours} ({NO_PRICE})"
    return f"{head}; {hours}, {usd_text(p['usd'])} at {p['price']} ({usd_text(p['usd_left'])} of it still to spend)"


def usd_text(x: float) -> str:
    """``$12,345``, ``$12.35``, ``$0.0349``: whole dollars when large, 3 significant digits below $1."""
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}" if x >= 1 else f"${x:.3g}"


def duration(seconds: float | None) -> str:
    """``45s``, ``6m35s``, ``3h12m``, ``2d04h`` (None: ``?``)."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


__all__ = [
    "CostConfig",
    "Priced",
    "duration",
    "held_gpu_hours",
    "job_cost",
    "job_projection",
    "projection",
    "projection_text",
    "recorded_cost",
    "swarm_gpus",
    "usd_text",
]
