"""Prometheus collectors over metric families the gateway already has: a
registry's without the ``_created`` samples (``/metrics`` of one process),
and a list of metric objects (the families merged from every worker,
gateway/process/workers.py).  Their own module so that the ``/metrics`` route and the
worker aggregation share them without importing each other."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample


class WithoutCreated(Collector):
    """A registry's metrics without the ``_created`` samples prometheus_client
    adds to counters and histograms: Prometheus ignores them in the text
    format, and each one is a series to store.  (Filtered here rather than
    with ``disable_created_metrics()``, which is process-wide.)"""

    def __init__(self, registry: CollectorRegistry, *, hidden: Iterable[str] = ()) -> None:
        self._registry = registry
        self._hidden = frozenset(hidden)

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            if metric.name in self._hidden:
                continue
            kept = [s for s in metric.samples if not s.name.endswith("_created")]
            yield _copy(metric, kept) if len(kept) != len(metric.samples) else metric


def _copy(metric: Metric, samples: list[Sample]) -> Metric:
    out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    out.samples = samples
    return out


class MetricsOf(Collector):
    """Metric objects as a collector, for ``generate_latest``."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)
