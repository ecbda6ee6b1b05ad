"""Ready-made monitoring (issue 29.5): the alert rules pass ``promtool check
rules`` and their unit tests (``promtool test rules``), the Grafana dashboard
is well-formed, every metric either names is one a real gateway's /metrics
exports, and the gauges added for them follow the gateway: consumers per
subscription, parked events, appends in flight (readiness and database-up:
tests/gateway/test_readyz.py)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from polyport.core.commands import Append
from polyport.core.events import EventData
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from tests.gateway.test_metrics import Samples, scrape, until, value
from tests.pg import HEAD_LOCK, lock_waiters, row_locked

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERT_TESTS = MONITORING / "alerts_test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
TOKEN = "monitoring-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Series Prometheus makes itself, not the gateway.
PROMETHEUS_OWN = frozenset({"up"})
# The metrics added for the dashboard and the rules: each must be used.
ADDED = frozenset({
    "polyport_ready", "polyport_database_up", "polyport_parked_events",
    "polyport_subscription_parked_events", "polyport_subscription_consumers",
    "polyport_appends_in_flight", "polyport_commit_duration_seconds_bucket",
})
_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OPERATORS = frozenset({"and", "or", "unless", "bool", "offset"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once
    strings, label matchers, ranges and grouping clauses are taken out,
    other than functions and aggregations (followed by a parenthesis) and
    binary operators."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = _CLAUSE.sub("", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group(0) in _OPERATORS:
            continue
        names.add(m.group(0))
    return names


def test_metric_names_of_an_expression() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{x="b c"}[5m]))) > 1'
    ) == {"a_bucket"}
    assert metric_names("b == 0 and on (instance, s) c > 0") == {"b", "c"}
    assert metric_names('sum without (state) (d{state="busy"}) >= e') == {"d", "e"}


def rule_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                    "(apt-get install -y prometheus puts it in /usr/bin)")
@pytest.mark.parametrize("args", [("check", "rules", ALERTS.name),
                                  ("test", "rules", ALERT_TESTS.name)])
def test_promtool_accepts_the_alert_rules(args: tuple[str, ...]) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], check=False, cwd=MONITORING, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            # Every query follows the instance picker.
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


async def create_group(gw: Any, http: aiohttp.ClientSession, name: str, stream: str,
                       **settings: Any) -> None:
    host, port = gw.http_address
    admin = f"http://{host}:{port}/admin"
    async with http.post(admin + "/subscriptions", json={
        "name": name, "context": "default", "stream": stream, "start": "beginning",
    }) as r:
        assert r.status == 201, await r.text()
    if settings:
        async with http.put(admin + f"/subscriptions/{name}/settings?context=default",
                            json=settings) as r:
            assert r.status == 200, await r.text()


async def test_every_metric_the_rules_and_dashboard_use_is_exported(gateway_factory) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=TOKEN)
    async with aiohttp.ClientSession(headers=AUTH) as http:
        await create_group(gw, http, "audit", "ledger")
    samples, _ = await scrape(gw, TOKEN)
    exported = {name for name, _labels in samples}
    used_by_rules = set().union(*map(metric_names, rule_expressions()))
    used_by_dashboard = set().union(*map(metric_names, dashboard_expressions()))
    assert used_by_rules - PROMETHEUS_OWN <= exported, used_by_rules - exported
    assert used_by_dashboard <= exported, used_by_dashboard - exported
    assert ADDED <= used_by_dashboard, ADDED - used_by_dashboard
    alerted = {"polyport_ready", "polyport_database_up", "polyport_parked_events",
               "polyport_subscription_consumers", "polyport_commit_duration_seconds_bucket",
               "polyport_planned_commit_refusals_total"}
    assert alerted <= used_by_rules, alerted - used_by_rules


async def test_consumers_parked_events_and_appends_in_flight(gateway_factory, db_url) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=TOKEN)
    host, port = gw.listeners["reactivesocket"].address
    current: Samples = {}

    async def seen(name: str, want: float, **labels: str) -> bool:
        nonlocal current
        current, _ = await scrape(gw, TOKEN)
        return value(current, name, **labels) == want

    async with aiohttp.ClientSession(headers=AUTH) as http:
        await create_group(gw, http, "workers", "jobs", max_retries=0)
    await gw.store.append(Append("default", "jobs", (EventData("Work", b"{}"),)))
    samples, _ = await scrape(gw, TOKEN)
    assert value(samples, "polyport_subscription_consumers", subscription="workers") == 0
    assert value(samples, "polyport_parked_events") == 0

    client = await ReactiveSocketClient.connect(host, port)
    try:
        stream = await client.subscribe(stream="jobs", group="workers", manual_ack=True,
                                        initial_n=10)
        await until(lambda: seen("polyport_subscription_consumers", 1, subscription="workers"))
        ev = await stream.next(5)
        assert ev is not None
        await client.nack(stream, ev.position)  # max_retries 0: parked at once
        await until(lambda: seen("polyport_parked_events", 1))
        assert value(current, "polyport_subscription_parked_events", subscription="workers") == 1
    finally:
        await client.close()
    await until(lambda: seen("polyport_subscription_consumers", 0, subscription="workers"))

    # An append waiting for the head lock is in flight until it commits.
    assert value(current, "polyport_appends_in_flight") == 0
    async with row_locked(db_url, HEAD_LOCK):
        pending = asyncio.create_task(
            gw.store.append(Append("default", "jobs", (EventData("Work", b"{}"),))))
        await lock_waiters(db_url, 1)
        samples, _ = await scrape(gw, TOKEN)
        assert value(samples, "polyport_appends_in_flight") == 1
    await pending
    samples, _ = await scrape(gw, TOKEN)
    assert value(samples, "polyport_appends_in_flight") == 0
    assert value(samples, "polyport_commit_duration_seconds_count") >= 2
    assert value(samples, "polyport_ready") == 1
    assert value(samples, "polyport_database_up") == 1


async def test_per_subscription_series_need_the_admin_token(gateway_factory) -> None:
    gw = await gateway_factory(metrics_per_subscription=True, admin_token=TOKEN)
    async with aiohttp.ClientSession(headers=AUTH) as http:
        await create_group(gw, http, "secret-name", "s")
    anonymous, _ = await scrape(gw)
    names = {name for name, _labels in anonymous}
    assert "polyport_subscription_consumers" not in names
    assert "polyport_subscription_parked_events" not in names
    assert "polyport_parked_events" in names  # a total, no names in it
