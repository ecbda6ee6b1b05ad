"""The status page in headless Chromium while traffic flows (issue 8,
acceptance 2): the numbers and the chart appear; at a desktop and a phone
window size nothing overflows sideways, headers align with their cells, the
chart's ticks are round numbers and times use a 24-hour clock; a screenshot
per size is saved under test-output/ (ignored by git).

The test starts Debian's ``chromium`` itself and drives it over the DevTools
protocol (a WebSocket, with aiohttp); it is skipped only when no Chromium
binary is installed (``apt-get install chromium``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from polyport.core.migrate import head_revision
from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.reactivesocket.client import ReactiveSocketClient

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "test-output"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


class DevTools:
    """The few DevTools protocol calls this test needs, over one page target."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), 20)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"DevTools connection ended: {msg.type}")
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                result: dict[str, Any] = data["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextlib.asynccontextmanager
async def browser(binary: str) -> AsyncIterator[tuple[aiohttp.ClientSession, DevTools]]:
    profile = Path(tempfile.mkdtemp(prefix="polyport-chromium-"))
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "--window-size=1280,1500",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            if proc.returncode is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json(content_type=None)
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield http, DevTools(ws)
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


READ_PAGE = """
(() => {
  if (!document.body || document.body.dataset.loaded !== 'true') return { loaded: false };
  const text = id => document.getElementById(id).textContent;
  const rows = {};
  for (const tr of document.querySelectorAll('#listeners tbody tr')) {
    const row = {};
    for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
    row.kind = tr.dataset.kind;
    rows[tr.dataset.listener] = row;
  }
  const svg = document.querySelector('#chart svg');
  return {
    loaded: document.body.dataset.loaded === 'true',
    problem: document.getElementById('problem').hidden ? null : text('problem'),
    ready: text('ready'),
    version: text('version'),
    rateAppend: text('rate-append'),
    head: text('head'),
    connections: text('connections'),
    liveSubs: text('live-subs'),
    listeners: rows,
    chartSource: svg ? svg.dataset.source : null,
    chartTotal: svg ? Number(svg.dataset.total) : 0,
    bars: svg ? svg.querySelectorAll('rect.bar').length : 0,
    tallBars: svg ? [...svg.querySelectorAll('rect.bar')].filter(
      b => Number(b.getAttribute('height')) > 0).length : 0,
    subscriptions: document.querySelectorAll('#subscriptions tbody tr').length,
  };
})()
"""

# Layout facts at the current window size.
READ_LAYOUT = """
(() => {
  const align = el => getComputedStyle(el).textAlign;
  const columns = [];
  for (const table of document.querySelectorAll('table')) {
    const heads = [...table.querySelectorAll('thead th')].map(align);
    for (const tr of table.querySelectorAll('tbody tr')) {
      const cells = [...tr.children];
      if (cells.length !== heads.length) continue;  // a colspan placeholder row
      cells.forEach((td, i) => columns.push([table.id, i, heads[i], align(td)]));
    }
  }
  const svg = document.querySelector('#chart svg');
  return {
    scrollWidth: document.scrollingElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth,
    innerWidth: window.innerWidth,
    columns,
    ticks: svg ? JSON.parse(svg.dataset.ticks) : null,
    tickLabels: svg ? [...svg.querySelectorAll('text.tick')].map(t => t.textContent) : [],
    timeLabels: svg ? [...svg.querySelectorAll('text:not(.tick)')].map(t => t.textContent) : [],
    updated: document.getElementById('updated').textContent,
    schema: document.getElementById('schema').textContent,
    links: [...document.querySelectorAll('.links a')].map(a => a.getAttribute('href')),
  };
})()
"""

SIZES = ((1280, 800), (420, 900))


def is_nice_step(step: int) -> bool:
    """1, 2 or 5 times a power of ten."""
    while step >= 10 and step % 10 == 0:
        step //= 10
    return step in (1, 2, 5)


def check_layout(layout: dict[str, Any], size: tuple[int, int], head: str) -> None:
    assert layout["innerWidth"] == size[0]
    assert layout["scrollWidth"] <= layout["innerWidth"], f"overflows sideways at {size}"
    assert layout["scrollWidth"] <= layout["clientWidth"], f"overflows sideways at {size}"
    assert layout["columns"], "no table rows to compare"
    for table, column, th, td in layout["columns"]:
        assert th == td, f"{table} column {column}: header {th}, cell {td}"
    ticks = layout["ticks"]
    assert ticks[0] == 0 and len(ticks) >= 2
    step = ticks[1] - ticks[0]
    assert all(b - a == step for a, b in itertools.pairwise(ticks)), ticks
    assert isinstance(step, int) and is_nice_step(step), ticks
    assert layout["tickLabels"] == [f"{t:,}" for t in ticks]
    assert layout["timeLabels"] and all(
        re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in layout["timeLabels"]), layout["timeLabels"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", layout["updated"]), layout["updated"]
    assert layout["schema"] == head
    assert layout["links"] == ["/metrics", "/admin/openapi.json"]


def number(text: str) -> float:
    return float(text.replace(",", "").lstrip("≤ "))


async def test_status_page_in_headless_chromium(gateway_factory) -> None:
    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium binary installed (apt-get install chromium)")
    gw = await gateway_factory()
    host, port = gw.http_address
    bson = await BsonClient.connect(*gw.listeners["bson"].address)
    rs = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address)
    sub = await rs.subscribe(prefix="page-", start="beginning")
    sent = 0
    stop = asyncio.Event()
    enough = asyncio.Event()

    async def traffic() -> None:
        nonlocal sent
        while not stop.is_set():
            await bson.emit("page-orders", "placed", {"n": sent})
            sent += 1
            if sent >= 20:
                enough.set()
            await asyncio.sleep(0.01)

    async def consume() -> None:
        while await sub.next(30) is not None:
            pass

    producer = asyncio.create_task(traffic())
    consumer = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(enough.wait(), 10)
        async with browser(binary) as (_http, devtools):
            await devtools.call("Page.enable")
            await devtools.call("Page.navigate", url=f"http://{host}:{port}/")
            seen: dict[str, Any] = {}
            for _ in range(200):
                seen = await devtools.evaluate(READ_PAGE) or {}
                if (seen.get("loaded") and seen.get("tallBars")
                        and number(seen["rateAppend"]) > 0):
                    break
                await asyncio.sleep(0.1)
            assert seen.get("loaded"), f"the page never rendered /status: {seen}"
            assert seen["problem"] is None
            # Numbers: every listener, with this traffic's counts.
            protocols = {k for k, v in seen["listeners"].items() if v["kind"] == "protocol"}
            assert protocols == set(gw.listeners)
            kinds = sorted(v["kind"] for v in seen["listeners"].values())
            # WebSocket endpoints: ReactiveSocket's and RSocket's.
            assert kinds.count("http") == 1 and kinds.count("websocket") == 2
            row = seen["listeners"]["bson"]
            assert row["address"] == "{}:{}".format(*gw.listeners["bson"].address)
            assert number(row["connections_open"]) == 1
            assert 20 <= number(row["events_appended"]) <= sent
            assert number(seen["listeners"]["reactivesocket"]["events_delivered"]) > 0
            assert number(seen["rateAppend"]) > 0
            assert number(seen["head"]) >= 20
            assert number(seen["connections"]) == 2
            assert number(seen["liveSubs"]) >= 1
            assert seen["ready"] == "ready" and seen["version"] not in ("", "–")
            assert seen["subscriptions"] >= 1
            # The chart: live counters (no event_stats table here), 60 bars,
            # the events sent so far among them.
            assert seen["chartSource"] == "live"
            assert seen["bars"] == 60 and seen["tallBars"] >= 1
            assert 20 <= seen["chartTotal"] <= sent
            shots: dict[tuple[int, int], bytes] = {}
            for width, height in SIZES:
                await devtools.call("Emulation.setDeviceMetricsOverride", width=width,
                                    height=height, deviceScaleFactor=1, mobile=False)
                # Overlay scrollbars: the layout and the screenshot are the full width.
                await devtools.call("Emulation.setScrollbarsHidden", hidden=True)
                # Wait for a redraw at this size (the page refreshes every 2 s).
                await devtools.evaluate("document.body.dataset.loaded = 'false'")
                for _ in range(100):
                    if (await devtools.evaluate(READ_PAGE) or {}).get("loaded"):
                        break
                    await asyncio.sleep(0.1)
                layout = await devtools.evaluate(READ_LAYOUT)
                check_layout(layout, (width, height), head_revision())
                shot = await devtools.call("Page.captureScreenshot", format="png",
                                           captureBeyondViewport=True)
                shots[(width, height)] = base64.b64decode(shot["data"])
        OUTPUT.mkdir(exist_ok=True)
        for (width, height), png in shots.items():
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
            (OUTPUT / f"status-page-{width}x{height}.png").write_bytes(png)
    finally:
        stop.set()
        await producer
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await consumer
        await rs.close()
        await bson.close()


TOKEN = "status-page-token"

READ_ADMIN = """
(() => {
  if (!document.body || document.body.dataset.loaded !== 'true') return { loaded: false };
  const text = id => document.getElementById(id).textContent;
  const subs = [...document.querySelectorAll('#subscriptions tbody tr')].map(
    tr => [...tr.children].map(td => td.textContent));
  const lines = {};
  for (const p of document.querySelectorAll('#connections-chart path.line')) {
    lines[p.dataset.protocol] = Number(p.dataset.last);
  }
  const errors = {};
  for (const tr of document.querySelectorAll('#errors tbody tr[data-code]')) {
    errors[tr.dataset.code] = [tr.querySelector('td[data-field=total]').textContent,
                               tr.lastElementChild.textContent];
  }
  return {
    loaded: document.body.dataset.loaded === 'true',
    subscriptions: subs,
    replay: [...document.querySelectorAll('button[data-replay]')].map(b => b.dataset.replay),
    note: text('subscriptions-note'),
    appendP99: text('append-p99'),
    commitP99: text('commit-p99'),
    lines,
    errors,
    errorsTotal: text('errors-total'),
  };
})()
"""


async def poll(devtools: DevTools, done: Any, what: str) -> dict[str, Any]:
    """READ_ADMIN until ``done(state)``; fails saying ``what`` did not happen."""
    state: dict[str, Any] = {}
    for _ in range(150):
        state = await devtools.evaluate(READ_ADMIN) or {}
        if state.get("loaded") and done(state):
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: {state}")


async def test_the_admin_token_reveals_names_and_replays_parked_events(gateway_factory) -> None:
    """Typed into the page, the token goes with /status (subscription names
    appear) and with the replay button's POST: the parked event reaches the
    consumer again.  The page also shows append and commit p99, open
    connections per protocol as lines, and errors by code and protocol."""
    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium binary installed (apt-get install chromium)")
    gw = await gateway_factory(admin_token=TOKEN)
    host, port = gw.http_address
    admin = f"http://{host}:{port}/admin"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.post(admin + "/subscriptions", json={
            "name": "workers", "context": "default", "stream": "jobs", "start": "beginning",
        }) as r:
            assert r.status == 201, await r.text()
        async with http.put(admin + "/subscriptions/workers/settings?context=default",
                            json={"max_retries": 0}) as r:
            assert r.status == 200, await r.text()
    bson = await BsonClient.connect(*gw.listeners["bson"].address)
    rs = await ReactiveSocketClient.connect(*gw.listeners["reactivesocket"].address)
    producer: asyncio.Task[None] | None = None
    try:
        for n in range(5):
            await bson.emit("jobs", "Work", {"n": n})
        with pytest.raises(BsonError):
            await bson.query("no-such-binder", {})
        group = await rs.subscribe(stream="jobs", group="workers", manual_ack=True,
                                   initial_n=100)
        poison = await group.next(5)
        assert poison is not None
        await rs.nack(group, poison.position)  # max_retries 0: parked at once
        for _ in range(4):
            ev = await group.next(5)
            assert ev is not None
            await rs.ack(group, ev.position)

        async def traffic() -> None:
            # Appends all along: the page's p99 covers the last 10 s only.
            while True:
                await bson.emit("page-traffic", "T", {})
                await asyncio.sleep(0.05)

        producer = asyncio.create_task(traffic())
        async with browser(binary) as (_http, devtools):
            await devtools.call("Page.enable")
            await devtools.call("Page.navigate", url=f"http://{host}:{port}/")
            # Without the token: counts, no names, no actions.
            hidden = await poll(devtools, lambda s: s["subscriptions"], "no subscription rows")
            assert hidden["subscriptions"][0][:2] == ["durable", "(hidden)"]
            assert hidden["replay"] == []
            assert number(hidden["appendP99"]) > 0 and number(hidden["commitP99"]) > 0
            assert hidden["lines"]["bson"] == 1 and hidden["lines"]["reactivesocket"] == 1
            [(code, (count, where))] = hidden["errors"].items()
            assert (count, where) == ("1", "bson: 1") and hidden["errorsTotal"] == "1"
            assert code == "not_found"

            await devtools.evaluate(
                f"document.getElementById('admin-token').value = {json.dumps(TOKEN)};"
                "document.getElementById('admin-form').requestSubmit()")
            shown = await poll(devtools, lambda s: s["replay"], "no replay button")
            assert shown["replay"] == ["workers"]
            row = next(r for r in shown["subscriptions"] if r[1] == "workers")
            assert json.loads(row[2]) == {"context": "default", "stream": "jobs"}
            assert (row[6], row[7]) == ("1", "replay 1 parked")

            await devtools.evaluate("document.querySelector('button[data-replay]').click()")
            await poll(devtools, lambda s: s["note"] == "replaying 1 parked events of workers",
                       "the replay was not confirmed")
            again = await group.next(5)
            assert again is not None and again.position == poison.position
            await rs.ack(group, again.position)
            await poll(devtools, lambda s: not s["replay"], "the parked count never went to 0")
    finally:
        if producer is not None:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        await rs.close()
        await bson.close()
