"""``polyport serve --workers 2`` as real processes on the suite's PostgreSQL:
the byte-stream ports are shared by both workers (SO_REUSEPORT), the core
keeps positions gapless and deliveries single across them, /status and
/metrics speak for both, a killed worker comes back, SIGTERM drains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from polyport.core.migrate import asyncpg_dsn
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.gateway.process.supervisor import chain_mode, restart_delay
from polyport.gateway.process.workers import (
    CHAIN_INDEX,
    GAUGE_MAX,
    WorkerRole,
    merge_families,
    socket_path,
)
from polyport.protocols.bson.client import BsonClient, ConnectionClosed
from polyport.protocols.res01.client import Res01Client, new_event
from tests.gateway.test_cli_errors import polyport
from tests.listeners import port_flags
from tests.waiting import until

ALL_PORTS_ZERO = port_flags("0")

pytestmark = pytest.mark.timeout(180)


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    data_dir: Path
    ports: dict[str, Any]
    stderr: list[str] = field(default_factory=list)
    _drain: asyncio.Task[None] | None = None

    @property
    def http(self) -> str:
        return f"http://{self.ports['http']['host']}:{self.ports['http']['port']}"

    def port(self, listener: str) -> tuple[str, int]:
        li = self.ports["listeners"][listener]
        return li["host"], li["port"]

    async def status(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(self.http + "/status") as r:
            assert r.status == 200, await r.text()
            doc: dict[str, Any] = await r.json()
            return doc

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http, http.get(self.http + "/metrics") as r:
            assert r.status == 200
            return await r.text()

    async def said(self, pattern: str, timeout: float = 30) -> str:
        """The first stderr line matching ``pattern`` (waiting for it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for line in self.stderr:
                if re.search(pattern, line):
                    return line
            await asyncio.sleep(0.1)
        raise AssertionError(f"never said {pattern!r}:\n" + "".join(self.stderr[-40:]))


async def _drain(proc: asyncio.subprocess.Process, into: list[str]) -> None:
    # Workers log a line per connection: an unread pipe would block them.
    assert proc.stderr is not None
    while line := await proc.stderr.readline():
        into.append(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def serve(db_url: str, *extra: str, workers: str = "2", chain: str = "auto",
                settings: dict[str, str] | None = None) -> AsyncIterator[Served]:
    # The URL carries the test cluster's password: the environment, never argv.
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url
    env["POLYPORT_COMMIT_CHAIN"] = chain
    env.update(settings or {})
    # Short: the workers' unix sockets live under it, and past a path length
    # unix sockets allow the supervisor puts them in a temporary directory
    # the tests could not find (pytest-xdist's tmp_path is longer).
    data_dir = Path(tempfile.mkdtemp(prefix="pp-", dir="/tmp")) / "data"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve",
        "--data-dir", str(data_dir), "--workers", workers,
        *ALL_PORTS_ZERO, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    served = Served(proc, data_dir, {})
    served._drain = asyncio.create_task(_drain(proc, served.stderr))
    try:
        assert proc.stdout is not None
        while "http listening on" not in (line := (
                await asyncio.wait_for(proc.stdout.readline(), 90)).decode()):
            assert line, "serve exited before listening:\n" + "".join(served.stderr)
        served.ports = json.loads((data_dir / "gateway.json").read_text())
        yield served
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await served._drain
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def bson_totals(status: dict[str, Any], key: str) -> list[int]:
    return [w["listeners"]["bson"][key] for w in status["workers"]]


async def test_both_workers_serve_one_port_and_positions_stay_gapless(
    db_url: str
) -> None:
    async with serve(db_url) as gw:
        host, port = gw.port("bson")

        async def appender(i: int) -> None:
            async with await BsonClient.connect(host, port) as c:
                for n in range(10):
                    await c.emit(f"shared-{i % 3}", "Added", {"client": i, "n": n})

        await asyncio.gather(*(appender(i) for i in range(24)))
        status = await gw.status()
        per_worker = bson_totals(status, "connections_total")
        assert sum(per_worker) == 24 and all(n > 0 for n in per_worker), per_worker
        appended = bson_totals(status, "events_appended")
        assert sum(appended) == 240 and all(n > 0 for n in appended), appended
        [row] = [r for r in status["listeners"] if r["name"] == "bson"]
        assert row["connections_total"] == 24 and row["events_appended"] == 240

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch("SELECT position, event_id, stream, version FROM events "
                                "ORDER BY position")
    finally:
        await conn.close()
    assert [r["position"] for r in rows] == list(range(1, 241))
    assert len({r["event_id"] for r in rows}) == 240
    for stream in ("shared-0", "shared-1", "shared-2"):
        versions = [r["version"] for r in rows if r["stream"] == stream]
        assert versions == list(range(1, 81)), stream


async def _connect_until_both_workers(
    gw: Served, open_one: Any, kind: str, limit: int = 40
) -> list[Any]:
    """Open subscriptions (``open_one()``, one BSON connection each) until each
    worker holds at least one (the kernel chooses the worker of each
    connection).  Decided on the connection counters, which /status reports
    live; its subscription section is a snapshot up to LAG_TTL old, so a run
    that opened all 40 within that second saw one worker with none."""
    opened = []
    for _ in range(limit):
        opened.append(await open_one())
        status = await gw.status()
        if all(n > 0 for n in bson_totals(status, "connections_open")):
            break
    else:
        raise AssertionError(f"{limit} {kind} connections all went to one worker")

    async def each_holds_one() -> bool:
        return all(w["subscriptions_open"] > 0 for w in (await gw.status())["workers"])

    await until(each_holds_one, 10, f"a {kind} on each worker")
    return opened


async def test_live_subscribers_on_each_worker_see_appends_through_the_other(
    db_url: str
) -> None:
    async with serve(db_url) as gw:
        host, port = gw.port("bson")
        clients: list[BsonClient] = []

        async def subscriber() -> Any:
            c = await BsonClient.connect(host, port)
            clients.append(c)
            return await c.subscribe("live")

        try:
            subs = await _connect_until_both_workers(gw, subscriber, "subscriber")
            before = bson_totals(await gw.status(), "events_appended")
            for n in range(20):  # a new connection each: both workers append
                async with await BsonClient.connect(host, port) as c:
                    await c.emit("live", "Tick", {"n": n})
            after = bson_totals(await gw.status(), "events_appended")
            assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
            # Res01 runs in worker 0 only; its appends reach worker 1's subscribers too.
            async with await Res01Client.connect(gw.port("res01"), timeout=10) as res01:
                for n in range(20, 25):
                    await res01.commit("default", "live", -1,
                                       [new_event("Tick", json.dumps({"n": n}))])
            workers = (await gw.status())["workers"]
            assert "res01" in workers[0]["listeners"] and "res01" not in workers[1]["listeners"]
            for sub in subs:
                got = []
                while len(got) < 25:
                    ev = await sub.next(10)
                    assert ev is not None, f"subscriber got {len(got)} of 25"
                    got.append(ev.event["n"])
                assert got == list(range(25))
        finally:
            for c in clients:
                await c.close()


async def test_a_consumer_group_across_workers_delivers_each_event_once(
    db_url: str
) -> None:
    async with serve(db_url) as gw:
        host, port = gw.port("bson")
        clients: list[BsonClient] = []

        async def member() -> Any:
            c = await BsonClient.connect(host, port)
            clients.append(c)
            return await c.subscribe("jobs", durable_id="workers-group")

        try:
            members = await _connect_until_both_workers(gw, member, "group member")
            async with await BsonClient.connect(host, port) as c:
                for n in range(60):
                    await c.emit("jobs", "Job", {"n": n})
            seen: Counter[int] = Counter()

            async def consume(sub: Any) -> None:
                while (ev := await sub.next(3)) is not None:
                    seen[ev.event["n"]] += 1

            await asyncio.gather(*(consume(s) for s in members))
            assert sorted(seen) == list(range(60)), sorted(set(range(60)) - set(seen))
            assert max(seen.values()) == 1, [n for n, k in seen.items() if k > 1]
        finally:
            for c in clients:
                await c.close()


async def _worker_metrics(run_dir: Path, index: int) -> dict[str, Any]:
    connector = aiohttp.UnixConnector(path=str(socket_path(str(run_dir), index)))
    async with aiohttp.ClientSession(connector=connector) as http, http.get(
        "http://worker/metrics"
    ) as r:
        assert r.status == 200
        data: dict[str, Any] = await r.json()
        return data


def _value(families: list[dict[str, Any]], sample: str, **labels: str) -> float:
    for fam in families:
        for name, lab, value in fam["samples"]:
            if name == sample and all(lab.get(k) == v for k, v in labels.items()):
                return float(value)
    raise KeyError(sample)


def _scraped(text: str, sample: str) -> float:
    [line] = [x for x in text.splitlines() if x.startswith(sample + " ")]
    return float(line.rsplit(" ", 1)[1])


async def test_the_chain_process_commits_at_planned_positions_show_in_metrics(
    db_url: str
) -> None:
    """The chain process's totals ride on its COMMIT messages to the first
    worker: /status and /metrics count them once for the gateway."""
    async with serve(db_url, chain="process",
                     settings={"POLYPORT_PLANNED_POSITIONS": "on"}) as gw:
        host, port = gw.port("bson")

        async def appender(i: int) -> None:
            async with await BsonClient.connect(host, port) as c:
                for n in range(15):
                    await c.emit(f"planned-{i}", "Added", {"n": n})

        await asyncio.gather(*(appender(i) for i in range(16)))
        writer = (await gw.status())["writer"]
        assert writer["events"] == 240
        assert writer["planned_commits"] > 0, writer
        text = await gw.metrics()
        assert _scraped(text, "polyport_planned_commits_total") == writer["planned_commits"]
        assert _scraped(text, "polyport_planned_commit_refusals_total") == writer[
            "planned_refused"]


async def test_metrics_sum_the_workers_and_a_killed_worker_is_restarted(
    db_url: str
) -> None:
    async with serve(db_url) as gw:
        host, port = gw.port("bson")
        for n in range(16):
            async with await BsonClient.connect(host, port) as c:
                await c.emit("m", "T", {"n": n})
        run_dir = gw.data_dir / "workers" / str(gw.proc.pid)
        own = [await _worker_metrics(run_dir, i) for i in range(2)]
        appended = [_value(w["families"], "polyport_events_appended_total", protocol="bson")
                    for w in own]
        assert sum(appended) == 16 and all(a > 0 for a in appended), appended
        text = await gw.metrics()
        assert _scraped(text, 'polyport_events_appended_total{protocol="bson"}') == 16
        assert _scraped(text, 'polyport_connections_total{protocol="bson"}') == 16
        counts = [_value(w["families"], "polyport_append_batch_events_count", protocol="bson")
                  for w in own]
        assert _scraped(text, 'polyport_append_batch_events_count{protocol="bson"}') == sum(
            counts) == 16
        assert _scraped(text, "polyport_workers") == 2
        assert _scraped(text, 'polyport_worker_up{worker="1"}') == 1

        # SIGKILL worker 1: one line says so, it comes back, the port serves
        # throughout, and the summed counters do not go down.
        victim = (await gw.status())["workers"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        line = await gw.said(rf"worker 1 \(pid {victim}\) was killed by SIGKILL; restarting")
        assert "restarting it in 0.5s" in line
        for n in range(10):
            async with await BsonClient.connect(host, port) as c:
                await c.emit("m", "T", {"n": 100 + n})

        async def restarted() -> dict[str, Any] | None:
            w = (await gw.status())["workers"][1]
            return w if w["reachable"] and w["pid"] != victim else None

        back = await until(restarted, 30, "worker 1 to come back")
        assert back["restarts"] == 1 and "SIGKILL" in back["last_exit"]
        text = await gw.metrics()
        assert _scraped(text, 'polyport_events_appended_total{protocol="bson"}') == 26
        assert _scraped(text, 'polyport_worker_restarts_total{worker="1"}') == 1

        async def served_by_new_worker() -> bool:
            async with await BsonClient.connect(host, port) as c:
                await c.emit("m", "T", {"n": 200})
            return bool((await gw.status())["workers"][1]["listeners"]["bson"]
                        ["connections_total"])

        await until(served_by_new_worker, 30, "the new worker 1 to accept")
        text = await gw.metrics()  # the last values of this worker 1 are known now
        total = _scraped(text, 'polyport_events_appended_total{protocol="bson"}')
        assert total > 26

        # Dying young again: the next restart waits twice as long, and what
        # the dead worker counted up to the last scrape stays in the sum.
        victim = back["pid"]
        os.kill(victim, signal.SIGKILL)
        await gw.said(rf"worker 1 \(pid {victim}\) was killed by SIGKILL; "
                      r"restarting it in 1\.0s")
        back = await until(restarted, 30, "worker 1 to come back again")
        assert back["restarts"] == 2
        text = await gw.metrics()
        assert _scraped(text, 'polyport_events_appended_total{protocol="bson"}') == total
        assert _scraped(text, 'polyport_worker_restarts_total{worker="1"}') == 2


async def test_a_restarted_first_worker_keeps_the_res01_and_http_ports(
    db_url: str
) -> None:
    async with serve(db_url) as gw:
        first = (await gw.status())["workers"][0]["pid"]
        os.kill(first, signal.SIGKILL)
        await gw.said(rf"worker 0 \(pid {first}\) was killed by SIGKILL; restarting")

        async def back() -> dict[str, Any] | None:
            try:
                w = (await gw.status())["workers"][0]
            except (aiohttp.ClientError, OSError):
                return None  # HTTP lives in worker 0: away while it restarts
            return w if w["pid"] != first else None

        assert (await until(back, 30, "worker 0 to come back"))["restarts"] == 1
        # The ports printed at start (and in gateway.json) are still the ones.
        async with await Res01Client.connect(gw.port("res01"), timeout=10) as res01:
            await res01.commit("default", "after-restart", 1, [new_event("T", "{}")])
        assert json.loads((gw.data_dir / "gateway.json").read_text()) == gw.ports


async def test_sigterm_drains_every_worker_and_exits_zero(db_url: str) -> None:
    async with serve(db_url) as gw:
        host, port = gw.port("bson")
        status = await gw.status()
        pids = [w["pid"] for w in status["workers"]]
        # cpu_scheduling is normal unless asked: the kernel's default policy.
        assert all(_policies(pid) == {os.SCHED_OTHER} for pid in pids)
        clients = [await BsonClient.connect(host, port) for _ in range(6)]
        # Appends in flight when SIGTERM comes: every one confirmed is stored.
        futures = [c.send_emit("drain", "T", {"c": i, "n": n})
                   for i, c in enumerate(clients) for n in range(50)]
        for c in clients:
            await c.drain()
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(gw.proc.wait(), 60)
        assert gw.proc.returncode == 0, "".join(gw.stderr[-30:])
        settled, _ = await asyncio.wait(futures, timeout=10)
        confirmed = sum(1 for f in settled if f.exception() is None and f.result().ok)
        assert confirmed > 0
        for c in clients:
            await c.close()
        await gw.said(r"\[worker 0\].*stopped")
        await gw.said(r"\[worker 1\].*stopped")
        for pid in pids:
            assert _gone(pid)
        assert not (gw.data_dir / "gateway.json").exists()
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        stored = await conn.fetchval("SELECT count(*) FROM events WHERE stream = 'drain'")
    finally:
        await conn.close()
    assert stored >= confirmed


async def test_sighup_reloads_the_certificate_in_every_worker(
    db_url: str, tmp_path: Path
) -> None:
    from tests.tlspki import make_pki, write_pair

    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    pki = make_pki(pki_dir)
    async with serve(db_url, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                     "--http-tls", "off") as gw:
        host, port = gw.port("bson")

        async def served_cn() -> str:
            _reader, writer = await asyncio.open_connection(host, port, ssl=pki.client())
            cert = writer.get_extra_info("peercert")
            writer.close()
            return str(dict(x[0] for x in cert["subject"]).get("commonName", ""))

        before = {await served_cn() for _ in range(4)}
        assert "reloaded-by-sighup" not in before
        write_pair(pki_dir, "server", pki.ca.issue_cert("127.0.0.1", "localhost",
                                                        common_name="reloaded-by-sighup"))
        accepted = bson_totals(await gw.status(), "connections_total")
        gw.proc.send_signal(signal.SIGHUP)
        await gw.said(r"\[worker 0\].*reloaded TLS certificates")
        await gw.said(r"\[worker 1\].*reloaded TLS certificates")
        # SO_REUSEPORT hashes each connection to a worker: keep connecting
        # until every worker has taken one (a fixed count flaked in CI, 12
        # connections all hashed to one worker), each must show the new cert.
        names: set[str] = set()
        after = accepted
        for _ in range(64):
            names.add(await served_cn())
            after = bson_totals(await gw.status(), "connections_total")
            if all(a > b for a, b in zip(after, accepted, strict=True)):
                break
        assert names == {"reloaded-by-sighup"}
        assert all(a > b for a, b in zip(after, accepted, strict=True)), (accepted, after)
        assert gw.proc.returncode is None


@contextlib.asynccontextmanager
async def serve_embedded(*extra: str) -> AsyncIterator[Served]:
    """``serve`` with no database URL (its own embedded cluster) until the
    block ends; the cluster is stopped afterwards whatever happened."""
    # Not tmp_path: the cluster may run as another user (see tests/conftest.py).
    root = Path(tempfile.mkdtemp(prefix="polyport-embedded-", dir="/tmp"))
    root.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve", *extra,
        "--data-dir", str(root / "data"), *ALL_PORTS_ZERO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    served = Served(proc, root / "data", {})
    served._drain = asyncio.create_task(_drain(proc, served.stderr))
    try:
        assert proc.stdout is not None
        while "http listening on" not in (line := (
                await asyncio.wait_for(proc.stdout.readline(), 120)).decode()):
            assert line, "serve exited before listening:\n" + "".join(served.stderr)
        served.ports = json.loads((root / "data" / "gateway.json").read_text())
        yield served
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await served._drain
        pg = EmbeddedPostgres(root / "data")
        if pg.running_port() is not None:  # the test failed before a clean stop
            pg.owned = True
            await asyncio.to_thread(pg.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_the_embedded_database_is_started_once_and_never_in_argv() -> None:
    """No database URL: the supervisor starts and migrates the embedded
    PostgreSQL once; the workers get its URL (with its password) through the
    pipe, not their command line or environment.  SIGINT stops it all."""
    from tests.gateway.test_embedded_supervision import kill_and_see_it_back

    async with serve_embedded("--workers", "2") as served:
        host, port = served.port("bson")
        async with await BsonClient.connect(host, port) as c:
            await c.emit("embedded", "T", {"ok": True})
        password = (served.data_dir / "pg-password").read_text().strip()
        pids = [w["pid"] for w in (await served.status())["workers"]]
        for pid in pids:
            for what in ("cmdline", "environ"):
                assert password.encode() not in Path(f"/proc/{pid}/{what}").read_bytes(), what
        assert sum("using the embedded PostgreSQL" in line for line in served.stderr) == 1
        # The supervisor restarts the cluster when it dies (issue 29 item 2).
        await kill_and_see_it_back(served)
        served.proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(served.proc.wait(), 60)
        assert served.proc.returncode == 0, "".join(served.stderr[-20:])
        assert not (served.data_dir / "pgdata" / "postmaster.pid").exists()  # stopped


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody reaps counts: it runs no code)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in state


async def test_workers_stop_when_the_supervisor_dies(db_url: str) -> None:
    async with serve(db_url, chain="process") as gw:
        pids = [w["pid"] for w in (await gw.status())["workers"]]
        gw.proc.kill()  # SIGKILL: no chance to stop them itself
        await gw.proc.wait()

        async def all_gone() -> bool:
            return all(_gone(pid) for pid in pids)

        await until(all_gone, 60, "orphaned workers to exit")
    said = [line for line in gw.stderr if "the supervisor is gone: stopping" in line]
    # Both workers and the commit chain.
    assert len(said) == 3
    assert {tag for tag in ("[worker 0]", "[worker 1]", "[worker chain]")
            if any(tag in line for line in said)} == {"[worker 0]", "[worker 1]",
                                                      "[worker chain]"}


def test_a_port_taken_by_another_program_stops_the_supervisor(
    db_url: str, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = polyport("serve", "--workers", "2", "--data-dir", str(tmp_path),
                        *ALL_PORTS_ZERO, "--bson-port", str(busy),
                        env={"POLYPORT_DATABASE_URL": db_url})
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()[-1]
    assert "--bson-port" in err and "address already in use" in err, done.stderr

    # Res01's port is bound by worker 0: its failure ends the start.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = polyport("serve", "--workers", "2", "--data-dir", str(tmp_path),
                        *ALL_PORTS_ZERO, "--res01-port", str(busy),
                        env={"POLYPORT_DATABASE_URL": db_url})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [said] = [x for x in done.stderr.splitlines() if "worker 0:" in x]
    assert "--res01-port" in said and "address already in use" in said, done.stderr
    assert "while the workers were starting; stopping" in done.stderr
    assert not (tmp_path / "gateway.json").exists()


# --- without processes ------------------------------------------------------------------


def test_the_chain_socket_is_named_for_its_messages_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker started from newer code on disk looks for a chain of its
    own version: it never exchanges messages with an older one."""
    from polyport.core import chain_wire
    from polyport.gateway.process import workers

    now = workers.chain_socket_path(str(tmp_path))
    assert now.parent == tmp_path and f"v{chain_wire.WIRE_VERSION}" in now.name
    monkeypatch.setattr(workers, "WIRE_VERSION", chain_wire.WIRE_VERSION + 1)
    assert workers.chain_socket_path(str(tmp_path)) != now


def test_restart_backoff_doubles_up_to_a_bound() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(50) == 30.0


@pytest.mark.parametrize(("value", "parsed"), [
    ("auto", "auto"), ("Process", "process"), ("worker", "worker"), ("off", "off"),
    # The setting's first spelling, a boolean, still works.
    (True, "auto"), ("true", "auto"), ("on", "auto"), (False, "off"), ("no", "off"),
])
def test_commit_chain_takes_a_place_or_a_boolean(value: Any, parsed: str) -> None:
    from polyport.gateway.config import coerce

    assert coerce("commit_chain", value, "POLYPORT_COMMIT_CHAIN") == parsed


def test_a_bad_commit_chain_names_the_choices() -> None:
    from polyport.gateway.config import ConfigError, coerce

    with pytest.raises(ConfigError, match="POLYPORT_COMMIT_CHAIN: expected one of auto, "
                                          "process, worker, off, got 'chained'"):
        coerce("commit_chain", "chained", "POLYPORT_COMMIT_CHAIN")


@pytest.mark.parametrize(("value", "parsed"), [
    ("auto", "auto"), ("On", "on"), ("off", "off"), (True, "on"), ("false", "off"),
])
def test_planned_positions_takes_auto_or_a_boolean(value: Any, parsed: str) -> None:
    from polyport.gateway.config import coerce

    assert coerce("planned_positions", value, "POLYPORT_PLANNED_POSITIONS") == parsed


def test_planned_positions_auto_wants_four_cores_and_only_the_sole_writer_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from polyport.gateway import app, config
    from polyport.gateway.config import ConfigError, GatewayConfig, coerce

    with pytest.raises(ConfigError, match="expected one of auto, on, off, got 'maybe'"):
        coerce("planned_positions", "maybe", "POLYPORT_PLANNED_POSITIONS")
    for cores, planned in ((2, False), (3, False), (4, True), (16, True)):
        monkeypatch.setattr(config, "available_cores", lambda c=cores: c)
        assert config.planned_positions(GatewayConfig()) is planned
        assert app.writer_limits(GatewayConfig()).planned_positions is planned
        # A worker that takes turns with other writers never plans.
        assert app.writer_limits(GatewayConfig(planned_positions="on"),
                                 sole=False).planned_positions is False
    assert config.planned_positions(GatewayConfig(planned_positions="off")) is False


@pytest.mark.parametrize(("value", "parsed"), [
    ("auto", "auto"), ("AUTO", "auto"), (1, "1"), ("2", "2"), (" 8 ", "8"),
])
def test_pipeline_depth_takes_auto_or_a_count(value: Any, parsed: str) -> None:
    from polyport.gateway.config import coerce

    assert coerce("pipeline_depth", value, "POLYPORT_PIPELINE_DEPTH") == parsed


@pytest.mark.parametrize("value", ["0", "9", "-1", "two", True, 2.5])
def test_a_bad_pipeline_depth_says_what_it_takes(value: Any) -> None:
    from polyport.gateway.config import ConfigError, coerce

    with pytest.raises(ConfigError, match=r"POLYPORT_PIPELINE_DEPTH: expected 1\.\.8 batches "
                                          r"in flight or 'auto', got "):
        coerce("pipeline_depth", value, "POLYPORT_PIPELINE_DEPTH")


def test_pipeline_depth_auto_keeps_a_second_batch_with_planned_positions_or_a_chain_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without planned positions a second batch in flight only waits on the
    head row and halves the batches (docs/performance.md, session 26)."""
    from polyport.gateway import app, config
    from polyport.gateway.config import GatewayConfig

    for cores, depth in ((2, 1), (3, 1), (4, 2), (16, 2)):
        monkeypatch.setattr(config, "available_cores", lambda c=cores: c)
        assert config.pipeline_depth(GatewayConfig()) == depth
        assert app.writer_limits(GatewayConfig()).pipeline_depth == depth
        # Every writer of the gateway, the sole one or not, the same.
        assert app.writer_limits(GatewayConfig(), sole=False).pipeline_depth == depth
        assert config.pipeline_depth(GatewayConfig(planned_positions="on")) == 2
        assert config.pipeline_depth(GatewayConfig(planned_positions="off")) == 1
        assert app.writer_limits(GatewayConfig(pipeline_depth="3")).pipeline_depth == 3
        # A commit chain process has a core with nothing else to do.
        assert app.writer_limits(GatewayConfig(), dedicated=True).pipeline_depth == 2
        assert app.writer_limits(GatewayConfig(pipeline_depth="1"),
                                 dedicated=True).pipeline_depth == 1


def test_auto_gives_the_chain_a_process_only_with_a_core_to_spare() -> None:
    from polyport.gateway.config import GatewayConfig

    def mode(workers: int, chain: str, cpus: int) -> str:
        return chain_mode(GatewayConfig(workers=workers, commit_chain=chain), cpus)

    assert [mode(2, "auto", c) for c in (2, 3, 16)] == ["worker", "process", "process"]
    assert [mode(8, "auto", c) for c in (8, 9)] == ["worker", "process"]
    assert mode(1, "auto", 16) == mode(1, "process", 16) == "off"  # one worker: no chain
    assert mode(2, "process", 2) == "process" and mode(4, "worker", 16) == "worker"
    assert mode(4, "off", 16) == "off"


def test_a_worker_role_turns_off_what_is_not_its_own() -> None:
    from polyport.gateway.config import GatewayConfig

    role = WorkerRole(index=1, count=2, run_dir="/x", database_url="postgresql://u@h/d",
                      ports={"bson_port": 4000, "http_port": 4001, "res01_port": 4002},
                      shared=frozenset({"bson"}))
    config = GatewayConfig(bson_port=0, http_port=0, res01_port=0, segment_port=None)
    mine = role.apply(config)
    assert (mine.bson_port, mine.http_port, mine.res01_port) == (4000, None, None)
    assert mine.database_url == "postgresql://u@h/d"
    first = WorkerRole(**{**role.__dict__, "index": 0}).apply(config)
    assert (first.bson_port, first.http_port, first.res01_port) == (4000, 4001, 4002)
    # A port given explicitly stays what it is; a given database URL too.
    explicit = role.apply(GatewayConfig(bson_port=7451, database_url="postgresql://a@b/c"))
    assert explicit.bson_port == 7451 and explicit.database_url == "postgresql://a@b/c"


def test_only_the_workers_a_chain_commits_for_forward() -> None:
    def role(index: int, count: int = 2, **chain: bool) -> WorkerRole:
        return WorkerRole(index=index, count=count, run_dir="/x", database_url="", ports={},
                          shared=frozenset(), **chain)

    # Beside a chain process, every worker forwards.
    assert [role(i, chain=True).commits for i in (CHAIN_INDEX, 0, 1)] == [True, False, False]
    # The chain hosted by the last worker: that one commits, the others forward.
    hosted = {"chain": True, "chain_in_worker": True}
    assert [role(i, 3, **hosted).commits for i in (0, 1, 2)] == [False, False, True]
    # commit_chain = off: each worker commits its own.
    assert [role(i).commits for i in (0, 1)] == [True, True]


def test_merged_metrics_sum_counters_and_aggregate_gauges_by_kind() -> None:
    def fams(appended: float, head: float, open_: float) -> list[dict[str, Any]]:
        return [
            {"name": "polyport_events_appended", "type": "counter", "help": "", "unit": "",
             "samples": [["polyport_events_appended_total", {"protocol": "bson"}, appended]]},
            {"name": "polyport_log_head_position", "type": "gauge", "help": "", "unit": "",
             "samples": [["polyport_log_head_position", {}, head]]},
            {"name": "polyport_connections_open", "type": "gauge", "help": "", "unit": "",
             "samples": [["polyport_connections_open", {"protocol": "bson"}, open_]]},
        ]

    carried = {("polyport_events_appended", "polyport_events_appended_total",
                (("protocol", "bson"),)): 5.0}
    merged = {m.name: m.samples[0].value
              for m in merge_families([fams(3, 40, 2), fams(4, 42, 1)], carried)}
    assert "polyport_log_head_position" in GAUGE_MAX
    assert merged == {"polyport_events_appended": 12.0, "polyport_log_head_position": 42.0,
                      "polyport_connections_open": 3.0}


def _policies(pid: int) -> set[int]:
    """The scheduling policies of a process's threads."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def _supervisor_state(gw: Served) -> dict[str, Any]:
    [state] = (gw.data_dir / "workers").glob("*/supervisor.json")
    doc: dict[str, Any] = json.loads(state.read_text())
    return doc


async def test_killing_the_commit_chain_under_load_loses_no_acknowledged_event(
    db_url: str
) -> None:
    """SIGKILL the process that owns the commit chain while 16 publishers
    append: every acknowledged event is stored exactly once, positions stay
    gapless, no append fails (the workers commit on their own until the
    supervisor has the chain back), and the restarted chain is used again.
    With cpu_scheduling = batch, which the restarted chain keeps, and the
    chain committing at planned positions (auto leaves it off on 2 cores),
    several commits in PostgreSQL when it dies."""
    async with serve(db_url, chain="process",
                     settings={"POLYPORT_CPU_SCHEDULING": "batch",
                               "POLYPORT_PLANNED_POSITIONS": "on"}) as gw:
        await gw.said(r"\[worker 0\].*appends go through the commit chain")
        await gw.said(r"\[worker 1\].*appends go through the commit chain")
        [chain] = _supervisor_state(gw)["chain"]
        # cpu_scheduling batch: every thread of the workers and the chain
        # runs SCHED_BATCH; the supervisor, which only watches, keeps the
        # default policy.
        workers = [w["pid"] for w in _supervisor_state(gw)["workers"]]
        for pid in (*workers, chain["pid"]):
            assert _policies(pid) == {os.SCHED_BATCH}, pid
        assert _policies(gw.proc.pid) == {os.SCHED_OTHER}
        acked: Counter[int] = Counter()
        failures: dict[int, BaseException] = {}
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_append_until(stop, gw, f"kill-{i}", i, acked, failures))
                 for i in range(16)]
        await asyncio.sleep(1.0)
        before = sum(acked.values())
        os.kill(chain["pid"], signal.SIGKILL)

        async def chain_back() -> bool:
            [now] = _supervisor_state(gw)["chain"]
            return bool(now["restarts"] == 1 and now["pid"] != chain["pid"])

        await until(chain_back, 60, "the supervisor to restart the commit chain")

        async def rejoined() -> bool:  # each worker connected twice
            return sum("appends go through the commit chain" in line
                       for line in gw.stderr) >= 4

        await until(rejoined, 30, "both workers to use the restarted chain")

        async def restarted_batch() -> bool:  # from its start-up, before it serves
            [now] = _supervisor_state(gw)["chain"]
            return _policies(now["pid"]) == {os.SCHED_BATCH}

        await until(restarted_batch, 30, "the restarted chain to run SCHED_BATCH")
        mark = sum(acked.values())
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        assert not failures, list(failures.values())[:3]
        assert before > 0 and sum(acked.values()) > mark, (before, mark, acked)
        assert any("the commit chain went away" in line for line in gw.stderr)
    await _each_acknowledged_event_once(db_url, acked)


async def test_killing_the_worker_that_hosts_the_chain_loses_no_acknowledged_event(
    db_url: str
) -> None:
    """With the chain inside the last worker (commit_chain = worker, what
    auto picks on a machine with no core to spare): SIGKILL that worker
    while 16 publishers append.  Its own connections drop with it; the other
    worker's publishers never see a failure (it commits on its own until the
    supervisor has the host back, then returns to it), and every
    acknowledged event is stored exactly once, gapless.  (At planned
    positions, which auto leaves off on 2 cores.)  With cpu_scheduling =
    forwarders: worker 0, which forwards, runs SCHED_BATCH; the hosting
    worker, the one it restarts and the supervisor keep the default."""
    async with serve(db_url, chain="worker",
                     settings={"POLYPORT_PLANNED_POSITIONS": "on",
                               "POLYPORT_CPU_SCHEDULING": "forwarders"}) as gw:
        await gw.said(r"worker 1 hosting the commit chain")
        await gw.said(r"\[worker 0\].*appends go through the commit chain")
        [first, hosting] = _supervisor_state(gw)["workers"]
        assert _policies(first["pid"]) == {os.SCHED_BATCH}
        assert _policies(hosting["pid"]) == {os.SCHED_OTHER}
        assert _policies(gw.proc.pid) == {os.SCHED_OTHER}
        acked: Counter[int] = Counter()
        dropped: dict[int, BaseException] = {}
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_append_until(stop, gw, f"host-{i}", i, acked, dropped))
                 for i in range(16)]
        await asyncio.sleep(1.0)
        os.kill(hosting["pid"], signal.SIGKILL)

        async def host_back() -> bool:
            [_w0, now] = _supervisor_state(gw)["workers"]
            return bool(now["restarts"] == 1 and now["pid"] != hosting["pid"])

        await until(host_back, 60, "the supervisor to restart the hosting worker")

        async def rejoined() -> bool:  # worker 0 connected twice
            return sum(bool(re.search(r"\[worker 0\].*appends go through the commit chain",
                                      line)) for line in gw.stderr) >= 2

        await until(rejoined, 30, "worker 0 to use the restarted host's chain")
        [_w0, restarted] = _supervisor_state(gw)["workers"]
        assert _policies(restarted["pid"]) == {os.SCHED_OTHER}
        survivors = [i for i in range(16) if i not in dropped]
        mark = sum(acked[i] for i in survivors)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        # Only the killed worker's own connections failed, and as closed
        # connections; the others went on through the kill and the return.
        assert survivors and not any(i in dropped for i in survivors), dropped
        assert all(isinstance(e, ConnectionClosed) for e in dropped.values()), dropped
        assert sum(acked[i] for i in survivors) > mark, (mark, acked)
        assert any(re.search(r"\[worker 0\].*the commit chain went away", line)
                   for line in gw.stderr)
    await _each_acknowledged_event_once(db_url, acked, prefix="host")


async def _append_until(stop: asyncio.Event, gw: Served, stream: str, i: int,
                        acked: Counter[int], failed: dict[int, BaseException]) -> None:
    """One BSON publisher appending {client, n} to ``stream`` until ``stop``;
    its first failure is recorded under ``i`` and ends it."""
    async with await BsonClient.connect(*gw.port("bson")) as c:
        n = 0
        while not stop.is_set():
            try:
                await c.emit(stream, "Added", {"client": i, "n": n})
            except Exception as exc:  # noqa: BLE001 - recorded, asserted by the caller
                failed[i] = exc
                return
            acked[i] += 1
            n += 1


async def _each_acknowledged_event_once(db_url: str, acked: Counter[int],
                                        prefix: str = "kill") -> None:
    import bson

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch("SELECT position, stream, version, body FROM events "
                                "WHERE stream LIKE $1 ORDER BY position", f"{prefix}-%")
        head = await conn.fetchval("SELECT max(position) FROM events")
        count = await conn.fetchval("SELECT count(*) FROM events")
    finally:
        await conn.close()
    assert count == head  # gapless from 1
    for i in range(16):
        stored = [(r["version"], bson.decode(r["body"])["n"]) for r in rows
                  if r["stream"] == f"{prefix}-{i}"]
        # Each acknowledged event exactly once, in order (an append in flight
        # when the publisher stopped may be stored without its ack).
        assert [v for v, _n in stored] == list(range(1, len(stored) + 1))
        assert [n for _v, n in stored] == list(range(len(stored)))
        assert acked[i] <= len(stored) <= acked[i] + 1, (i, acked[i], len(stored))
