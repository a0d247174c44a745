"""Where a swarm's metrics are: the Prometheus file_sd target list, and one scrape of a ``/metrics``.

Each backend that can reach its replicas keeps ``<swarm>/targets.json`` (``SwarmPaths.metrics_targets``)
in Prometheus' file_sd format, next to its head files: one group per replica engine::

    [{"targets": ["node1:8000"], "labels": {"swarm": "qwen", "replica": "0", "role": "engine"}}]

Prometheus reads it with ``file_sd_configs`` (deployments/monitoring/prometheus.yml);
`prefect-swarm top` reads it through :meth:`ServingBackend.metrics_targets`. A backend that cannot
list its replicas answers :class:`MetricsTargets` with a ``reason`` instead.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from prefect_swarm.paths import atomic_write_json, read_json

ENGINE_ROLE = "engine"
"""``role`` label of a replica engine's target."""


@dataclass(frozen=True)
class Target:
    """One ``/metrics`` endpoint: ``host:port`` and its labels (``replica`` for an engine)."""

    address: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The ``/metrics`` URL (``metrics_path`` is Prometheus' default)."""
        return f"http://{self.address}/metrics"


@dataclass(frozen=True)
class MetricsTargets:
    """What :meth:`ServingBackend.metrics_targets` answers: the targets, or why there are none."""

    targets: tuple[Target, ...] = ()
    reason: str | None = None
    """Set when the backend cannot list its replicas' metrics (shown as n/a with this reason)."""

    def to_file_sd(self) -> list[dict[str, Any]]:
        """The file_sd JSON document (one group per target)."""
        return [{"targets": [t.address], "labels": dict(t.labels)} for t in self.targets]

    @classmethod
    def from_file_sd(cls, doc: Any) -> MetricsTargets:
        """Parse a file_sd document (a missing or damaged file gives no targets)."""
        found: list[Target] = []
        for group in doc if isinstance(doc, list) else []:
            labels = {str(k): str(v) for k, v in (group.get("labels") or {}).items()}
            found.extend(Target(str(addr), labels) for addr in group.get("targets") or [])
        return cls(tuple(found))


def engine_targets(swarm: str, addresses: Iterable[tuple[int, str]]) -> MetricsTargets:
    """Targets of replica engines: ``(index, host:port)`` pairs."""
    return MetricsTargets(
        tuple(Target(addr, {"swarm": swarm, "replica": str(i), "role": ENGINE_ROLE}) for i, addr in sorted(addresses))
    )


def write_file_sd(path: Path, targets: MetricsTargets) -> None:
    """Write the file_sd list atomically (Prometheus re-reads it when it changes)."""
    atomic_write_json(path, targets.to_file_sd())


def read_file_sd(path: Path) -> MetricsTargets:
    """The file_sd list at ``path``; no targets when it is missing."""
    return MetricsTargets.from_file_sd(read_json(path, []))


Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name -> (labels, value) of every series of that name."""


def scrape(url: str, timeout_s: float = 2.0, api_key: str | None = None) -> Samples:
    """GET ``url`` (a Prometheus text endpoint; with the swarm's key, which a closed swarm wants on every
    route) and parse it. Raises OSError when it does not answer."""
    with urllib.request.urlopen(authorized(url, api_key), timeout=timeout_s) as resp:
        text = resp.read().decode("utf-8", "replace")
    return parse(text)


def authorized(url: str, api_key: str | None) -> urllib.request.Request:
    """A GET of ``url`` that carries ``Authorization: Bearer <api_key>`` (none without a key)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return urllib.request.Request(url, headers=headers)


RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
"""The two series of an engine's ``/metrics`` that say what it has in flight (vLLM's names; SGLang exports
the same under ``sglang:`` only with ``--enable-metrics``): the job's in-flight loop reads them, and a
replica going to sleep waits for them to reach zero."""


def parse(text: str) -> Samples:
    """Prometheus text -> samples by name (``_total``, ``_bucket``... names as written)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def total(samples: Samples, name: str, **match: str) -> float | None:
    """Sum of the series ``name`` whose labels include ``match``; None when there is none."""
    series = [v for labels, v in samples.get(name, []) if all(labels.get(k) == w for k, w in match.items())]
    return sum(series) if series else None


__all__ = [
    "ENGINE_ROLE",
    "RUNNING",
    "WAITING",
    "MetricsTargets",
    "Samples",
    "Target",
    "engine_targets",
    "parse",
    "read_file_sd",
    "scrape",
    "total",
    "write_file_sd",
]
