"""One worker of a multi-process gateway (``serve --workers N``), and how the
first worker's ``/metrics`` and ``/status`` speak for all of them.

:class:`WorkerRole` is what the supervisor (gateway/process/supervisor.py) hands a
worker: its index, the database, the concrete ports, and so which listeners
it runs (every byte-stream listener in every worker; Res01 and HTTP in worker
0 only).

Aggregation.  Every worker serves its own numbers on a unix socket in the
run directory (``worker-<index>.sock``, directory mode 0700):
``GET /metrics`` (its registry's families as JSON) and ``GET /status`` (its
part of the status document).  Worker 0, which serves HTTP, asks each worker
at scrape time and merges (:class:`Aggregator`).  prometheus_client's
multiprocess mode was the other way; it was not taken because most of
polyport's metrics are read at scrape time from live objects by a collector
(listener counters, queue depths, pools, lag), which multiprocess mode
cannot aggregate (it only sums values its own metric objects wrote to
mmapped files), its files say nothing for ``/status``, and it drops the
process collectors.  Asking the workers gives exact, current numbers for
both endpoints.  What multiprocess mode gives for free is kept by hand:

- counters and histograms stay monotonic across a worker's restart (its last
  values are carried over, as multiprocess mode keeps a dead pid's files);
  a worker that does not answer a scrape keeps its last counter values;
- gauges are aggregated per metric, explicitly (:data:`GAUGE_MAX`,
  :data:`GAUGE_MIN`, else the sum), like multiprocess mode's gauge modes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from polyport.core.chain import Connect
from polyport.core.chain_wire import WIRE_VERSION
from polyport.gateway.config import PORT_KEYS, GatewayConfig
from polyport.gateway.http.collectors import WithoutCreated

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

log = logging.getLogger("polyport.workers")

STATE_FILE = "supervisor.json"
# A worker that has not answered within this is left out of one scrape.
FETCH_TIMEOUT = 2.0

# Gauges whose aggregate is the largest value (the same fact seen by every
# worker, or a maximum already), or the smallest; every other gauge is summed
# (connections, queue depths, pools, memory: each worker has its own).
GAUGE_MAX = frozenset({
    "polyport_build_info",
    "polyport_uptime_seconds",
    "polyport_log_head_position",
    "polyport_durable_subscriptions",
    "polyport_durable_subscription_lag_max_events",
    "polyport_durable_subscription_lag_max_seconds",
    "polyport_subscription_lag_events",
    "polyport_subscription_lag_seconds",
    "polyport_parked_events",
    "polyport_subscription_parked_events",
    "polyport_transient_subscription_lag_max_events",
    "polyport_transient_subscription_lag_max_seconds",
    "process_max_fds",
    "python_info",
})
# Ready and database up: the gateway is only as ready as its least ready worker.
GAUGE_MIN = frozenset({"process_start_time_seconds", "polyport_ready", "polyport_database_up"})
MONOTONIC_TYPES = frozenset({"counter", "histogram", "summary"})


def socket_path(run_dir: str, index: int) -> Path:
    return Path(run_dir) / f"worker-{index}.sock"


def chain_socket_path(run_dir: str) -> Path:
    """Where the commit chain (gateway/process/chain.py, or the worker
    hosting it) listens: named for its messages' version (WIRE_VERSION)."""
    return Path(run_dir) / f"chain-v{WIRE_VERSION}.sock"


def chain_connector(run_dir: str) -> Connect:
    """How a worker reaches the commit chain."""
    path = str(chain_socket_path(run_dir))

    async def connect(
        factory: Callable[[], asyncio.Protocol],
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        return await asyncio.get_running_loop().create_unix_connection(factory, path)

    return connect


async def listen_for_workers(
    factory: Callable[[], asyncio.Protocol], run_dir: str
) -> asyncio.AbstractServer:
    """The commit chain's socket, whether its own process or a worker hosts
    it: ``factory`` is the chain's (CommitChain.protocol)."""
    path = chain_socket_path(run_dir)
    path.unlink(missing_ok=True)  # a killed predecessor's
    server = await asyncio.get_running_loop().create_unix_server(factory, str(path))
    os.chmod(path, 0o600)
    return server


# The index the supervisor gives the commit chain process's slot and role.
CHAIN_INDEX = -1


@dataclass(frozen=True)
class WorkerRole:
    index: int  # 0: also Res01, HTTP and the aggregated /metrics and /status
    count: int
    run_dir: str
    database_url: str
    # Port setting ("bson_port", "http_port", …) -> the port every worker
    # uses: what the supervisor resolved 0 to.
    ports: dict[str, int]
    # Listeners that run in every worker (ListenerDef.per_worker).
    shared: frozenset[str]
    supervisor_pid: int = 0
    # Appends go through the commit chain process (core/chain.py) rather
    # than each worker's own writer.
    chain: bool = False
    # The chain runs in the last worker rather than a process of its own.
    chain_in_worker: bool = False
    # The notify group (core/notify.py) of every process of this gateway
    # when a commit chain tells each worker every commit; without a chain
    # each worker is a group of its own and they NOTIFY each other.
    notify_group: int = 0

    @property
    def store_notify_group(self) -> int | None:
        """This process's notify group; None: one of its own."""
        return self.notify_group if self.chain else None

    @property
    def hosts_chain(self) -> bool:
        return self.chain and self.chain_in_worker and self.index == self.count - 1

    @property
    def commits(self) -> bool:
        """Whether this process commits appends (``cpu_scheduling =
        forwarders``): the chain process, the worker hosting the chain, and
        a worker with no chain; the other workers forward theirs."""
        return self.index == CHAIN_INDEX or not self.chain or self.hosts_chain

    @property
    def first(self) -> bool:
        return self.index == 0

    def runs(self, port_key: str) -> bool:
        """Whether this worker binds the port of setting ``port_key``."""
        return self.first or port_key in {f"{name}_port" for name in self.shared}

    def apply(self, config: GatewayConfig) -> GatewayConfig:
        """``config`` as this worker runs it: the supervisor's database when
        the configuration names none (the embedded one), ports 0 resolved,
        and the listeners that are not this worker's turned off.  Applied to
        a configuration read again on SIGHUP too, so that only what an
        operator changed shows as changed."""
        changes: dict[str, Any] = {}
        if not config.database_url:
            changes["database_url"] = self.database_url
        for key in PORT_KEYS:
            value = getattr(config, key)
            if value is None:
                continue
            if not self.runs(key):
                changes[key] = None
            elif value == 0 and key in self.ports:
                changes[key] = self.ports[key]
        return replace(config, **changes)


# --- what one worker says about itself ----------------------------------------------


async def local_families(gw: Gateway) -> list[dict[str, Any]]:
    """This worker's metric families, every series included (the first
    worker hides per-subscription series from requests without the token)."""
    telemetry = gw.telemetry
    assert telemetry is not None
    await telemetry.subscription_lag()
    telemetry.prime()
    return [
        {
            "name": m.name,
            "type": m.type,
            "help": m.documentation,
            "unit": m.unit,
            "samples": [[s.name, s.labels, s.value] for s in m.samples],
        }
        for m in WithoutCreated(telemetry.registry).collect()
    ]


async def local_status(gw: Gateway, names_shown: bool) -> dict[str, Any]:
    from polyport.gateway.http.status import build_status

    doc = await build_status(gw, (), names_shown=names_shown, local_only=True)
    doc["pid"] = os.getpid()
    return doc


def local_connections(gw: Gateway, filters: dict[str, str]) -> list[dict[str, Any]]:
    """This process's open connections, as the admin API lists them."""
    found = gw.connections.list(
        protocol=filters.get("protocol"), user=filters.get("user"),
        address=filters.get("address"),
    )
    return [c.as_json() for c in found]


def close_local_connection(gw: Gateway, conn_id: int, closer: str) -> dict[str, Any] | None:
    """Close this process's connection ``conn_id``; what it was, or None."""
    conn = gw.connections.get(conn_id)
    if conn is None:
        return None
    log.info("admin: closing connection %d (%s from %s) (from %s)", conn_id, conn.protocol,
             conn.peer, closer)
    row = conn.as_json()
    gw.connections.close(conn_id)
    return row


class WorkerServer:
    """The worker's unix socket for the first worker's questions."""

    def __init__(self, gw: Gateway, role: WorkerRole) -> None:
        self.gw = gw
        self.path = socket_path(role.run_dir, role.index)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/connections", self._connections)
        app.router.add_delete("/connections/{id}", self._close_connection)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.path.unlink(missing_ok=True)  # a crashed predecessor's
        await web.UnixSite(self._runner, str(self.path)).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.path.unlink(missing_ok=True)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.gw.telemetry is None:
            raise web.HTTPServiceUnavailable()
        return web.json_response({"pid": os.getpid(), "families": await local_families(self.gw)})

    async def _status(self, request: web.Request) -> web.Response:
        if self.gw.telemetry is None:
            raise web.HTTPServiceUnavailable()
        names = request.query.get("names") == "1"
        return web.json_response(await local_status(self.gw, names))


    async def _connections(self, request: web.Request) -> web.Response:
        return web.json_response(local_connections(self.gw, dict(request.query)))

    async def _close_connection(self, request: web.Request) -> web.Response:
        try:
            conn_id = int(request.match_info["id"])
        except ValueError:
            raise web.HTTPBadRequest() from None
        closed = close_local_connection(self.gw, conn_id, request.query.get("from", "admin"))
        if closed is None:
            raise web.HTTPNotFound()
        return web.json_response(closed)


# --- the first worker: everyone's numbers ---------------------------------------------


@dataclass
class _Snapshot:
    pid: int
    families: list[dict[str, Any]]


SampleKey = tuple[str, str, tuple[tuple[str, str], ...]]  # family, sample name, labels


def _sample_key(family: str, name: str, labels: dict[str, str]) -> SampleKey:
    return family, name, tuple(sorted(labels.items()))


@dataclass
class Aggregator:
    gw: Gateway
    role: WorkerRole
    # The last families each worker answered with (by index).
    _last: dict[int, _Snapshot] = field(default_factory=dict)
    # Counter and histogram values of worker processes that have ended.
    _carried: dict[SampleKey, float] = field(default_factory=dict)

    async def _fetch(self, index: int, path: str) -> Any | None:
        answer = await self._ask(index, "GET", path)
        return answer[1] if answer is not None else None

    def _others(self) -> list[int]:
        return [i for i in range(self.role.count) if i != self.role.index]

    def supervisor_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(
                (Path(self.role.run_dir) / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return data

    async def _ask(self, index: int, method: str, path: str) -> tuple[int, Any] | None:
        """(HTTP status, JSON body or None) of worker ``index``; None when it
        did not answer."""
        connector = aiohttp.UnixConnector(path=str(socket_path(self.role.run_dir, index)))
        try:
            async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
            ) as session, session.request(method, f"http://worker{path}") as r:
                body = await r.json() if r.status == 200 else None
                return r.status, body
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("worker %d did not answer %s %s: %s", index, method, path, exc)
            return None

    # --- the admin API's connections ------------------------------------------------

    async def connections(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        """Every worker's open connections (each id names its worker);
        a worker that does not answer is left out, and logged."""
        query = "?" + urlencode(filters) if filters else ""
        others = self._others()
        answers = await asyncio.gather(*(self._ask(i, "GET", "/connections" + query)
                                         for i in others))
        found = local_connections(self.gw, filters)
        for index, answer in zip(others, answers, strict=True):
            if answer is not None and answer[0] == 200 and isinstance(answer[1], list):
                found.extend(answer[1])
            else:
                log.warning("worker %d did not list its connections: left out", index)
        found.sort(key=lambda c: (c["since"], c["id"]))
        return found

    async def close_connection(self, conn_id: int, closer: str) -> dict[str, Any] | None:
        """Close connection ``conn_id`` in the worker that holds it (its id
        says which); what it was, or None when there is no such connection."""
        owner = conn_id % self.role.count
        if owner == self.role.index:
            return close_local_connection(self.gw, conn_id, closer)
        answer = await self._ask(
            owner, "DELETE", f"/connections/{conn_id}?{urlencode({'from': closer})}")
        if answer is None:
            raise WorkerUnreachable(f"worker {owner}, which holds connection {conn_id}, "
                                    "did not answer; retry shortly")
        status, body = answer
        return body if status == 200 and isinstance(body, dict) else None

    # --- /metrics -----------------------------------------------------------------

    async def metrics(self) -> list[Metric]:
        others = self._others()
        mine, *answers = await asyncio.gather(
            local_families(self.gw), *(self._fetch(i, "/metrics") for i in others)
        )
        live: dict[int, list[dict[str, Any]]] = {self.role.index: mine}
        stale: dict[int, list[dict[str, Any]]] = {}
        up = {self.role.index: True}
        for index, answer in zip(others, answers, strict=True):
            up[index] = answer is not None
            previous = self._last.get(index)
            if answer is None:
                if previous is not None:  # counters only: gauges of the unknown are unknown
                    stale[index] = [f for f in previous.families if f["type"] in MONOTONIC_TYPES]
                continue
            if previous is not None and previous.pid != answer["pid"]:
                self._carry(previous.families)  # the worker restarted
            self._last[index] = _Snapshot(int(answer["pid"]), answer["families"])
            live[index] = answer["families"]
        merged = merge_families([*live.values(), *stale.values()], self._carried)
        merged.extend(self._worker_families(up))
        return merged

    def _carry(self, families: list[dict[str, Any]]) -> None:
        for fam in families:
            if fam["type"] not in MONOTONIC_TYPES:
                continue
            for name, labels, value in fam["samples"]:
                key = _sample_key(fam["name"], name, labels)
                self._carried[key] = self._carried.get(key, 0.0) + value

    def _worker_families(self, up: dict[int, bool]) -> list[Metric]:
        count = GaugeMetricFamily("polyport_workers", "Gateway worker processes configured",
                                  value=self.role.count)
        alive = GaugeMetricFamily(
            "polyport_worker_up", "Whether a worker answered this scrape (1) or not (0)",
            labels=["worker"])
        for index in range(self.role.count):
            alive.add_metric([str(index)], 1 if up.get(index) else 0)
        restarts = Metric("polyport_worker_restarts", "Times the supervisor restarted a worker",
                          "counter")
        for w in self.supervisor_state().get("workers", []):
            restarts.add_sample("polyport_worker_restarts_total", {"worker": str(w["index"])},
                                float(w.get("restarts", 0)))
        return [count, alive, restarts]

    # --- /status ------------------------------------------------------------------

    async def status(self, mine: dict[str, Any], names_shown: bool) -> dict[str, Any]:
        others = self._others()
        query = f"/status?names={1 if names_shown else 0}"
        answers = await asyncio.gather(*(self._fetch(i, query) for i in others))
        mine = {**mine, "pid": os.getpid()}
        parts: dict[int, dict[str, Any] | None] = {self.role.index: mine}
        parts.update(zip(others, answers, strict=True))
        return merge_status(self.role.index, parts, self.supervisor_state(), self.role.count)


class WorkerUnreachable(Exception):
    """The worker that holds a connection did not answer."""


def merge_families(
    workers: list[list[dict[str, Any]]], carried: dict[SampleKey, float]
) -> list[Metric]:
    """Families of several workers as one: counters and histograms summed
    (plus what ended workers carried), gauges by :data:`GAUGE_MAX`,
    :data:`GAUGE_MIN` or summed."""
    order: list[str] = []
    meta: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for families in workers:
        for fam in families:
            name = fam["name"]
            if name not in meta:
                order.append(name)
                meta[name] = fam
                values[name] = {}
            for sample, labels, value in fam["samples"]:
                key = (sample, tuple(sorted(labels.items())))
                values[name].setdefault(key, []).append(float(value))
    for (family, sample, labels), value in carried.items():
        if family not in meta:
            continue  # no live worker has the family any more
        values[family].setdefault((sample, labels), []).append(value)
    out = []
    for name in order:
        fam = meta[name]
        metric = Metric(name, fam["help"], fam["type"], fam["unit"])
        pick: Callable[[list[float]], float] = _total
        if fam["type"] not in MONOTONIC_TYPES and name in GAUGE_MAX:
            pick = max
        elif fam["type"] not in MONOTONIC_TYPES and name in GAUGE_MIN:
            pick = min
        metric.samples = [
            Sample(sample, dict(labels), pick(vs)) for (sample, labels), vs in values[name].items()
        ]
        out.append(metric)
    return out


def _total(values: list[float]) -> float:
    return float(sum(values))


# --- merging status documents ----------------------------------------------------------

_LISTENER_SUMS = (
    "connections_open", "connections_total", "connections_refused", "frames_in", "frames_out",
    "bytes_in", "bytes_out", "events_appended", "events_delivered", "errors_total",
)


def _add_listener(into: dict[str, Any], row: dict[str, Any]) -> None:
    for key in _LISTENER_SUMS:
        if isinstance(row.get(key), int | float):
            into[key] = (into.get(key) or 0) + row[key]
    errors = dict(into.get("errors") or {})
    for code, n in (row.get("errors") or {}).items():
        errors[code] = errors.get(code, 0) + n
    into["errors"] = dict(sorted(errors.items()))


def merge_status(
    first: int,
    parts: dict[int, dict[str, Any] | None],
    supervisor: dict[str, Any],
    count: int,
) -> dict[str, Any]:
    """Worker ``first``'s document (the full one) with every other worker's
    counters added, and a ``workers`` list (one entry per worker, answered
    or not)."""
    doc = json.loads(json.dumps(parts[first]))  # a deep copy
    answered = [p for _i, p in sorted(parts.items()) if p is not None]
    others = [p for i, p in sorted(parts.items()) if p is not None and i != first]
    rows = {row["name"]: row for row in doc["listeners"]}
    for part in others:
        for row in part["listeners"]:
            if row["name"] in rows:
                _add_listener(rows[row["name"]], row)
            else:
                doc["listeners"].append(row)
                rows[row["name"]] = row
    writers = [p["writer"] for p in answered]
    sizes = [w["batch_sizes"] for w in writers if w["batch_sizes"]["count"]]
    total = sum(s["count"] for s in sizes)
    doc["writer"] = {
        "queue_depth": sum(w["queue_depth"] for w in writers),
        "commits": sum(w["commits"] for w in writers),
        "events": sum(w["events"] for w in writers),
        "last_batch_size": max(w["last_batch_size"] for w in writers),
        "planned_commits": sum(w.get("planned_commits", 0) for w in writers),
        "planned_refused": sum(w.get("planned_refused", 0) for w in writers),
        # Percentiles are not additive: the largest of the workers'.
        "batch_sizes": {
            "count": total,
            "mean": round(sum(s["mean"] * s["count"] for s in sizes) / total, 2) if total else 0.0,
            "p50": max((s["p50"] for s in sizes), default=0),
            "p95": max((s["p95"] for s in sizes), default=0),
            "max": max((s["max"] for s in sizes), default=0),
        },
    }
    doc["reads_waiting"] = sum(p["reads_waiting"] for p in answered)
    doc["log"] = {
        "head_position": max(p["log"]["head_position"] for p in answered),
        "last_recorded_at": max((p["log"]["last_recorded_at"] for p in answered
                                 if p["log"]["last_recorded_at"]), default=None),
    }
    by_protocol: dict[str, dict[str, float]] = {}
    for p in answered:
        for proto, r in p["rates"]["by_protocol"].items():
            into = by_protocol.setdefault(proto, {"append": 0.0, "delivery": 0.0})
            into["append"] = round(into["append"] + r["append"], 3)
            into["delivery"] = round(into["delivery"] + r["delivery"], 3)
    doc["rates"] = {
        **doc["rates"],
        "append": round(sum(p["rates"]["append"] for p in answered), 3),
        "delivery": round(sum(p["rates"]["delivery"] for p in answered), 3),
        # Each worker sees the global head grow: the same number.
        "log": max(p["rates"]["log"] for p in answered),
        "by_protocol": dict(sorted(by_protocol.items())),
    }
    subs = doc["subscriptions"]
    subs["live"] = sum(p["subscriptions"]["live"] for p in answered)
    subs["open"] = sum(p["subscriptions"]["open"] for p in answered)
    in_process = [row for p in answered for row in p["subscriptions"]["in_process"]]
    in_process.sort(key=lambda row: (-row["lag_events"], -row["lag_seconds"]))
    subs["in_process"] = in_process[:100]
    doc["connections"] = {"open": sum(p["connections"]["open"] for p in answered)}
    doc["latency"] = _merge_latency([p["latency"] for p in answered])
    doc["connections_chart"] = _merge_connection_charts(
        [p["connections_chart"] for p in answered])
    doc["ready"] = len(answered) == count and all(p["ready"] for p in answered)
    if supervisor.get("started_at"):
        started = float(supervisor["started_at"])
        doc["started_at"] = datetime.fromtimestamp(started, UTC).isoformat()
        doc["uptime_seconds"] = round(time.time() - started, 3)
    doc.pop("pid", None)
    doc["workers"] = _workers(parts, supervisor, count)
    return doc


def _merge_latency(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Quantiles are not additive: the largest of the workers'."""
    out: dict[str, Any] = {"window_seconds": max(p["window_seconds"] for p in parts)}
    for key in ("append", "commit"):
        out[key] = {"count": sum(p[key]["count"] for p in parts)}
        for q in ("p50", "p99"):
            seen = [p[key][q] for p in parts if p[key][q] is not None]
            out[key][q] = max(seen, default=None)
    return out


def _merge_connection_charts(charts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each worker's open connections by bucket, summed per protocol."""
    by_time: dict[str, dict[str, int] | None] = {}
    for chart in charts:
        for point in chart:
            into = by_time.setdefault(point["t"], None)
            if point["open"] is not None:
                into = by_time[point["t"]] = into or {}
                for proto, n in point["open"].items():
                    into[proto] = into.get(proto, 0) + n
    return [{"t": t, "open": v} for t, v in sorted(by_time.items())[-len(charts[0]):]]


def _workers(
    parts: dict[int, dict[str, Any] | None], supervisor: dict[str, Any], count: int
) -> list[dict[str, Any]]:
    known = {int(w["index"]): w for w in supervisor.get("workers", [])}
    out = []
    for index in range(count):
        part = parts.get(index)
        entry: dict[str, Any] = {
            "index": index,
            "pid": part["pid"] if part else known.get(index, {}).get("pid"),
            "reachable": part is not None,
            "restarts": known.get(index, {}).get("restarts", 0),
            "last_exit": known.get(index, {}).get("last_exit"),
        }
        if part is not None:
            entry.update({
                "ready": part["ready"],
                "started_at": part["started_at"],
                "connections_open": part["connections"]["open"],
                "listeners": {
                    row["name"]: {k: row.get(k) for k in (
                        "connections_open", "connections_total", "events_appended",
                        "events_delivered")}
                    for row in part["listeners"] if row.get("kind") == "protocol"
                },
                "writer": {k: part["writer"][k] for k in ("queue_depth", "commits", "events")},
                "subscriptions_open": part["subscriptions"]["open"],
            })
        out.append(entry)
    return out
