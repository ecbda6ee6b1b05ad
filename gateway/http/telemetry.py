"""What the gateway measures about itself, for ``/status``, ``/metrics`` and the
status page.

One :class:`Telemetry` per :class:`~gateway.app.Gateway` (tests run several
gateways in one process, so nothing here is global):

- a private prometheus ``CollectorRegistry`` with histograms fed by hooks
  (append latency and size per protocol from the writer's commit observer,
  delivery latency per protocol from the store's delivery hook, commit batch
  size and duration) and a collector that reads every other number when
  scraped (listener counters, queue depths, subscription lag, database pool);
- a sampler that records cumulative counters once a second, from which
  ``/status`` derives rates and the status page its live event-volume chart;
- subscription lag (durable subscriptions from the database, in-process ones
  from memory), computed at most once per :data:`LAG_TTL` seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from polyport.core.commands import Selector
from polyport.core.errors import ERROR_BY_CODE
from polyport.core.events import RecordedEvent
from polyport.core.groups import GroupMember
from polyport.core.store import selector_from_json
from polyport.core.writer import CommitObservation
from polyport.gateway.http import chart_history
from polyport.protocols.session import CURRENT_PEER

if TYPE_CHECKING:
    from polyport.core.store import EventStore
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.telemetry")

SAMPLE_INTERVAL = 1.0
SAMPLES_KEPT = 900  # 15 minutes
RATE_WINDOW = 10.0  # seconds over which /status reports rates
CHART_BUCKET = 10  # seconds per bar of the live chart
CHART_BUCKETS = 60  # bars: the last 10 minutes
# Samples between two writes of the charts' history (chart_history).
HISTORY_SAVE_EVERY = 60
LAG_TTL = 1.0
# Lag of a durable subscription: matching events counted among at most this
# many positions after its checkpoint (beyond that the count is a bound).
LAG_SCAN_POSITIONS = 10_000
# A subscription with a matcher is counted by reading its candidate events
# (the matcher runs in Python): at most this many per refresh, beyond that
# the count is a bound.
LAG_MATCHER_SCAN = 1_000
# Durable subscriptions examined in detail per refresh (largest lag first).
LAG_DETAILED = 100
DB_TIMEOUT = 2.0

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# The ``protocol`` label of work that did not come through a listener.
CORE_PROTOCOL = "core"
# The ``route`` label of HTTP requests no route matched (404, 405): one value,
# so scanners probing random paths cannot grow the series without bound.
UNMATCHED_ROUTE = "unmatched"

# Series labelled with subscription names (only with metrics_per_subscription,
# and only for an admin-token holder).
PER_SUBSCRIPTION_METRICS = (
    "polyport_subscription_lag_events",
    "polyport_subscription_lag_seconds",
    "polyport_subscription_parked_events",
    "polyport_subscription_consumers",
)


def polyport_version() -> str:
    try:
        return metadata.version("polyport")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class Sample:
    mono: float
    wall: float
    head: int
    committed: int
    appended: dict[str, int]
    delivered: dict[str, int]
    # Open connections by protocol, for the status page's connection chart.
    connections: dict[str, int] = field(default_factory=dict)
    # Observations per LATENCY_BUCKETS bucket so far (the last: beyond the
    # largest bound), every protocol together: quantiles over a window.
    append_le: tuple[int, ...] = ()
    commit_le: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SubscriptionLag:
    kind: str  # "durable", "subscription" (in-process), "group-member" (in-process)
    name: str
    selector: dict[str, Any]
    lag_events: int
    lag_seconds: float
    exact: bool = True
    checkpoint: int | None = None
    state: str = ""
    delivered: int | None = None
    buffered: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "selector": self.selector,
            "lag_events": self.lag_events,
            "lag_seconds": round(self.lag_seconds, 3),
            "lag_exact": self.exact,
        }
        for key in ("checkpoint", "delivered", "buffered"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.state:
            out["state"] = self.state
        return out


@dataclass
class LagSnapshot:
    taken: float = 0.0
    durable: list[SubscriptionLag] = field(default_factory=list)
    transient: list[SubscriptionLag] = field(default_factory=list)
    error: str | None = None
    # Parked events by durable subscription (context, name), those with any.
    parked: dict[tuple[str, str], int] = field(default_factory=dict)


def _selector_json(sel: Selector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("context", "stream", "prefix"):
        value = getattr(sel, key)
        if value is not None:
            out[key] = value
    if sel.types:
        out["types"] = sorted(sel.types)
    if sel.matcher_spec:
        out["matcher"] = sel.matcher_spec
    return out


def _age(t: datetime | None, now: float) -> float:
    return max(0.0, now - t.timestamp()) if t is not None else 0.0


def observe_many(child: Any, values: Sequence[float],
                 counts: Mapping[int, int] | None = None) -> None:
    """``child.observe(v)`` for each of ``values`` (finite, not negative),
    with one increment per bucket they fall in and one of the sum: a
    catch-up hands out hundreds of events at once, and one ``observe``
    each was 7 % of the gateway's time in it.  prometheus_client keeps a
    histogram child's bounds, buckets and sum as ``_upper_bounds``,
    ``_buckets`` and ``_sum``; without them (another version) it observes
    one by one.  ``counts``: how many values fall in each bucket, where
    the caller has counted them already against the same bounds."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(values) < 2:
        for v in values:
            child.observe(v)
        return
    # observe() counts a value in the first bucket whose bound is >= it.
    if counts is None:
        counts = Counter([bisect.bisect_left(bounds, v) for v in values])
    for i, n in counts.items():
        buckets[i].inc(n)
    total.inc(sum(values))


class Telemetry:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.registry = CollectorRegistry(auto_describe=False)
        self.append_latency = Histogram(
            "polyport_append_latency_seconds",
            "Time from an append request reaching the writer to its outcome, by protocol",
            ["protocol"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.append_size = Histogram(
            "polyport_append_batch_events",
            "Events per append request (one Append or AppendBatch), by protocol",
            ["protocol"],
            buckets=SIZE_BUCKETS,
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "polyport_delivery_latency_seconds",
            "Time from an event's recorded_at to its hand-over to a subscriber, by protocol",
            ["protocol"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.commit_batch = Histogram(
            "polyport_commit_batch_events",
            "Events written per group commit",
            buckets=SIZE_BUCKETS,
            registry=self.registry,
        )
        self.commit_duration = Histogram(
            "polyport_commit_duration_seconds",
            "Duration of one group commit",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = PromCounter(
            "polyport_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "polyport_http_request_duration_seconds",
            "Time to answer an HTTP request (a WebSocket: its whole life), by route template",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_GatewayCollector(self))
        # What the default registry would carry (memory, CPU, fds, start time,
        # Python version, GC), on this gateway's own registry.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.appended: Counter[str] = Counter()
        self.append_requests: Counter[str] = Counter()
        self.append_failures: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()
        self._append_le = [0] * (len(LATENCY_BUCKETS) + 1)
        self._commit_le = [0] * (len(LATENCY_BUCKETS) + 1)
        # labels() takes a lock and builds a key per call: hot paths look a
        # child up once per (histogram, label) here instead (see _child).
        self._children: dict[tuple[int, str], Any] = {}
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        # The charts' points from before this process started (chart_history).
        self.restored: list[Sample] = []
        self._history_path: Path | None = None
        self.lag = LagSnapshot()
        self._lag_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------

    def keep_history(self, path: Path) -> None:
        """Read the charts' history from ``path`` and keep it there from now on."""
        self._history_path = path
        offset = time.monotonic() - time.time()
        self.restored = [Sample(wall + offset, wall, head, 0, {}, {}, connections)
                         for wall, head, connections in chart_history.load(path)]

    def save_history(self) -> None:
        if self._history_path is not None:
            chart_history.save(self._history_path, (
                (s.wall, s.head, s.connections) for s in (*self.restored, *self.samples)))

    def _chart_samples(self) -> list[Sample]:
        return [*self.restored, *self.samples]

    def start(self) -> None:
        store = self.gw.store
        store.writer.observer = self.observe_commit
        store.on_deliver = self.observe_delivery
        self.sample()
        self._task = asyncio.create_task(self._sampler(), name="polyport-telemetry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self.save_history()

    async def _sampler(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL)
            self.sample()
            ticks += 1
            if ticks % HISTORY_SAVE_EVERY == 0:  # a crash loses at most this much
                await asyncio.to_thread(self.save_history)

    # --- hooks (called by core; cheap, never raise) ---------------------------------

    def observe_commit(self, obs: CommitObservation) -> None:
        if obs.events:
            self.commit_batch.observe(obs.events)
        if obs.commit:
            self.commit_duration.observe(obs.seconds)
            self._commit_le[bisect.bisect_left(LATENCY_BUCKETS, obs.seconds)] += 1
        # One pass per protocol, not per unit: a commit settles dozens of
        # units, and two histogram observes each (a lock and a bisect apiece)
        # were ~5 % of the gateway's W1 samples.  A commit's units usually
        # share one protocol: then the lists are taken as they are.
        origins = obs.origins
        if not origins:
            return
        first = origins[0]
        if origins.count(first) == len(origins):
            self._observe_units(first, obs.sizes, obs.waits, obs.ok)
            return
        by_origin: dict[str, list[int]] = {}
        for i, origin in enumerate(origins):
            by_origin.setdefault(origin, []).append(i)
        for origin, units in by_origin.items():
            self._observe_units(origin, [obs.sizes[i] for i in units],
                                [obs.waits[i] for i in units], [obs.ok[i] for i in units])

    def _observe_units(self, origin: str, sizes: list[int], waits: list[float],
                       ok: list[bool]) -> None:
        # The append-latency histogram's bounds are LATENCY_BUCKETS and +Inf,
        # as the status page's counts: one bisect per unit serves both.
        counts = Counter([bisect.bisect_left(LATENCY_BUCKETS, w) for w in waits])
        observe_many(self._child(self.append_latency, origin), waits, counts)
        observe_many(self._child(self.append_size, origin), sizes)
        append_le = self._append_le
        for i, n in counts.items():
            append_le[i] += n
        self.append_requests[origin] += len(sizes)
        if False not in ok:
            self.appended[origin] += sum(sizes)
            return
        good = sum(size for size, fine in zip(sizes, ok, strict=True) if fine)
        if good:
            self.appended[origin] += good
        self.append_failures[origin] += ok.count(False)

    def known_protocols(self) -> list[str]:
        """``protocol`` label values known before any traffic: every running
        listener, and ``core``."""
        return sorted({*self.gw.listeners, CORE_PROTOCOL})

    def prime(self) -> None:
        """Create every labelled histogram child of the known protocols, so
        their ``_count`` series exist at zero before the first observation
        (a rate over a series that appears late misses its first increase)."""
        for protocol in self.known_protocols():
            self.append_latency.labels(protocol)
            self.append_size.labels(protocol)
            self.delivery_latency.labels(protocol)

    def prime_routes(self, routes: Iterable[tuple[str, str]]) -> None:
        """HTTP series at zero for every (route template, method) served."""
        for route, method in routes:
            # Statuses are not known ahead: the request counter's series
            # appear with their first request, the histogram's count is 0 now.
            self.http_duration.labels(route, method)

    def observe_delivery(self, events: Sequence[RecordedEvent]) -> None:
        """One hand-out of ``events`` to a subscriber: per batch, not per event."""
        peer = CURRENT_PEER.get()
        protocol = peer.protocol if peer is not None else CORE_PROTOCOL
        self.delivered[protocol] += len(events)
        if peer is not None and peer.connection is not None:
            peer.connection.events_out += len(events)
        now = time.time()
        observe_many(self._child(self.delivery_latency, protocol),
                     [max(0.0, now - ev.recorded_at.timestamp()) for ev in events])

    def _child(self, metric: Histogram, label: str) -> Any:
        key = (id(metric), label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(label)
        return child

    # --- samples and rates ----------------------------------------------------------

    def sample(self) -> None:
        store = self.gw.store
        if store is None or store.tailer is None or store.writer is None:
            return
        self.samples.append(
            Sample(
                time.monotonic(),
                time.time(),
                store.tailer.head,
                store.writer.stats.events,
                dict(self.appended),
                dict(self.delivered),
                {name: listener.stats.connections_open
                 for name, listener in self.gw.listeners.items()},
                tuple(self._append_le),
                tuple(self._commit_le),
            )
        )

    def _window(self) -> tuple[Sample, Sample] | None:
        """The oldest and newest samples about :data:`RATE_WINDOW` apart
        (less just after start); None before there are two."""
        self.sample()
        if len(self.samples) < 2:
            return None
        last = self.samples[-1]
        first = last
        for s in reversed(self.samples):
            first = s
            if last.mono - s.mono >= RATE_WINDOW:
                break
        return first, last

    def rates(self) -> dict[str, Any]:
        """Events per second over about the last :data:`RATE_WINDOW` seconds."""
        window = self._window()
        if window is None:
            return {"window_seconds": 0.0, "append": 0.0, "delivery": 0.0, "log": 0.0,
                    "by_protocol": {}}
        first, last = window
        dt = max(last.mono - first.mono, 1e-6)
        protocols = sorted(set(last.appended) | set(last.delivered))
        by_protocol = {
            p: {
                "append": round((last.appended.get(p, 0) - first.appended.get(p, 0)) / dt, 3),
                "delivery": round(
                    (last.delivered.get(p, 0) - first.delivered.get(p, 0)) / dt, 3
                ),
            }
            for p in protocols
        }
        return {
            "window_seconds": round(dt, 3),
            "append": round(sum(v["append"] for v in by_protocol.values()), 3),
            "delivery": round(sum(v["delivery"] for v in by_protocol.values()), 3),
            # Every process's appends: the global head's growth.
            "log": round((last.head - first.head) / dt, 3),
            "by_protocol": by_protocol,
        }

    def latency(self) -> dict[str, Any]:
        """Append latency and commit duration quantiles over about the last
        :data:`RATE_WINDOW` seconds, from the histograms' buckets as
        Prometheus' ``histogram_quantile`` computes them (None: nothing
        observed in the window)."""
        window = self._window()
        out: dict[str, Any] = {"window_seconds": 0.0}
        for key in ("append", "commit"):
            out[key] = {"count": 0, "p50": None, "p99": None}
        if window is None:
            return out
        first, last = window
        out["window_seconds"] = round(last.mono - first.mono, 3)
        for key in ("append", "commit"):
            now, then = getattr(last, f"{key}_le"), getattr(first, f"{key}_le")
            counts = [a - b for a, b in zip(now, then or (0,) * len(now), strict=True)]
            out[key] = {"count": sum(counts), "p50": bucket_quantile(0.5, counts),
                        "p99": bucket_quantile(0.99, counts)}
        return out

    def connections_chart(self) -> list[dict[str, Any]]:
        """Open connections by protocol over the last ten minutes: the most
        seen in each :data:`CHART_BUCKET`-second bucket (none before start)."""
        self.sample()
        end = int(time.time() // CHART_BUCKET) * CHART_BUCKET + CHART_BUCKET
        start = end - CHART_BUCKET * CHART_BUCKETS
        buckets: list[dict[str, int] | None] = [None] * CHART_BUCKETS
        for s in self._chart_samples():
            i = int((s.wall - start) // CHART_BUCKET)
            if 0 <= i < CHART_BUCKETS:
                into = buckets[i] = buckets[i] or {}
                for proto, n in s.connections.items():
                    into[proto] = max(into.get(proto, 0), n)
        return [{"t": datetime.fromtimestamp(start + i * CHART_BUCKET, UTC).isoformat(),
                 "open": b} for i, b in enumerate(buckets)]

    def live_chart(self) -> list[dict[str, Any]]:
        """Events added to the log per :data:`CHART_BUCKET` seconds over the
        last ten minutes, from the sampled head position (all processes)."""
        self.sample()
        now = time.time()
        end = int(now // CHART_BUCKET) * CHART_BUCKET + CHART_BUCKET
        start = end - CHART_BUCKET * CHART_BUCKETS
        points = []
        samples = self._chart_samples()
        for i in range(CHART_BUCKETS):
            lo, hi = start + i * CHART_BUCKET, start + (i + 1) * CHART_BUCKET
            head_hi = _head_at(samples, hi)
            head_lo = _head_at(samples, lo)
            if head_lo is None and samples and samples[0].wall < hi:
                head_lo = samples[0].head  # the gateway started in this bucket
            events = head_hi - head_lo if head_lo is not None and head_hi is not None else 0
            points.append({"t": datetime.fromtimestamp(lo, UTC).isoformat(), "events": events})
        return points

    # --- subscription lag -------------------------------------------------------------

    async def subscription_lag(self) -> LagSnapshot:
        async with self._lag_lock:
            if time.monotonic() - self.lag.taken >= LAG_TTL:
                self.lag = await self._measure_lag()
            return self.lag

    async def _measure_lag(self) -> LagSnapshot:
        snap = LagSnapshot(taken=time.monotonic())
        now = time.time()
        try:
            async with asyncio.timeout(DB_TIMEOUT):
                snap.durable = await self._durable_lag(now)
        except Exception as exc:  # noqa: BLE001 - any failure: named in the snapshot
            snap.error = f"{exc.__class__.__name__}: {exc}"
        try:
            async with asyncio.timeout(DB_TIMEOUT):
                snap.parked = await self.gw.store.parking.parked_counts()
        except Exception:  # noqa: BLE001 - as above: the error is in snap.error
            # The database is away (snap.error says so): the last counts
            # rather than a drop to zero that would clear an alert.
            snap.parked = dict(self.lag.parked)
        head = self.gw.store.tailer.head
        need: list[int] = []
        pending: list[tuple[SubscriptionLag, int | None]] = []
        for sub in self.gw.store.open_subscriptions():
            oldest = sub.oldest_buffered
            if isinstance(sub, GroupMember):
                lag = SubscriptionLag(
                    "group-member", sub.name, _selector_json(sub.selector), sub.buffered,
                    _age(oldest.recorded_at if oldest else None, now),
                    delivered=sub.delivered, buffered=sub.buffered, state="member",
                )
                pending.append((lag, None))
                continue
            behind = max(0, head - sub.cursor)
            lag = SubscriptionLag(
                "subscription", "", _selector_json(sub.selector), sub.buffered + behind,
                _age(oldest.recorded_at if oldest else None, now),
                exact=behind == 0, delivered=sub.delivered, buffered=sub.buffered,
                state="live" if sub.live else "catching-up",
            )
            ask = sub.cursor + 1 if oldest is None and behind else None
            if ask is not None and len(need) < LAG_DETAILED:
                need.append(ask)
            pending.append((lag, ask))
        times: dict[int, datetime] = {}
        if need:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(DB_TIMEOUT):
                    times = await self.gw.store.monitor.recorded_at_many(need)
        for lag, ask in pending:
            if ask is not None and ask in times:
                snap.transient.append(
                    SubscriptionLag(**{**_fields(lag), "lag_seconds": _age(times[ask], now)}))
            else:
                snap.transient.append(lag)
        snap.transient.sort(key=lambda x: (-x.lag_events, -x.lag_seconds))
        return snap

    async def _durable_lag(self, now: float) -> list[SubscriptionLag]:
        store = self.gw.store
        durable = await store.monitor.durable_checkpoints()
        by_lag = sorted(durable, key=lambda d: d.head - d.checkpoint, reverse=True)
        detailed = {d.name for d in by_lag[:LAG_DETAILED]}
        out: list[SubscriptionLag] = []
        for d in durable:
            sel_json = d.selector
            head, checkpoint = d.head, d.checkpoint
            behind = max(0, head - checkpoint)
            if behind == 0:
                out.append(SubscriptionLag("durable", d.name, _clean(sel_json), 0, 0.0,
                                           checkpoint=checkpoint))
                continue
            if d.name not in detailed:
                out.append(SubscriptionLag("durable", d.name, _clean(sel_json), behind, 0.0,
                                           exact=False, checkpoint=checkpoint))
                continue
            sel = selector_from_json(sel_json)
            if sel.matcher is not None:
                events, _, exhausted = await store.tailer.read_selected(
                    sel, checkpoint, head, LAG_MATCHER_SCAN
                )
                first = events[0].recorded_at if events else None
                if first is None and not exhausted:
                    first = await store.monitor.recorded_at(checkpoint + 1)
                out.append(
                    SubscriptionLag(
                        "durable", d.name, _clean(sel_json),
                        len(events) if exhausted else behind,
                        _age(first, now), exact=exhausted, checkpoint=checkpoint,
                    )
                )
                continue
            upper = min(head, checkpoint + LAG_SCAN_POSITIONS)
            counted = await store.monitor.count_selected(
                sel, checkpoint, upper, LAG_SCAN_POSITIONS
            )
            exact = upper == head
            oldest = counted.oldest
            if oldest is None and not exact:
                oldest = await store.monitor.recorded_at(upper)
            out.append(
                SubscriptionLag(
                    "durable", d.name, _clean(sel_json), counted.events if exact else behind,
                    _age(oldest, now), exact=exact, checkpoint=checkpoint,
                )
            )
        return out


def bucket_quantile(q: float, counts: list[int]) -> float | None:
    """The ``q`` quantile of observations counted per :data:`LATENCY_BUCKETS`
    bucket (the last: beyond the largest bound), interpolated linearly
    within its bucket like ``histogram_quantile``; None with no observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i == len(LATENCY_BUCKETS):
                return LATENCY_BUCKETS[-1]  # beyond every bound: the largest, as Prometheus
            low = LATENCY_BUCKETS[i - 1] if i else 0.0
            return round(low + (LATENCY_BUCKETS[i] - low) * (rank - below) / n, 6)
        below += n
    return LATENCY_BUCKETS[-1]


def _fields(lag: SubscriptionLag) -> dict[str, Any]:
    return {f: getattr(lag, f) for f in SubscriptionLag.__slots__}


def _clean(sel: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sel.items() if v not in (None, [], "")}


def _head_at(samples: list[Sample], t: float) -> int | None:
    """The head position at wall time ``t`` (the last sample at or before it);
    None before the first sample."""
    found: int | None = None
    for s in samples:
        if s.wall > t:
            break
        found = s.head
    return found


class _GatewayCollector(Collector):
    """Reads the gateway's counters at scrape time (nothing is counted twice:
    the listeners keep their own counters, see ListenerStats)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.t = telemetry

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        gw = self.t.gw
        yield from self._process(gw)
        yield from self._listeners(gw)
        yield from self._per_protocol()
        store = gw.store
        if store is None or store.writer is None:
            return
        yield from self._store(gw, store)
        yield from self._subscriptions(gw, store)
        yield from self._database_pool(store)

    def _process(self, gw: Gateway) -> Iterator[Metric]:
        """Which polyport, up how long."""
        info = GaugeMetricFamily("polyport_build_info", "polyport version", labels=["version"])
        info.add_metric([polyport_version()], 1)
        yield info
        yield GaugeMetricFamily(
            "polyport_uptime_seconds", "Seconds since the gateway started",
            value=time.time() - gw.started_at,
        )

    def _listeners(self, gw: Gateway) -> Iterator[Metric]:
        """Each listener's own counters (ListenerStats), by protocol."""
        stats = [(name, listener.stats) for name, listener in sorted(gw.listeners.items())]
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "connections": CounterMetricFamily(
                "polyport_connections", "Connections accepted", labels=["protocol"]),
            "refused": CounterMetricFamily(
                "polyport_connections_refused",
                "Connections refused because max_connections were open", labels=["protocol"]),
            "open": GaugeMetricFamily(
                "polyport_connections_open", "Connections open now", labels=["protocol"]),
            "frames_in": CounterMetricFamily(
                "polyport_frames_received", "Protocol frames received", labels=["protocol"]),
            "frames_out": CounterMetricFamily(
                "polyport_frames_sent", "Protocol frames sent", labels=["protocol"]),
            "bytes_in": CounterMetricFamily(
                "polyport_received_bytes", "Bytes received", labels=["protocol"]),
            "bytes_out": CounterMetricFamily(
                "polyport_sent_bytes", "Bytes sent", labels=["protocol"]),
        }
        errors = CounterMetricFamily(
            "polyport_errors", "Errors reported to clients, by canonical code",
            labels=["protocol", "code"],
        )
        for name, s in stats:
            families["connections"].add_metric([name], s.connections_total)
            families["refused"].add_metric([name], s.connections_refused)
            families["open"].add_metric([name], s.connections_open)
            families["frames_in"].add_metric([name], s.frames_in)
            families["frames_out"].add_metric([name], s.frames_out)
            families["bytes_in"].add_metric([name], s.bytes_in)
            families["bytes_out"].add_metric([name], s.bytes_out)
            # Every canonical code at zero from the start, and any other code
            # a protocol's own framing reports once it has happened.
            for code in sorted(set(ERROR_BY_CODE) | set(s.errors)):
                errors.add_metric([name, code], s.errors.get(code, 0))
        yield from families.values()
        yield errors

    def _per_protocol(self) -> Iterator[Metric]:
        """What the hooks counted by protocol: appends and deliveries."""
        protocols = self.t.known_protocols()
        for attr, metric, doc in (
            ("appended", "polyport_events_appended", "Events appended, by protocol"),
            ("append_requests", "polyport_append_requests", "Append requests settled"),
            ("append_failures", "polyport_append_failures", "Append requests that failed"),
            ("delivered", "polyport_events_delivered",
             "Events handed to subscribers, by protocol"),
        ):
            fam = CounterMetricFamily(metric, doc, labels=["protocol"])
            counts: Counter[str] = getattr(self.t, attr)
            for proto in sorted(set(protocols) | set(counts)):
                fam.add_metric([proto], counts.get(proto, 0))
            yield fam

    def _store(self, gw: Gateway, store: EventStore) -> Iterator[Metric]:
        """Readiness, the writer, logins, queues and the tailer."""
        ws = store.writer.stats
        yield GaugeMetricFamily(
            "polyport_ready", "1 when /readyz answers 200 (database reachable, schema "
            "current, listeners bound), else 0", value=0 if gw.readiness_problems() else 1)
        yield GaugeMetricFamily(
            "polyport_database_up",
            "1 when a database round trip succeeded within the last few seconds, else 0",
            value=0 if store.health().database_problem else 1)
        yield GaugeMetricFamily(
            "polyport_appends_in_flight",
            "Append requests accepted and not answered yet (queued or committing)",
            value=store.writer.appends_in_flight)
        # Logins checked by this process, every protocol together (the
        # users service's throttle counts them).
        throttle = store.users.throttle
        yield CounterMetricFamily(
            "polyport_login_failures", "Failed logins (wrong or unknown user or password)",
            value=throttle.failures_total)
        yield CounterMetricFamily(
            "polyport_login_throttled",
            "Logins delayed because their address failed too often",
            value=throttle.delayed_total)
        yield CounterMetricFamily("polyport_commits", "Group commits", value=ws.commits)
        yield CounterMetricFamily(
            "polyport_committed_events", "Events written by this process", value=ws.events)
        yield CounterMetricFamily(
            "polyport_planned_commits",
            "Commits sent at planned positions while the one before was in flight",
            value=ws.planned_commits)
        yield CounterMetricFamily(
            "polyport_planned_commit_refusals",
            "Commits at planned positions refused because the log head had moved "
            "(redone on the checked path)", value=ws.planned_refused)
        yield GaugeMetricFamily(
            "polyport_writer_queue_depth", "Events waiting for the writer",
            value=store.writer.queue_depth)
        yield GaugeMetricFamily(
            "polyport_read_queue_depth", "Reads waiting for or holding a read slot",
            value=store.reads_waiting)
        yield GaugeMetricFamily(
            "polyport_log_head_position", "Last position seen by this process's tailer",
            value=store.tailer.head)
        yield GaugeMetricFamily(
            "polyport_live_subscriptions", "Subscriptions on the live feed",
            value=store.tailer.live_count)

    def _subscriptions(self, gw: Gateway, store: EventStore) -> Iterator[Metric]:
        """Subscriptions open here, durable ones in the database, and their lag."""
        lag = self.t.lag
        subs = store.open_subscriptions()
        yield GaugeMetricFamily(
            "polyport_open_subscriptions", "Subscriptions open in this process",
            value=len(subs))
        yield GaugeMetricFamily(
            "polyport_subscriber_queue_depth",
            "Events buffered for subscribers in this process, not yet taken",
            value=sum(s.buffered for s in subs))
        yield GaugeMetricFamily(
            "polyport_durable_subscriptions", "Durable subscriptions in the database",
            value=len(lag.durable))
        yield GaugeMetricFamily(
            "polyport_parked_events",
            "Events parked by persistent subscriptions (failed more than max_retries)",
            value=sum(lag.parked.values()))
        yield GaugeMetricFamily(
            "polyport_durable_subscription_lag_max_events",
            "Largest lag in events among durable subscriptions",
            value=max((d.lag_events for d in lag.durable), default=0))
        yield GaugeMetricFamily(
            "polyport_durable_subscription_lag_max_seconds",
            "Largest lag in seconds among durable subscriptions",
            value=max((d.lag_seconds for d in lag.durable), default=0.0))
        # One series per durable subscription only when asked for: their number
        # is up to the clients, and every name is a new series in Prometheus.
        if gw.config.metrics_per_subscription:
            yield from self._per_subscription(store, lag)
        yield GaugeMetricFamily(
            "polyport_transient_subscription_lag_max_events",
            "Largest lag in events among in-process subscriptions",
            value=max((x.lag_events for x in lag.transient), default=0))
        yield GaugeMetricFamily(
            "polyport_transient_subscription_lag_max_seconds",
            "Largest lag in seconds among in-process subscriptions",
            value=max((x.lag_seconds for x in lag.transient), default=0.0))

    def _per_subscription(self, store: EventStore, lag: LagSnapshot) -> Iterator[Metric]:
        """One series of each per durable subscription."""
        lag_events = GaugeMetricFamily(
            PER_SUBSCRIPTION_METRICS[0],
            "Events a durable subscription has still to consume", labels=["subscription"])
        lag_seconds = GaugeMetricFamily(
            PER_SUBSCRIPTION_METRICS[1],
            "Age of the oldest event a durable subscription has still to consume",
            labels=["subscription"])
        parked = GaugeMetricFamily(
            PER_SUBSCRIPTION_METRICS[2], "Events a durable subscription has parked",
            labels=["subscription"])
        consumers = GaugeMetricFamily(
            PER_SUBSCRIPTION_METRICS[3],
            "Consumers attached to a durable subscription", labels=["subscription"])
        attached = store.consumer_counts()
        for d in lag.durable:
            key = (d.selector.get("context", ""), d.name)
            lag_events.add_metric([d.name], d.lag_events)
            lag_seconds.add_metric([d.name], d.lag_seconds)
            parked.add_metric([d.name], lag.parked.get(key, 0))
            consumers.add_metric([d.name], attached.get(key, 0))
        yield lag_events
        yield lag_seconds
        yield parked
        yield consumers

    def _database_pool(self, store: EventStore) -> Iterator[Metric]:
        """The database pool's connections."""
        if store.monitor is not None:
            pool = store.monitor.pool_stats()
            conns = GaugeMetricFamily(
                "polyport_db_pool_connections", "Database pool connections",
                labels=["state"])
            conns.add_metric(["idle"], pool.idle)
            conns.add_metric(["busy"], max(0, pool.size - pool.idle))
            yield conns
            yield GaugeMetricFamily(
                "polyport_db_pool_max_connections", "Largest size of the database pool",
                value=pool.max)
