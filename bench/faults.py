"""SIGKILL of ``polyport serve`` under load, through every wire protocol.

Not part of CI (a round takes seconds; ``--rounds`` of them).  Each round:

1. ``polyport serve`` runs as a child process on an embedded data directory
   (no database URL: the embedded PostgreSQL under ``--data-dir``), every
   listener on port 0; the bound ports come from ``<data-dir>/gateway.json``.
2. Appenders on each of the six protocols' asyncio clients append one event
   at a time, each with an id the protocol carries (Res01 event guid, BSON
   ``eventID``, ReactiveSocket and RSocket event ``id``, MicroMsg2
   ``message-id``, segment's ConnectionId + offset), recording what was
   acknowledged.
3. The gateway is SIGKILLed.  Its embedded PostgreSQL is a separate daemon
   (``pg_ctl start``) and keeps running; the killed gateway's backends end
   when their sockets close.  ``polyport serve`` is started again on the same
   data directory and reuses the live cluster (``EmbeddedPostgres.start``).
4. The clients reconnect to the new ports and resend what was not
   acknowledged, with the same ids, as docs/errors.md tells clients to.
5. Audit from the database: per protocol acknowledged, stored (every event
   in the appenders' streams, acknowledged or not), stored without an
   acknowledgement (in flight at the kill and not resent: the appender
   stopped first), lost (acknowledged but not stored: must be 0),
   duplicated (must be 0: every writer is idempotent), and recovery seconds
   (the longest an appender waited for an acknowledgement from the kill on,
   which includes the new process's start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import stop_process, wait_listening
from polyport.core.migrate import asyncpg_dsn
from polyport.gateway.config import DEFAULT_PORTS
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.gateway.process.ports_file import read_ports_file
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactive.client import NewEvent
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client, new_event
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import SegmentAppender, SegmentWriter

PROTOCOLS = ("res01", "bson", "reactivesocket", "rsocket", "micromsg2", "segment")
# Segment events are fixed-size so an ack level (bytes) counts events: the
# wire frames each event with an 8-byte header.
SEGMENT_BODY_LEN = 16
SEGMENT_FRAMED = 8 + SEGMENT_BODY_LEN
# A request to a killed gateway must fail fast enough to reconnect promptly.
REQUEST_TIMEOUT = 3.0


def _ports(data_dir: Path) -> dict[str, tuple[str, int]] | None:
    data = read_ports_file(str(data_dir))
    if data is None:
        return None
    return {n: (li["host"], int(li["port"])) for n, li in data["listeners"].items()}


@dataclass
class Appender:
    """One client appending numbered events to its own stream; a failure
    drops the connection, and the same event (same id) is sent again on a
    new connection to wherever the gateway now listens."""

    protocol: str
    stream: str
    # Where the gateway listens now (None while it is down): the ports file
    # for a child process, the listeners of an in-process gateway in tests.
    where: Callable[[], dict[str, tuple[str, int]] | None]
    acked: list[uuid.UUID] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    failures: int = 0
    stopping: bool = False
    client: Any = None
    seg: SegmentAppender | None = None
    seg_sent: list[bytes] = field(default_factory=list)

    async def _connect(self) -> None:
        while True:
            ports = self.where()
            if ports is not None:
                host, port = ports[self.protocol]
                try:
                    await asyncio.wait_for(self._open(host, port), REQUEST_TIMEOUT)
                    return
                except Exception:  # noqa: BLE001 - gateway not up yet, or killed again: retry
                    self.failures += 1
            await asyncio.sleep(0.1)

    async def _open(self, host: str, port: int) -> None:
        p = self.protocol
        if p == "res01":
            self.client = await Res01Client.connect((host, port), timeout=REQUEST_TIMEOUT)
        elif p == "bson":
            self.client = await BsonClient.connect(host, port, timeout=REQUEST_TIMEOUT)
        elif p == "reactivesocket":
            self.client = await ReactiveSocketClient.connect(host, port)
        elif p == "rsocket":
            self.client = await RSocketClient.connect(host, port)
        elif p == "micromsg2":
            self.client = await MicroMsg2Client.connect(
                host, port, required=["batch-ack:max-count=1"], timeout=REQUEST_TIMEOUT)
        elif self.client is None:
            writer = await SegmentWriter.connect(host, port)
            self.client = writer
            self.seg = await writer.open_segment(f"default/{self.stream}")
        else:
            # Same ConnectionId: the appender is set up again and resends
            # every byte beyond the server's ack level.
            await self.client.reconnect(host, port)

    async def _drop(self) -> None:
        if self.protocol == "segment":
            return  # the SegmentWriter keeps its appenders for reconnect()
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):  # the connection is already gone
                await asyncio.wait_for(client.close(), 1)

    async def _send(self, seq: int, event_id: uuid.UUID) -> None:
        p, c = self.protocol, self.client
        body = f"{seq:0{SEGMENT_BODY_LEN}d}"
        if p == "res01":
            await c.commit("default", self.stream, -1,
                           [new_event("n", body, event_id=event_id)])
        elif p == "bson":
            await asyncio.wait_for(
                c.emit(self.stream, "n", {"seq": seq, "eventID": str(event_id)}),
                REQUEST_TIMEOUT)
        elif p in ("reactivesocket", "rsocket"):
            await asyncio.wait_for(
                c.append(self.stream, [NewEvent("n", body.encode(), id=event_id)]),
                REQUEST_TIMEOUT)
        elif p == "micromsg2":
            await c.publish(f"topic/{self.stream}", body, {"message-id": str(event_id)})
            await c.flush(REQUEST_TIMEOUT)
        else:
            assert self.seg is not None
            await self.seg.flush(REQUEST_TIMEOUT)

    async def _segment_append(self, body: bytes) -> None:
        """Hand ``body`` to the segment writer exactly once: once its offset
        moved the writer owns the bytes and a reconnect resends them."""
        assert self.seg is not None
        before = self.seg.offset
        while True:
            try:
                await self.seg.append([body])
                break
            except Exception:  # noqa: BLE001 - not handed over, or resent on reconnect
                self.failures += 1
                if self.seg.offset > before:
                    break
                await asyncio.sleep(0.05)
                await self._connect()
        self.seg_sent.append(body)

    async def run(self) -> None:
        await self._connect()
        seq = 0
        while not self.stopping:
            seq += 1
            event_id = uuid.uuid4()
            if self.protocol == "segment":
                await self._segment_append(f"{seq:0{SEGMENT_BODY_LEN}d}".encode())
            while True:
                try:
                    await self._send(seq, event_id)
                    break
                except Exception:  # noqa: BLE001 - outcome unknown: resend, same id
                    self.failures += 1
                    self.failed_at.append(time.monotonic())
                    await self._drop()
                    await asyncio.sleep(0.05)
                    await self._connect()
            self.acked.append(event_id)
            self.acked_at.append(time.monotonic())
            await asyncio.sleep(0.01)
        await self._drop()
        if self.protocol == "segment" and self.client is not None:
            await self.client.close()

    def segment_acked(self) -> list[bytes]:
        assert self.seg is not None
        return self.seg_sent[: self.seg.ack_level // SEGMENT_FRAMED]


@dataclass(frozen=True, slots=True)
class Result:
    protocol: str
    acknowledged: int
    # Every event in the appenders' streams, acknowledged or not.
    stored: int
    # Of those, the ones never acknowledged (in flight when the appender
    # stopped resending).
    unacknowledged: int
    lost: int
    duplicated: int
    recovery: float


class Gateway:
    """``polyport serve`` as a child process on one data directory."""

    def __init__(self, data_dir: Path, database_url: str | None = None,
                 listeners: tuple[str, ...] = tuple(DEFAULT_PORTS)) -> None:
        """No ``database_url``: the embedded PostgreSQL under ``data_dir``."""
        self.data_dir = data_dir
        self.database_url = database_url
        self.listeners = listeners
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> float:
        """Start and wait for gateway.json to name this process; seconds taken."""
        started = time.monotonic()
        ports = [a for n in DEFAULT_PORTS
                 for a in (f"--{n}-port", "0" if n in self.listeners else "off")]
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "polyport.gateway.cli.main", "serve",
            "--data-dir", str(self.data_dir), "--http-port", "off", *ports,
            stdout=asyncio.subprocess.DEVNULL,
            # The URL carries a password: environment, never argv.
            env={**os.environ, "POLYPORT_LOG_LEVEL": "warning",
                 **({"POLYPORT_DATABASE_URL": self.database_url} if self.database_url else {})},
        )
        await wait_listening(self.proc, self.data_dir)
        return time.monotonic() - started

    def ports(self) -> dict[str, tuple[str, int]] | None:
        return _ports(self.data_dir)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        await stop_process(self.proc)


async def _stored(url: str) -> dict[str, list[tuple[uuid.UUID, bytes]]]:
    """Each stream's events as (event id, body), in position order."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT event_id, stream, body FROM events ORDER BY position")
    finally:
        await conn.close()
    streams: dict[str, list[tuple[uuid.UUID, bytes]]] = {}
    for r in rows:
        streams.setdefault(r["stream"], []).append((r["event_id"], bytes(r["body"])))
    return streams


def audit(appenders: list[Appender], killed_at: float,
          streams: dict[str, list[tuple[uuid.UUID, bytes]]]) -> list[Result]:
    out = []
    for proto in PROTOCOLS:
        mine = [a for a in appenders if a.protocol == proto]
        acked = stored = unacked = lost = dup = 0
        recovery = 0.0
        for a in mine:
            rows = streams.get(a.stream, [])
            # Segment events carry derived ids; their bodies are unique per
            # stream, so count those.  The others by the ids they sent.
            got: Counter[Any] = Counter(
                body if proto == "segment" else eid for eid, body in rows)
            want: list[Any] = a.segment_acked() if proto == "segment" else a.acked
            wanted = set(want)
            acked += len(want)
            stored += len(rows)
            unacked += sum(1 for key in got if key not in wanted)
            lost += sum(1 for key in want if got[key] == 0)
            dup += sum(c - 1 for c in got.values() if c > 1)
            recovery = max(recovery, longest_wait(a.acked_at, killed_at))
        out.append(Result(proto, acked, stored, unacked, lost, dup, recovery))
    return out


def longest_wait(acked_at: list[float], fault_at: float) -> float:
    """The longest an appender waited for an acknowledgement from the fault
    on: what the fault cost it, whether it saw errors (a killed gateway) or
    only silence (a stalled database).  Acknowledgements the dead process
    had already sent may arrive just after the fault; the wait after them
    counts.  No acknowledgement after the fault: infinite."""
    after = [t for t in acked_at if t > fault_at]
    if not after:
        return float("inf")
    return max(b - a for a, b in zip([fault_at, *after], after, strict=False))


def table(title: str, rows: list[Result]) -> None:
    print(f"\n{title}")
    print(f"  {'protocol':<15} {'acked':>7} {'stored':>7} {'unacked':>7} {'lost':>5} "
          f"{'dup':>5} {'recovery s':>10}")
    for r in rows:
        print(f"  {r.protocol:<15} {r.acknowledged:>7} {r.stored:>7} {r.unacknowledged:>7} "
              f"{r.lost:>5} {r.duplicated:>5} {r.recovery:>10.2f}")
    print("  stored: every event in the appenders' streams; unacked: stored but never "
          "acknowledged (in flight when the load stopped)")


async def _until(check: Callable[[], bool], timeout: float) -> None:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no recovery within {timeout} s")
        await asyncio.sleep(0.05)


async def one_round(n: int, gw: Gateway, url: str, per_protocol: int, load: float) -> list[Result]:
    where = partial(_ports, gw.data_dir)
    appenders = [Appender(p, f"r{n}-{p}-{i}", where)
                 for p in PROTOCOLS for i in range(per_protocol)]
    tasks = [asyncio.create_task(a.run()) for a in appenders]
    try:
        await _until(lambda: all(a.acked for a in appenders), 30)
        await asyncio.sleep(load)
        killed_at = time.monotonic()
        await gw.kill()
        await gw.start()
        await _until(lambda: all(a.acked_at and a.acked_at[-1] > killed_at
                                 for a in appenders), 60)
        await asyncio.sleep(load / 2)
        for a in appenders:
            a.stopping = True
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return audit(appenders, killed_at, await _stored(url))


async def run(rounds: int, per_protocol: int, load: float, data_dir: Path | None) -> int:
    root = data_dir or Path(tempfile.mkdtemp(prefix="polyport-faults-", dir="/tmp"))
    root.chmod(0o755)  # once, before any I/O runs
    gw = Gateway(root)
    pg = EmbeddedPostgres(root)
    totals: list[list[Result]] = []
    try:
        sys.stderr.write(f"starting polyport serve on {root} (the first start initialises "
                         "its embedded PostgreSQL)...\n")
        took = await gw.start()
        sys.stderr.write(f"  listening after {took:.1f} s\n")
        port = pg.running_port()
        assert port is not None
        url = pg.url(port)
        for n in range(1, rounds + 1):
            rows = await one_round(n, gw, url, per_protocol, load)
            table(f"round {n}: SIGKILL of polyport serve under load", rows)
            totals.append(rows)
    finally:
        await gw.stop()
        # The gateways never owned the cluster after the first was killed:
        # stop it here, as whoever runs the data directory would.
        pg.owned = True
        await asyncio.get_running_loop().run_in_executor(None, pg.stop)
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    total = [
        Result(p, sum(r[i].acknowledged for r in totals), sum(r[i].stored for r in totals),
               sum(r[i].unacknowledged for r in totals), sum(r[i].lost for r in totals),
               sum(r[i].duplicated for r in totals), max(r[i].recovery for r in totals))
        for i, p in enumerate(PROTOCOLS)
    ]
    table(f"total over {len(totals)} round(s) (recovery: the worst round)", total)
    bad = sum(r.lost + r.duplicated for r in total)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench faults")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--appenders", type=int, default=2, help="appenders per protocol")
    p.add_argument("--load-seconds", type=float, default=1.5,
                   help="load before each kill (half as much after recovery)")
    p.add_argument("--data-dir", type=Path, help="keep the data directory here")
    args = p.parse_args(argv)
    return asyncio.run(run(args.rounds, args.appenders, args.load_seconds, args.data_dir))

