"""The price of GPU time (``backend.cost``), the figures a price turns GPU-hours into, and the budget guard.

    backend:
      type: slurm
      cost: {gpu_hour_usd: 2.5, max_cost_usd: 40}   # or per shape (Lepton): {per_shape: {gpu.h100-sxm: 3.2}}

Every backend config derives from :class:`Priced`, so every backend (and its Prefect block) takes
the same ``cost`` section. Without a price, costs are reported as GPU-hours only (``usd`` null).

The budget (``max_gpu_hours``, ``max_cost_usd``) caps the swarm's running GPU-hours (its backend's
best source): :class:`BudgetGuard` warns once at 80 % and raises
:class:`~prefect_swarm.exceptions.BudgetReached` past the cap (a flow run's own ``max_gpu_hours`` /
``max_cost_usd`` tighten it for that run: :meth:`CostConfig.tightened`); whoever waits on a job
(``launch``: the CLI's wait loop and the flow's shard watch) then stops the job (SIGTERM: it flushes
and exits 75) and tears the swarm down. A rerun with a larger cap resumes from the ledger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from prefect_swarm.config.base import StrictModel
from prefect_swarm.exceptions import BudgetReached, ConfigError

log = logging.getLogger("prefect_swarm.cost")

WARN_AT = 0.8
"""Share of a budget at which the guard warns (once)."""

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
    max_gpu_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Budget: stop the jobs and tear the swarm down once it has used this many GPU-hours.",
    )
    max_cost_usd: Usd | None = Field(
        default=None,
        description="Budget: stop the jobs and tear the swarm down once its GPU time costs this much (needs a price).",
    )

    @model_validator(mode="after")
    def _cost_cap_needs_a_price(self) -> CostConfig:
        """A ``max_cost_usd`` without a price could never be reached: refused, not silently ignored."""
        if self.max_cost_usd is not None and self.gpu_hour_usd is None and not self.per_shape:
            raise ValueError(
                f"max_cost_usd={self.max_cost_usd:g} needs a price: without one the cap can never be reached. "
                "Set backend.cost.gpu_hour_usd (or per_shape), or cap by max_gpu_hours instead."
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

    def budget(self, gpu_hours: float | None, shape: str | None = None) -> tuple[float, str] | None:
        """``(share of the tightest cap used, "X of Y")``; None without a cap or a figure to hold it to."""
        if gpu_hours is None:
            return None
        found = []
        if self.max_gpu_hours is not None:
            found.append((gpu_hours / self.max_gpu_hours, f"{gpu_hours:.4g} of {self.max_gpu_hours:g} GPU-hours"))
        usd = self.figures(gpu_hours, shape=shape)["usd"]
        if self.max_cost_usd is not None and usd is not None:
            share = usd / self.max_cost_usd if self.max_cost_usd else float("inf")
            found.append((share, f"${usd:.4g} of ${self.max_cost_usd:g}"))
        return max(found) if found else None

    def tightened(self, max_gpu_hours: float | None = None, max_cost_usd: float | None = None) -> CostConfig:
        """This price with a run's own caps (a flow run's ``max_gpu_hours`` / ``max_cost_usd``): for
        each cap the lower of the two wins; None leaves the swarm's. A cost cap needs a price."""
        if max_cost_usd is not None and self.gpu_hour_usd is None and not self.per_shape:
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


class BudgetGuard:
    """Hold a swarm to its budget: :meth:`check` warns once at 80 % and raises BudgetReached past it.

    ``usage`` reads the swarm's ``(GPU-hours, resource shape)`` (from its serving backend's
    ``gpu_usage``); it is asked at most every ``every_s`` seconds (sacct and cloud APIs are not free).
    """

    def __init__(
        self, name: str, cost: CostConfig, usage: Callable[[], tuple[float | None, str | None]], every_s: float = 5.0
    ) -> None:
        self.name, self.cost, self.usage, self.every_s = name, cost, usage, every_s
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
        verdict = self.cost.budget(hours, shape)
        if verdict is None:
            return
        share, text = verdict
        if share >= 1:
            raise BudgetReached(f"swarm '{self.name}': budget reached: {text}")
        if share >= WARN_AT and not self.warned:
            self.warned = True
            log.warning("swarm %s: %.0f%% of its budget used (%s)", self.name, 100 * share, text)


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
    tokens = int(progress.get("prompt_tokens") or 0) + int(progress.get("completion_tokens") or 0)
    hours = max(wall_s, 0.0) * swarm_gpus(swarm_config) / 3600.0
    return {**recorded_cost(swarm_config).figures(hours, tokens), "source": "wall", "wall_s": round(wall_s, 2)}


__all__ = [
    "BudgetGuard",
    "CostConfig",
    "Priced",
    "job_cost",
    "recorded_cost",
    "swarm_gpus",
]
