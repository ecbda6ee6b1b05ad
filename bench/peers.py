"""polyport against its peers, in one run: raw PostgreSQL, NATS JetStream, and
polyport through each wire protocol with that protocol's own asyncio client.

Every event body is 200 bytes; PostgreSQL runs with fsync on (a throwaway
cluster, ``bench.common.bench_cluster``).  ``polyport serve`` runs as its own
process against a fresh database of that cluster; ``nats-server -js`` runs on
a free port with file storage in a temporary directory.  The clients run here,
on one event loop (uvloop when it is importable).

- W1, closed loop: N publishers, each on its own connection, each awaiting
  its acknowledgement before its next publish.  Raw PostgreSQL: single-row
  INSERTs (autocommit) into a plain append table, one asyncpg connection per
  publisher up to RAW_POOL_MAX; beyond that the N publishers share a pool of
  RAW_POOL_MAX connections (a thousand backends on a two-core machine measure
  the machine, not PostgreSQL, and the cluster allows 200).  NATS: ``js.publish``
  (waits for the PubAck) to a file-storage stream.
- W2, pipelined: one publisher, at most 1,000 events unacknowledged.  Raw
  PostgreSQL: 100-row transactions on one connection, and binary COPY of
  1,000-row batches.  NATS: ``js.publish_async`` with 1,000 pending at most.
  polyport: one connection with 1,000 requests in flight (Res01 ACs,
  BSON EMITs, ReactiveSocket / RSocket appends), a MicroMsg2 ``batch-ack``
  window of 1,000, a segment writer window of 1,000 events.
- W3, live delivery: one publisher at 1,000 events/s (not waiting for acks)
  into one stream while one live subscriber receives; p50 / p99 from the
  publish call to receipt.  Raw PostgreSQL: INSERT, then NOTIFY after the
  commit, on a pool of 32 connections; a LISTENing connection fetches the
  notified rows.  NATS: an ordered push consumer.  polyport: BSON SUBSCRIBE,
  ReactiveSocket REQUEST_SUB, RSocket events.subscribe, MicroMsg2 topic
  subscription, a Res01 FE/PS loop (FE answers at once; an empty batch is
  polled again after 1 ms) and segment reads that follow the tail.
- RSS per idle connection: a fresh ``polyport serve`` per protocol, 2,000
  connections opened (handshake done) and left idle; (RSS after − RSS before)
  / 2,000 over the serve process tree.

Each figure comes with the CPU cores the server processes (PostgreSQL
cluster, ``polyport serve``, ``nats-server``) and this client process used
during the measurement (utime + stime from /proc over wall time), and each
polyport figure as a ratio to raw PostgreSQL and to NATS measured in the same
run.  ``--repeat`` alternates the systems (rotating their order) and reports
medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import asyncpg
import zmq
import zmq.asyncio

from bench.common import (
    BASELINE_HELP,
    BenchError,
    ServeFailed,
    baseline_command,
    baseline_database,
    bench_cluster,
    fresh_database,
    percentile,
    say,
    stop_process,
    wait_listening,
)
from polyport.core import migrate
from polyport.gateway.config import DEFAULT_PORTS
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactive.client import NewEvent
from polyport.protocols.reactivesocket.client import ReactiveSocketClient
from polyport.protocols.res01.client import Res01Client, new_event
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment.client import (
    NoSuchSegmentError,
    SegmentAppender,
    SegmentReader,
    SegmentWriter,
)

PROTOCOLS = ("res01", "bson", "reactivesocket", "rsocket", "micromsg2", "segment")
WORKLOADS = ("w1", "w2", "w3", "rss")
BODY_SIZE = 200
SEGMENT_FRAMED = 8 + BODY_SIZE
WINDOW = 1000  # W2: events unacknowledged at most
# Where a protocol's server allows fewer requests in flight on one connection:
# ReactiveSocket and RSocket answer "busy" past 256 open streams per
# connection (the adapters' max_streams, not a setting).
WINDOW_CAP = {"reactivesocket": 256, "rsocket": 256}
RATE = 1000  # W3: events/s
RAW_POOL_MAX = 100
RAW_W3_POOL = 32
IDLE_CONNECTIONS = 2000
RSS_TARGET_KIB = 64
RES01_POLL = 0.001
CONTEXT = "default"  # anonymous connections' context
NATS_STREAM = "BENCH"
NATS_BIN = "/usr/sbin/nats-server"  # Debian's package; else the first on PATH
NATS_MISSING = "nats-server not found: apt-get install nats-server"
REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS bench_append (
    id bigserial PRIMARY KEY,
    stream text NOT NULL,
    body bytea NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
)"""
RAW_INSERT = "INSERT INTO bench_append (stream, body) VALUES ($1, $2)"
RAW_INSERT_ID = "INSERT INTO bench_append (stream, body) VALUES ($1, $2) RETURNING id"

# A system served by the --baseline install: this prefix and the protocol.
BASE = "base:"

SYSTEM_NAMES = {
    "raw": "raw PostgreSQL",
    "raw-tx": "raw PG, 100-row tx",
    "raw-copy": "raw PG, COPY",
    "nats": "NATS JetStream",
    **{p: f"polyport {p}" for p in PROTOCOLS},
    # Served by the --baseline install.
    **{f"{BASE}{p}": f"base {p}" for p in PROTOCOLS},
}


def positive_counts(text: str, option: str) -> list[int]:
    """``--option 1,2,4``: positive integers, comma-separated, else BenchError."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise BenchError(f"{option}: positive integers, comma-separated")
    return counts


# --- event bodies -----------------------------------------------------------------------


def body(seq: int) -> bytes:
    """A 200-byte JSON object carrying ``seq`` (W3 finds the send time by it)."""
    head = b'{"seq": %d, "pad": "' % seq
    return head + b"x" * (BODY_SIZE - len(head) - 2) + b'"}'


def seq_of(data: bytes | str) -> int:
    return int(json.loads(data)["seq"])


# --- CPU and memory from /proc ------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and its reaped children)."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone meanwhile
        out[int(name)] = parse_stat(raw)
    return out


def stat_fields(raw: bytes) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name, which may
    hold spaces and parentheses (the state first, as field 3 of proc(5))."""
    return raw[raw.rindex(b")") + 2:].split()


def parse_stat(raw: bytes) -> tuple[int, float]:
    """(parent pid, CPU seconds of the process and its reaped children) from
    the text of ``/proc/PID/stat``."""
    rest = stat_fields(raw)
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    # A child's time moves into its parent's cutime/cstime when it is
    # reaped: counting both keeps a tree's total steady across exits.
    return int(rest[1]), (utime + stime + cutime + cstime) / TICK


def _tree(root: int, table: dict[int, tuple[int, float]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(children.get(pid, ()))
    return found


def _self_cpu() -> float:
    """This process alone (all its threads), not the servers it started."""
    t = os.times()
    return t.user + t.system


def tree_rss_kib(root: int) -> int:
    total = 0
    for pid in _tree(root, _proc_table()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


@dataclass
class Roots:
    """Root pids of the server process groups whose CPU is measured."""

    pg: int | None = None
    gateway: int | None = None
    nats: int | None = None

    def cpu(self) -> dict[str, float]:
        table = _proc_table()
        out = {"client": _self_cpu()}
        for group in ("pg", "gateway", "nats"):
            root = getattr(self, group)
            out[group] = (
                sum(table[p][1] for p in _tree(root, table)) if root is not None else 0.0
            )
        # The commit chain's share of the gateway's (serve --workers N).
        out["chain"] = sum(table[p][1] for p in (
            _tree(self.gateway, table) if self.gateway is not None else ())
            if _is_chain(p))
        return out


# The commit chain process's module, as its command line names it.
CHAIN_MODULE = b"polyport.gateway.process.chain"


def _is_chain(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return CHAIN_MODULE in f.read()
    except OSError:
        return False


class Meter:
    """CPU cores each group used between :meth:`start` and :meth:`stop`."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots
        self._t0 = 0.0
        self._c0: dict[str, float] = {}
        self.cores: dict[str, float] = {}
        self.wall = 0.0

    def start(self) -> None:
        self._c0 = self.roots.cpu()
        self._t0 = time.monotonic()

    def stop(self) -> None:
        self.wall = time.monotonic() - self._t0
        c1 = self.roots.cpu()
        self.cores = {k: (c1[k] - self._c0[k]) / max(self.wall, 1e-9) for k in c1}


# --- server processes ------------------------------------------------------------------------


# This tree's ``polyport`` command.
SERVE_COMMAND = (sys.executable, "-m", "polyport.gateway.cli.main")


class ServeProcess:
    """``polyport serve`` as a child process; the bound ports come from the
    gateway.json it writes into its data directory."""

    def __init__(self, root: Path, database_url: str, listeners: Sequence[str],
                 workers: int | None, chain: str = "auto",
                 cpu_scheduling: str = "normal", command: Sequence[str] = ()) -> None:
        self.data_dir = root
        # The polyport command to run: this tree's by default, or another
        # install's (``bench workers --baseline``).
        self.command = tuple(command) or SERVE_COMMAND
        self.database_url = database_url
        self.listeners = tuple(listeners)
        self.workers = workers
        # With workers > 1: the commit_chain setting (auto, process, worker, off).
        self.chain = chain
        # The cpu_scheduling setting (normal, batch).
        self.cpu_scheduling = cpu_scheduling
        self.proc: asyncio.subprocess.Process | None = None
        self.ports: dict[str, tuple[str, int]] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def run_dir(self) -> Path:
        """The supervisor's run directory (``--workers`` above one): the
        workers' and the commit chain's unix sockets."""
        return self.data_dir / "workers" / str(self.pid)

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = [a for n in DEFAULT_PORTS
                 for a in (f"--{n}-port", "0" if n in self.listeners else "off")]
        workers = ["--workers", str(self.workers)] if self.workers is not None else []
        env = {
            **os.environ,
            "POLYPORT_LOG_LEVEL": "warning",
            # The URL carries a password: environment, never argv.
            "POLYPORT_DATABASE_URL": self.database_url,
            # Every bench connection comes from 127.0.0.1: the per-address
            # limit (256 by default) would refuse W1's 1,000 publishers and
            # the 2,000 idle connections.
            "POLYPORT_MAX_CONNECTIONS_PER_ADDRESS": "0",
            "POLYPORT_MAX_CONNECTIONS": "0",
            "POLYPORT_COMMIT_CHAIN": self.chain,
            "POLYPORT_CPU_SCHEDULING": self.cpu_scheduling,
        }
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, "serve",
            "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1", "--http-port", "off", *ports, *workers,
            stdout=asyncio.subprocess.DEVNULL, env=env, cwd=REPO,
        )
        self.ports = await wait_listening(self.proc, self.data_dir)

    async def stop(self) -> None:
        await stop_process(self.proc)


class NatsServer:
    """``nats-server -js`` on a free port, file storage under ``root``."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        # True when every write is fsynced before the PubAck (sync_interval:
        # always, nats-server 2.10 and later); older servers sync every 2 min.
        self.fsync = False
        self.version = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        out = await asyncio.create_subprocess_exec(
            self.binary, "--version", stdout=asyncio.subprocess.PIPE)
        self.version = (await out.communicate())[0].decode().strip()
        conf = self.root / "fsync.conf"
        conf.write_text("jetstream { sync_interval: always }\n")
        for fsync in (True, False):
            if await self._try(["-c", str(conf)] if fsync else []):
                self.fsync = fsync
                return
        raise BenchError(f"nats-server did not start (see {self.root / 'nats.log'})")

    async def _try(self, extra: list[str]) -> bool:
        ports_dir = self.root / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir(parents=True)
        log = open(self.root / "nats.log", "wb")  # noqa: SIM115 - the child writes it
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.binary, *extra, "-js", "-sd", str(self.root / "store"),
                "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(ports_dir),
                stdout=log, stderr=log,
            )
        finally:
            log.close()
        started = time.monotonic()
        while time.monotonic() - started < 30:
            for path in ports_dir.glob("*.ports"):
                with contextlib.suppress(ValueError, OSError, KeyError, IndexError):
                    self.url = json.loads(path.read_text())["nats"][0]
                    return True
            if self.proc.returncode is not None:
                return False  # e.g. "unknown field sync_interval" on 2.9
            await asyncio.sleep(0.05)
        await self.stop()
        return False

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


# --- clients ------------------------------------------------------------------------------


class Publisher(Protocol):
    async def publish(self, seq: int) -> None:
        """Append one event and wait for its acknowledgement."""

    async def close(self) -> None: ...


@dataclass
class Env:
    """Everything one run talks to."""

    raw_dsn: str
    gateway: ServeProcess | None
    nats: NatsServer | None
    zmq_ctx: zmq.asyncio.Context
    roots: Roots
    # W1's publishers over this many client processes (bench/spread.py).
    client_processes: int = 1
    # The same, with the --baseline install's gateway (its systems: BASE + protocol).
    baseline: Env | None = None

    def addr(self, protocol: str) -> tuple[str, int]:
        assert self.gateway is not None
        return self.gateway.ports[protocol]

    def serving(self, system: str) -> tuple[Env, str]:
        """The Env and system name that measure ``system``: a baseline
        system is its protocol, through the baseline's gateway (whose
        process tree the meter reads as the gateway's)."""
        if system.startswith(BASE):
            assert self.baseline is not None
            return self.baseline, system[len(BASE):]
        return self, system


class _Closable(Protocol):
    async def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closable)


class _ClientPub(Generic[_C]):
    """A publisher over one protocol client: closing it closes the client."""

    client: _C

    async def close(self) -> None:
        await self.client.close()


class Res01Pub(_ClientPub[Res01Client]):
    def __init__(self, client: Res01Client, stream: str) -> None:
        self.client, self.stream = client, stream

    async def publish(self, seq: int) -> None:
        await self.client.commit(CONTEXT, self.stream, -1,
                                 [new_event("bench", body(seq).decode())])


class BsonPub(_ClientPub[BsonClient]):
    def __init__(self, client: BsonClient, stream: str) -> None:
        self.client, self.stream = client, stream

    async def publish(self, seq: int) -> None:
        await self.client.emit(self.stream, "bench", json.loads(body(seq)))


class StreamPub(_ClientPub[ReactiveSocketClient | RSocketClient]):
    """ReactiveSocket and RSocket: a REQUEST_RESPONSE append each."""

    def __init__(self, client: ReactiveSocketClient | RSocketClient, stream: str) -> None:
        self.client, self.stream = client, stream

    async def publish(self, seq: int) -> None:
        await self.client.append(
            self.stream, [NewEvent("bench", body(seq), content_type="application/json")])


class MicroMsg2Pub(_ClientPub[MicroMsg2Client]):
    """With ``ack`` (a window of one) publish + flush is one acknowledged MESSAGE."""

    def __init__(self, client: MicroMsg2Client, stream: str) -> None:
        self.client, self.destination = client, f"topic/{stream}"

    async def publish(self, seq: int) -> None:
        await self.client.publish(self.destination, body(seq))
        await self.client.flush(60)


class SegmentPub:
    def __init__(self, writer: SegmentWriter, appender: SegmentAppender) -> None:
        self.writer, self.appender = writer, appender

    async def publish(self, seq: int) -> None:
        await self.appender.append([body(seq)])
        await self.appender.flush(60)

    async def close(self) -> None:
        await self.writer.close()


async def open_publisher(env: Env, protocol: str, stream: str, *, window: int = 1) -> Publisher:
    """A connection of ``protocol`` appending to ``stream``; ``window`` is
    what MicroMsg2 and segment may leave unacknowledged (the others pipeline
    by concurrent calls on one connection)."""
    host, port = env.addr(protocol)
    if protocol == "res01":
        return Res01Pub(await Res01Client.connect(
            (host, port), timeout=60, max_in_flight=max(window, 1000), context=env.zmq_ctx),
            stream)
    if protocol == "bson":
        return BsonPub(await BsonClient.connect(host, port, timeout=60), stream)
    if protocol == "reactivesocket":
        return StreamPub(await ReactiveSocketClient.connect(host, port), stream)
    if protocol == "rsocket":
        return StreamPub(await RSocketClient.connect(host, port), stream)
    if protocol == "micromsg2":
        ack = "ack" if window == 1 else f"batch-ack:max-count={window}"
        return MicroMsg2Pub(
            await MicroMsg2Client.connect(host, port, required=[ack], timeout=60), stream)
    if protocol == "segment":
        writer = await SegmentWriter.connect(host, port, window_bytes=window * SEGMENT_FRAMED,
                                             timeout=60.0)
        return SegmentPub(writer, await writer.open_segment(f"{CONTEXT}/{stream}"))
    raise BenchError(f"unknown protocol {protocol!r}")


async def open_many(n: int, opener: Callable[[int], Awaitable[Any]], batch: int = 50) -> list[Any]:
    """``n`` connections, ``batch`` handshakes at a time; all closed on failure."""
    opened: list[Any] = []
    try:
        for start in range(0, n, batch):
            chunk = range(start, min(n, start + batch))
            got = await asyncio.gather(*(opener(i) for i in chunk), return_exceptions=True)
            opened += [c for c in got if not isinstance(c, BaseException)]
            for c in got:
                if isinstance(c, BaseException):
                    raise c
    except BaseException:
        await close_all(opened)
        raise
    return opened


async def close_all(clients: Iterable[Any]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- W1: N closed-loop publishers ----------------------------------------------------------


async def closed_loop(meter: Meter, ops: Sequence[Callable[[int], Awaitable[None]]],
                      seconds: float) -> float:
    """Each op in its own loop for ``seconds``, the next call after the last
    returned; acknowledged events/s."""
    counts = [0] * len(ops)
    deadline = time.monotonic() + seconds

    async def loop(i: int) -> None:
        op = ops[i]
        n = 0
        while time.monotonic() < deadline:
            await op(n)
            n += 1
        counts[i] = n

    meter.start()
    await asyncio.gather(*(loop(i) for i in range(len(ops))))
    meter.stop()
    return sum(counts) / meter.wall


async def w1_raw(env: Env, meter: Meter, n: int, seconds: float) -> float:
    stream = _unique("w1-raw")
    if n <= RAW_POOL_MAX:
        conns = await open_many(n, lambda _i: asyncpg.connect(env.raw_dsn))
        try:
            return await closed_loop(meter, [_raw_op(c, stream) for c in conns], seconds)
        finally:
            await close_all(conns)
    pool = await asyncpg.create_pool(env.raw_dsn, min_size=RAW_POOL_MAX, max_size=RAW_POOL_MAX)
    try:
        async def op(seq: int) -> None:
            async with pool.acquire() as c:
                await c.execute(RAW_INSERT, stream, body(seq))

        return await closed_loop(meter, [op] * n, seconds)
    finally:
        await pool.close()


def _raw_op(conn: asyncpg.Connection, stream: str) -> Callable[[int], Awaitable[None]]:
    async def op(seq: int) -> None:
        await conn.execute(RAW_INSERT, stream, body(seq))

    return op


def _nats_op(js: Any, subject: str) -> Callable[[int], Awaitable[None]]:
    async def op(seq: int) -> None:
        await js.publish(subject, body(seq))

    return op


async def _nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(url, allow_reconnect=False, connect_timeout=30)


async def w1_nats(env: Env, meter: Meter, n: int, seconds: float) -> float:
    assert env.nats is not None
    conns = await open_many(n, lambda _i: _nats_connect(env.nats.url))  # type: ignore[union-attr]
    try:
        subject = f"bench.{_unique('w1')}"
        ops = [_nats_op(nc.jetstream(), f"{subject}.{i}") for i, nc in enumerate(conns)]
        return await closed_loop(meter, ops, seconds)
    finally:
        await close_all(conns)


async def w1_polyport(env: Env, meter: Meter, protocol: str, n: int, seconds: float) -> float:
    prefix = _unique(f"w1-{protocol}")
    pubs = await open_many(n, lambda i: open_publisher(env, protocol, f"{prefix}-{i}"))
    try:
        return await closed_loop(meter, [p.publish for p in pubs], seconds)
    finally:
        await close_all(pubs)


# --- W2: one publisher, 1,000 unacknowledged -------------------------------------------------


async def w2_raw_tx(env: Env, meter: Meter, seconds: float) -> float:
    conn = await asyncpg.connect(env.raw_dsn)
    try:
        stream = _unique("w2-raw")

        async def op(seq: int) -> None:
            async with conn.transaction():
                await conn.executemany(
                    RAW_INSERT, [(stream, body(seq * 100 + k)) for k in range(100)])

        return 100 * await closed_loop(meter, [op], seconds)
    finally:
        await conn.close()


async def w2_raw_copy(env: Env, meter: Meter, seconds: float) -> float:
    conn = await asyncpg.connect(env.raw_dsn)
    try:
        stream = _unique("w2-copy")

        async def op(seq: int) -> None:
            await conn.copy_records_to_table(
                "bench_append", columns=("stream", "body"),
                records=[(stream, body(seq * WINDOW + k)) for k in range(WINDOW)])

        return WINDOW * await closed_loop(meter, [op], seconds)
    finally:
        await conn.close()


async def w2_nats(env: Env, meter: Meter, seconds: float) -> float:
    assert env.nats is not None
    nc = await _nats_connect(env.nats.url)
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW)
        subject = f"bench.{_unique('w2')}"
        futures: list[asyncio.Future[Any]] = []
        deadline = time.monotonic() + seconds
        meter.start()
        while time.monotonic() < deadline:
            futures.append(await js.publish_async(subject, body(len(futures))))
        await asyncio.wait_for(js.publish_async_completed(), 60)
        meter.stop()
        failed = sum(1 for f in futures if f.cancelled() or f.exception() is not None)
        if failed:
            raise BenchError(f"{failed} NATS publishes failed")
        return len(futures) / meter.wall
    finally:
        await nc.close()


async def w2_polyport(env: Env, meter: Meter, protocol: str, seconds: float) -> float:
    stream = _unique(f"w2-{protocol}")
    pub = await open_publisher(env, protocol, stream, window=WINDOW)
    try:
        if isinstance(pub, MicroMsg2Pub | SegmentPub):
            # publish() waits only while the window is full: one loop fills it.
            sent = 0
            deadline = time.monotonic() + seconds
            meter.start()
            while time.monotonic() < deadline:
                if isinstance(pub, MicroMsg2Pub):
                    await pub.client.publish(pub.destination, body(sent))
                else:
                    await pub.appender.append([body(sent)])
                sent += 1
            if isinstance(pub, MicroMsg2Pub):
                await pub.client.flush(60)
            else:
                await pub.appender.flush(60)
            meter.stop()
            return sent / meter.wall
        # One connection, WINDOW calls in flight: each loop awaits its own ack.
        return await closed_loop(meter, [pub.publish] * WINDOW_CAP.get(protocol, WINDOW),
                                 seconds)
    finally:
        await pub.close()


# --- W3: delivery latency at 1,000 events/s ------------------------------------------------------


OnAck = Callable[[int], None]


class Feeder(Protocol):
    async def send(self, seq: int) -> None:
        """Hand one event over without waiting for its acknowledgement."""

    async def finish(self) -> None:
        """Wait for every acknowledgement."""

    async def close(self) -> None: ...


class TaskFeeder:
    """Each publish as its own task: requests pipeline on one connection,
    at most ``window`` unacknowledged (send waits for room)."""

    def __init__(self, pub: Publisher, window: int, on_ack: OnAck | None = None) -> None:
        self.pub = pub
        self.room = asyncio.Semaphore(window)
        self.tasks: set[asyncio.Task[None]] = set()
        self.failed = 0
        self.first_error: BaseException | None = None
        self.on_ack = on_ack

    async def send(self, seq: int) -> None:
        await self.room.acquire()
        task = asyncio.create_task(self._publish(seq))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    async def _publish(self, seq: int) -> None:
        await self.pub.publish(seq)
        if self.on_ack is not None:
            self.on_ack(seq)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.room.release()
        if task.cancelled() or task.exception() is not None:
            self.failed += 1
            self.first_error = self.first_error or (
                asyncio.CancelledError() if task.cancelled() else task.exception())

    async def finish(self) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=60)
        if self.first_error is not None:
            raise BenchError(f"{self.failed} publishes failed, the first with "
                             f"{one_line(self.first_error)}")

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await self.pub.close()


class WindowFeeder:
    """MicroMsg2 (batch-ack) and segment: writing is sending; the window
    bounds what is unacknowledged.  Their clients acknowledge ranges, not
    one publish: no per-event ack time is taken."""

    def __init__(self, pub: MicroMsg2Pub | SegmentPub) -> None:
        self.pub = pub

    async def send(self, seq: int) -> None:
        if isinstance(self.pub, MicroMsg2Pub):
            await self.pub.client.publish(self.pub.destination, body(seq))
        else:
            await self.pub.appender.append([body(seq)])

    async def finish(self) -> None:
        if isinstance(self.pub, MicroMsg2Pub):
            await self.pub.client.flush(60)
        else:
            await self.pub.appender.flush(60)

    async def close(self) -> None:
        await self.pub.close()


class NatsFeeder:
    def __init__(self, nc: Any, subject: str, on_ack: OnAck | None = None) -> None:
        self.nc, self.subject = nc, subject
        self.js = nc.jetstream(publish_async_max_pending=WINDOW)
        self.on_ack = on_ack

    async def send(self, seq: int) -> None:
        acked = await self.js.publish_async(self.subject, body(seq))
        if self.on_ack is not None:
            on_ack = self.on_ack
            acked.add_done_callback(
                lambda f: None if f.cancelled() or f.exception() else on_ack(seq))

    async def finish(self) -> None:
        await asyncio.wait_for(self.js.publish_async_completed(), 60)

    async def close(self) -> None:
        await self.nc.close()


class RawFeeder:
    """INSERT, then NOTIFY with the row id after the commit: inside the
    transaction NOTIFY would take its global lock across the commit's
    fsync and serialise every writer (the reason polyport's core notifies
    after commit too)."""

    def __init__(self, pool: asyncpg.Pool, stream: str, on_ack: OnAck | None = None) -> None:
        self.pool, self.stream = pool, stream
        # Acknowledged once the NOTIFY after the commit is done too.
        self.inner = TaskFeeder(self, WINDOW, on_ack)  # type: ignore[arg-type]

    async def publish(self, seq: int) -> None:
        async with self.pool.acquire() as c:
            row_id = await c.fetchval(RAW_INSERT_ID, self.stream, body(seq))
            await c.execute(f"NOTIFY bench_w3, '{row_id}'")

    async def send(self, seq: int) -> None:
        await self.inner.send(seq)

    async def finish(self) -> None:
        await self.inner.finish()

    async def close(self) -> None:
        await self.pool.close()


OnSeq = Callable[[int], None]
# A subscriber's receiving loop, and what closes what it opened.
Reader = Callable[[], Coroutine[Any, Any, None]]
Closers = list[Callable[[], Awaitable[Any]]]


async def _close_all(closers: list[Callable[[], Awaitable[Any]]]) -> None:
    for close in reversed(closers):
        with contextlib.suppress(Exception):
            await close()


@contextlib.asynccontextmanager
async def subscriber(env: Env, system: str, stream: str, on_seq: OnSeq) -> AsyncIterator[None]:
    """A live subscriber of ``stream`` calling ``on_seq`` per event received,
    for as long as the block runs."""
    closers: list[Callable[[], Awaitable[Any]]] = []
    stopping = asyncio.Event()
    try:
        reader = await _open_reader(env, system, stream, on_seq, stopping, closers)
    except BaseException:
        await _close_all(closers)
        raise
    task = asyncio.create_task(reader())
    try:
        yield
    finally:
        stopping.set()
        if system == "segment":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await _close_all(closers)
        failure = task.exception() if task.done() and not task.cancelled() else None
        if failure is not None:
            raise BenchError(f"subscriber failed: {one_line(failure)}")


async def _open_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    """Subscribe; the coroutine function that receives.  What it opened is
    in ``closers`` (also when it fails half-way)."""
    opener = _READER_OPENERS.get(system)
    if opener is None:
        raise BenchError(f"unknown system {system!r}")
    return await opener(env, system, stream, on_seq, stopping, closers)


async def _raw_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    conn = await asyncpg.connect(env.raw_dsn)
    closers.append(conn.close)
    ids: asyncio.Queue[int] = asyncio.Queue()
    await conn.add_listener("bench_w3", lambda *a: ids.put_nowait(int(a[3])))

    async def reader() -> None:
        while True:
            batch = [await ids.get()]
            while not ids.empty():
                batch.append(ids.get_nowait())
            rows = await conn.fetch(
                "SELECT body FROM bench_append WHERE id = ANY($1::bigint[])", batch)
            for r in rows:
                on_seq(seq_of(r["body"]))

    return reader


async def _nats_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    assert env.nats is not None
    nc = await _nats_connect(env.nats.url)
    closers.append(nc.close)

    async def cb(msg: Any) -> None:
        on_seq(seq_of(msg.data))

    from nats.js.api import DeliverPolicy

    await nc.jetstream().subscribe(stream, cb=cb, ordered_consumer=True,
                                   deliver_policy=DeliverPolicy.NEW)

    async def reader() -> None:
        await asyncio.Event().wait()

    return reader


async def _bson_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    bson = await BsonClient.connect(*env.addr("bson"), timeout=60)
    closers.append(bson.close)
    sub = await bson.subscribe(stream)

    async def reader() -> None:
        while (recev := await sub.next()) is not None:
            on_seq(int(recev.event["seq"]))

    return reader


async def _reactive_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    """ReactiveSocket's or RSocket's subscription (``system``)."""
    host, port = env.addr(system)
    client: ReactiveSocketClient | RSocketClient = (
        await ReactiveSocketClient.connect(host, port) if system == "reactivesocket"
        else await RSocketClient.connect(host, port))
    closers.append(client.close)
    events = await client.subscribe(stream=stream, start="beginning")

    async def reader() -> None:
        while (ev := await events.next()) is not None:
            on_seq(seq_of(ev.body))

    return reader


async def _micromsg2_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    mm = await MicroMsg2Client.connect(*env.addr("micromsg2"), required=["pubsub"])
    closers.append(mm.close)
    await mm.subscribe(f"topic/{stream}")

    async def reader() -> None:
        while True:
            on_seq(seq_of((await mm.receive()).payload))

    return reader


async def _res01_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    res01 = await Res01Client.connect(env.addr("res01"), timeout=60, context=env.zmq_ctx)
    closers.append(res01.close)
    [sub_id] = await res01.subscribe(
        _unique("bench"), [(CONTEXT, stream, datetime.now(UTC) - timedelta(seconds=5))])

    async def reader() -> None:
        while True:
            [batch] = await res01.fetch([(sub_id, WINDOW)])
            if not batch.events:
                await asyncio.sleep(RES01_POLL)
                continue
            for ev in batch.events:
                on_seq(seq_of(ev.body))
            await res01.progress([(sub_id, batch.events[-1].timestamp)])

    return reader


async def _segment_reader(
    env: Env, system: str, stream: str, on_seq: OnSeq, stopping: asyncio.Event,
    closers: Closers,
) -> Reader:
    seg = await SegmentReader.connect(*env.addr("segment"), seconds=60.0)
    closers.append(seg.close)
    segment = f"{CONTEXT}/{stream}"

    async def reader() -> None:
        buf = bytearray()
        offset = 0
        # Stops between reads: a read cancelled in flight would leave its
        # reply future to fail unobserved when the connection closes.
        while not stopping.is_set():
            try:
                reply = await seg.read(segment, offset)
            except NoSuchSegmentError:  # nothing appended yet
                await asyncio.sleep(0.005)
                continue
            offset += len(reply.data)
            buf += reply.data
            # A reply may end inside an event: parse whole events only.
            pos = 0
            while len(buf) - pos >= 8:
                _type, length = struct.unpack_from(">iI", buf, pos)
                if len(buf) - pos - 8 < length:
                    break
                on_seq(seq_of(bytes(buf[pos + 8:pos + 8 + length])))
                pos += 8 + length
            del buf[:pos]

    return reader


# W3's subscriber, by system: (env, system, stream, on_seq, stopping, closers)
# -> the coroutine function that receives.
_READER_OPENERS: dict[
    str, Callable[[Env, str, str, OnSeq, asyncio.Event, Closers], Awaitable[Reader]]
] = {
    "raw": _raw_reader,
    "nats": _nats_reader,
    "bson": _bson_reader,
    "reactivesocket": _reactive_reader,
    "rsocket": _reactive_reader,
    "micromsg2": _micromsg2_reader,
    "res01": _res01_reader,
    "segment": _segment_reader,
}


async def open_feeder(env: Env, system: str, stream: str,
                      on_ack: OnAck | None = None) -> Feeder:
    """``on_ack(seq)``: called as each publish is acknowledged, where the
    client tells it of one publish (not MicroMsg2's or segment's)."""
    if system == "raw":
        pool = await asyncpg.create_pool(env.raw_dsn, min_size=RAW_W3_POOL,
                                         max_size=RAW_W3_POOL)
        return RawFeeder(pool, stream, on_ack)
    if system == "nats":
        assert env.nats is not None
        return NatsFeeder(await _nats_connect(env.nats.url), stream, on_ack)
    pub = await open_publisher(env, system, stream, window=WINDOW)
    if isinstance(pub, MicroMsg2Pub | SegmentPub):
        return WindowFeeder(pub)
    return TaskFeeder(pub, WINDOW_CAP.get(system, WINDOW), on_ack)


@dataclass
class Latency:
    p50: float
    p99: float
    lost: int
    # Publish call -> its acknowledgement (None where not taken: WindowFeeder).
    ack_p50: float | None = None
    ack_p99: float | None = None


class _W3Times:
    """What W3 measures: publish call -> delivery for every event, and
    publish call -> acknowledgement where the feeder tells of each (which
    may come before or after the delivery: each side has its own entry)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent: dict[int, float] = {}
        self.unacked: dict[int, float] = {}
        self.latencies: list[float] = []
        self.acks: list[float] = []
        self.probe = asyncio.Event()  # a probe (seq < 0) was delivered
        self.all_in = asyncio.Event()

    def sending(self, seq: int) -> None:
        self.sent[seq] = self.unacked[seq] = time.perf_counter()

    def on_seq(self, seq: int) -> None:
        now = time.perf_counter()
        if seq < 0:
            self.probe.set()
            return
        started = self.sent.pop(seq, None)
        if started is not None:
            self.latencies.append((now - started) * 1000)
            if len(self.latencies) == self.total:
                self.all_in.set()

    def on_ack(self, seq: int) -> None:
        started = self.unacked.pop(seq, None)
        if started is not None:
            self.acks.append((time.perf_counter() - started) * 1000)

    def latency(self) -> Latency:
        if not self.latencies:
            raise BenchError("no event was received")
        acks = self.acks
        return Latency(percentile(self.latencies, 0.5), percentile(self.latencies, 0.99),
                       self.total - len(self.latencies),
                       percentile(acks, 0.5) if acks else None,
                       percentile(acks, 0.99) if acks else None)


async def w3(env: Env, meter: Meter, system: str, seconds: float, rate: int = RATE) -> Latency:
    stream = _unique(f"w3-{system}")
    if system == "nats":
        stream = f"bench.{stream}"
    total = max(1, int(seconds * rate))
    times = _W3Times(total)
    feeder = await open_feeder(env, system, stream, times.on_ack)
    try:
        async with subscriber(env, system, stream, times.on_seq):
            # Probes until the subscription is live (some protocols do not
            # answer a subscribe, and a segment does not exist before its
            # first event).
            deadline = time.monotonic() + 30
            while not times.probe.is_set():
                if time.monotonic() > deadline:
                    raise BenchError("the subscriber received nothing within 30 s")
                await feeder.send(-1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(times.probe.wait(), 0.2)
            await feeder.finish()
            meter.start()
            t0 = time.perf_counter()
            seq = 0
            while seq < total:
                due = min(total, int((time.perf_counter() - t0) * rate) + 1)
                while seq < due:
                    times.sending(seq)
                    await feeder.send(seq)
                    seq += 1
                await asyncio.sleep(max(0.0, t0 + seq / rate - time.perf_counter()))
            await feeder.finish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(times.all_in.wait(), 10)
            meter.stop()
    finally:
        await feeder.close()
    return times.latency()


# --- RSS per idle connection ---------------------------------------------------------------


async def _idle_client(protocol: str, host: str, port: int, ctx: zmq.asyncio.Context) -> Any:
    if protocol == "bson":
        return await BsonClient.connect(host, port, timeout=60)
    if protocol == "reactivesocket":
        return await ReactiveSocketClient.connect(host, port)
    if protocol == "rsocket":
        return await RSocketClient.connect(host, port)
    if protocol == "micromsg2":
        return await MicroMsg2Client.connect(host, port, timeout=60)
    if protocol == "segment":
        writer = await SegmentWriter.connect(host, port, timeout=60.0)
        # Segment has no login: its first request ends the handshake (an
        # idle connection that never sends one is closed after 10 s).
        await writer.keep_alive()
        return writer
    if protocol == "res01":
        client = await Res01Client.connect((host, port), timeout=60, context=ctx)
        # One request, so the gateway knows the peer (its state is made on
        # the first message, not on the ZeroMQ connect).
        await client.progress([])
        return client
    raise BenchError(f"unknown protocol {protocol!r}")


async def _settled_rss(pid: int) -> int:
    """RSS once it stopped moving (handshakes still being served, SETUPs
    without replies)."""
    last = tree_rss_kib(pid)
    for _ in range(20):
        await asyncio.sleep(0.5)
        now = tree_rss_kib(pid)
        if abs(now - last) <= max(64, last // 500):
            return now
        last = now
    return last


@dataclass
class RssResult:
    protocol: str
    before_kib: int
    after_kib: int
    connections: int

    @property
    def per_connection(self) -> float:
        return (self.after_kib - self.before_kib) / self.connections


async def rss_per_connection(env: Env, root: Path, db_url: str, protocol: str,
                             connections: int, workers: int | None) -> RssResult:
    gw = ServeProcess(root / _unique(f"rss-{protocol}"), db_url, [protocol], workers)
    await gw.start()
    try:
        host, port = gw.ports[protocol]
        # Warm up first, so code paths run once, buffers and caches made on
        # the first connections are not counted per connection.
        await close_all(await open_many(20, lambda _i: _idle_client(
            protocol, host, port, env.zmq_ctx)))
        before = await _settled_rss(gw.pid)
        # Res01's one request each is a reader request: at most 64 at once.
        clients = await open_many(connections, lambda _i: _idle_client(
            protocol, host, port, env.zmq_ctx), batch=32 if protocol == "res01" else 100)
        try:
            after = await _settled_rss(gw.pid)
        finally:
            await close_all(clients)
        return RssResult(protocol, before, after, connections)
    finally:
        await gw.stop()


# --- results and tables ---------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    n: int | None
    system: str
    value: float | None = None  # events/s, or p50 ms
    p99: float | None = None
    lost: int = 0
    ack_p50: float | None = None  # W3: publish call -> acknowledgement, ms
    ack_p99: float | None = None
    cores: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def server_cores(system: str, cores: dict[str, float]) -> float:
    if system == "nats":
        return cores.get("nats", 0.0)
    if system.startswith("raw"):
        return cores.get("pg", 0.0)
    return cores.get("gateway", 0.0) + cores.get("pg", 0.0)


def median_result(results: list[Result]) -> Result:
    ok = [r for r in results if r.error is None and r.value is not None]
    first = results[0]
    if not ok:
        return first
    keys = ok[0].cores.keys()
    def median_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return Result(
        first.workload, first.n, first.system,
        statistics.median(r.value for r in ok if r.value is not None),
        median_of([r.p99 for r in ok]),
        max(r.lost for r in ok),
        median_of([r.ack_p50 for r in ok]),
        median_of([r.ack_p99 for r in ok]),
        {k: statistics.median(r.cores[k] for r in ok) for k in keys},
    )


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def _cell(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def _row(line: str) -> None:
    print(line.rstrip())  # empty ratio cells of the baselines leave no trailing blanks


def throughput_table(title: str, rows: list[Result], refs: list[tuple[str, str]]) -> None:
    """``refs``: (column heading, system) whose value each ratio divides by."""
    print(f"\n{title}")
    by = {(r.n, r.system): r for r in rows}
    _row(f"  {'N':>5}  {'system':<22} {'events/s':>10} {'server':>7} {'of PG':>6} "
         f"{'client':>7}" + "".join(f" {h:>8}" for h, _ in refs))
    _row(f"  {'':>5}  {'':<22} {'':>10} {'cores':>7} {'cores':>6} {'cores':>7}")
    for r in rows:
        n = "" if r.n is None else str(r.n)
        if r.error is not None:
            _row(f"  {n:>5}  {SYSTEM_NAMES[r.system]:<22} failed: {r.error}")
            continue
        pg = r.cores.get("pg") if r.system != "nats" else None
        peer = r.system.startswith("raw") or r.system == "nats"
        cols = ["" if peer else _ratio(r.value, by[(r.n, ref)].value if (r.n, ref) in by
                                       else None) for _h, ref in refs]
        _row(f"  {n:>5}  {SYSTEM_NAMES[r.system]:<22} {_cell(r.value):>10} "
             f"{server_cores(r.system, r.cores):>7.2f} {_cell(pg, '.2f'):>6} "
             f"{r.cores.get('client', 0.0):>7.2f}" + "".join(f" {c:>8}" for c in cols))


def latency_table(title: str, rows: list[Result], refs: list[str]) -> None:
    """``refs``: the systems (raw, nats) each polyport p50 and p99 is divided by."""
    print(f"\n{title}")
    _row(f"  {'system':<22} {'p50 ms':>8} {'p99 ms':>8} {'lost':>5} {'ack p50':>8} "
         f"{'ack p99':>8} {'server':>7} {'of PG':>6} {'client':>7}"
         + "".join(f" {f'p50/{ref}':>8} {f'p99/{ref}':>8}" for ref in refs))
    by = {r.system: r for r in rows if r.error is None}
    for r in rows:
        name = SYSTEM_NAMES[r.system]
        if r.error is not None:
            _row(f"  {name:<22} failed: {r.error}")
            continue
        pg = r.cores.get("pg") if r.system != "nats" else None
        mine = r.system not in ("raw", "nats")
        cols = []
        for ref in refs:
            base = by.get(ref)
            cols += ([_ratio(r.value, base.value), _ratio(r.p99, base.p99)]
                     if mine and base is not None else ["", ""])
        _row(f"  {name:<22} {_cell(r.value, '.2f'):>8} {_cell(r.p99, '.2f'):>8} {r.lost:>5} "
             f"{_cell(r.ack_p50, '.2f'):>8} {_cell(r.ack_p99, '.2f'):>8} "
             f"{server_cores(r.system, r.cores):>7.2f} {_cell(pg, '.2f'):>6} "
             f"{r.cores.get('client', 0.0):>7.2f}" + "".join(f" {c:>8}" for c in cols))


def rss_table(rows: list[RssResult], errors: dict[str, str]) -> None:
    print(f"\nRSS per idle connection (polyport serve process tree; target <= "
          f"{RSS_TARGET_KIB} KiB)")
    print(f"  {'protocol':<16} {'conns':>6} {'before MiB':>10} {'after MiB':>10} "
          f"{'KiB/conn':>9}  verdict")
    for r in rows:
        verdict = "ok" if r.per_connection <= RSS_TARGET_KIB else "over target"
        print(f"  {r.protocol:<16} {r.connections:>6} {r.before_kib / 1024:>10.1f} "
              f"{r.after_kib / 1024:>10.1f} {r.per_connection:>9.1f}  {verdict}")
    for protocol, error in errors.items():
        print(f"  {protocol:<16} failed: {error}")


# --- the run ---------------------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, BenchError | ServeFailed):  # messages written for the reader
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def measure(label: str, env: Env, r: Result,
                  fn: Callable[[Meter], Awaitable[float | Latency]], timeout: float) -> Result:
    meter = Meter(env.roots)
    try:
        async with asyncio.timeout(timeout):
            got = await fn(meter)
    except Exception as exc:  # noqa: BLE001 - one line per failed measurement, the run goes on
        r.error = one_line(exc)
        say(f"  {label} {SYSTEM_NAMES[r.system]}: failed: {r.error}")
        return r
    if isinstance(got, Latency):
        r.value, r.p99, r.lost = got.p50, got.p99, got.lost
        r.ack_p50, r.ack_p99 = got.ack_p50, got.ack_p99
        shown = f"p50 {got.p50:.2f} ms, p99 {got.p99:.2f} ms" + (
            f", {got.lost} not received" if got.lost else "") + (
            f"; acked p50 {got.ack_p50:.2f}, p99 {got.ack_p99:.2f} ms"
            if got.ack_p50 is not None and got.ack_p99 is not None else "")
    else:
        r.value = got
        shown = f"{got:,.0f} events/s"
    r.cores = meter.cores
    say(f"  {label} {SYSTEM_NAMES[r.system]}: {shown} (cores: server "
        f"{server_cores(r.system, r.cores):.2f}, client {r.cores.get('client', 0.0):.2f})")
    return r


def _rotated(items: list[str], by: int) -> list[str]:
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def _find_nats() -> str | None:
    """The nats-server binary, when it and nats-py are both there; else one
    line saying what to install."""
    binary = NATS_BIN if Path(NATS_BIN).exists() else shutil.which("nats-server")
    if binary is None:
        say(NATS_MISSING)
        return None
    try:
        import nats  # noqa: F401
    except ImportError:
        say("nats-py is not installed: pip install -e '.[bench]' (NATS columns skipped)")
        return None
    return binary


async def _start_nats(binary: str, root: Path) -> NatsServer:
    server = NatsServer(binary, root)
    root.mkdir()
    await server.start()
    nc = await _nats_connect(server.url)
    try:
        from nats.js.api import StorageType

        await nc.jetstream().add_stream(
            name=NATS_STREAM, subjects=["bench.>"], storage=StorageType.FILE)
    finally:
        await nc.close()
    fsync = ("fsync per write (sync_interval: always)" if server.fsync else
             "NO fsync per write: this nats-server has no sync_interval: always "
             "(2.10+); it syncs every 2 min")
    say(f"{server.version} on {server.url}, file storage, {fsync}")
    return server


async def _workload(env: Env, args: argparse.Namespace, w: str,
                    systems: list[str]) -> list[Result]:
    """Every system, alternating, ``--repeat`` times per publisher count;
    the medians."""
    rows: list[Result] = []
    if w == "w2":
        systems = ["raw-tx", "raw-copy", *systems[1:]]
    timeout = 2 * args.seconds + 300
    for n in (args.publishers if w == "w1" else [None]):
        runs: dict[str, list[Result]] = {s: [] for s in systems}
        for rep in range(args.repeat):
            for s in _rotated(systems, rep):
                label = f"[{w}{'' if n is None else f' N={n}'} {rep + 1}/{args.repeat}]"
                fn: Callable[[Meter], Awaitable[float | Latency]]
                e, name = env.serving(s)
                if w == "w1":
                    fn = _w1_fn(e, name, n or 1, args.seconds)
                elif w == "w2":
                    fn = _w2_fn(e, name, args.seconds)
                else:
                    fn = _w3_fn(e, name, args.seconds, args.rate)
                runs[s].append(await measure(label, e, Result(w, n, s), fn, timeout))
        rows += [median_result(runs[s]) for s in systems]
    return rows


async def _rss(env: Env, args: argparse.Namespace, root: Path,
               db_url: str) -> tuple[list[RssResult], dict[str, str]]:
    rows: list[RssResult] = []
    errors: dict[str, str] = {}
    for p in args.protocols:
        say(f"[rss] {p}: {args.connections} idle connections...")
        try:
            async with asyncio.timeout(600):
                got = await rss_per_connection(env, root, db_url, p, args.connections,
                                               args.workers)
        except Exception as exc:  # noqa: BLE001 - one line, go on with the next
            errors[p] = one_line(exc)
            say(f"  [rss] {p}: failed: {errors[p]}")
            continue
        rows.append(got)
        say(f"  [rss] {p}: {got.per_connection:.1f} KiB per connection")
    return rows, errors


async def _raw_table(raw_url: str) -> tuple[str, str]:
    """The raw baseline's table made in its database: the database's asyncpg
    DSN and the server's version."""
    raw_dsn = migrate.asyncpg_dsn(raw_url)
    conn = await asyncpg.connect(raw_dsn)
    try:
        await conn.execute(RAW_TABLE)
        pg_version = str(await conn.fetchval("SHOW server_version")).split()[0]
    finally:
        await conn.close()
    return raw_dsn, pg_version


async def _measure(
    env: Env, args: argparse.Namespace, measured: list[str], systems: list[str]
) -> dict[str, list[Result]]:
    """Every measured workload on every system, each printed when done."""
    results: dict[str, list[Result]] = {}
    if "w1" in measured:
        warm = min(1.0, args.seconds)
        say(f"warming up every system ({warm:g} s each)...")
        for s in systems:
            e, name = env.serving(s)
            await measure("warm-up", e, Result("warm", 8, s),
                          _w1_fn(e, name, 8, warm), 2 * warm + 300)
    for w in measured:
        results[w] = await _workload(env, args, w, systems)
        _print_workload(w, results[w], args, env.nats)
    return results


async def _start_baseline(env: Env, gateway: ServeProcess, protocols: list[str]) -> list[str]:
    """Start the --baseline install's gateway and give ``env`` its Env;
    the systems it serves."""
    say("starting the baseline's polyport serve...")
    await gateway.start()
    # Its own meter root: its process tree is "the gateway" of its rows.
    env.baseline = Env(env.raw_dsn, gateway, env.nats, env.zmq_ctx,
                       replace(env.roots, gateway=gateway.pid), env.client_processes)
    return [f"{BASE}{p}" for p in protocols]


async def _stop_gateways(roots: Roots | None, *gateways: ServeProcess | None) -> None:
    for gateway in gateways:
        if gateway is not None:
            await gateway.stop()
    if roots is not None:
        roots.gateway = None


async def run(args: argparse.Namespace) -> int:
    nats_bin = _find_nats()
    root = Path(tempfile.mkdtemp(prefix="polyport-peers-", dir="/tmp"))
    root.chmod(0o755)
    zmq_ctx = zmq.asyncio.Context()
    # W1's 1,000 Res01 publishers and 2,000 idle peers: past ZeroMQ's default.
    zmq_ctx.set(zmq.MAX_SOCKETS, 8192)
    gateway: ServeProcess | None = None
    base_gateway: ServeProcess | None = None
    nats_server: NatsServer | None = None
    results: dict[str, list[Result]] = {}
    rss: list[RssResult] = []
    rss_errors: dict[str, str] = {}
    try:
        async with bench_cluster() as pg:
            raw_url = await fresh_database(pg)
            pp_url = await fresh_database(pg)
            raw_dsn, pg_version = await _raw_table(raw_url)
            roots = Roots(pg=int((pg.pgdata / "postmaster.pid").read_text().split()[0]))
            load = os.getloadavg()[0]
            if nats_bin is not None:
                nats_server = await _start_nats(nats_bin, root / "nats")
                roots.nats = nats_server.pid
            measured = [w for w in args.workloads if w != "rss"]
            if measured and args.protocols:
                gateway = ServeProcess(root / "gateway", pp_url, args.protocols, args.workers)
                say("starting polyport serve...")
                await gateway.start()
                roots.gateway = gateway.pid
            env = Env(raw_dsn, gateway, nats_server, zmq_ctx, roots, args.client_processes)
            systems = ["raw", *(["nats"] if nats_server else []), *args.protocols]
            if measured and args.protocols and args.baseline:
                base_gateway = ServeProcess(
                    root / "baseline", await baseline_database(pg, args.baseline),
                    args.protocols, args.workers, command=args.baseline)
                systems += await _start_baseline(env, base_gateway, args.protocols)
            _print_header(args, pg_version, load, nats_server, args.loop)
            results = await _measure(env, args, measured, systems)
            # The RSS phase starts a gateway per protocol; these would only
            # take memory and CPU.
            await _stop_gateways(roots, gateway, base_gateway)
            if "rss" in args.workloads and args.protocols:
                rss, rss_errors = await _rss(env, args, root, pp_url)
                rss_table(rss, rss_errors)
    finally:
        await _stop_gateways(None, gateway, base_gateway)
        if nats_server is not None:
            await nats_server.stop()
        zmq_ctx.destroy(linger=0)
        shutil.rmtree(root, ignore_errors=True)
    if os.environ.get("POLYPORT_BENCH_JSON"):
        print(json.dumps({
            "workloads": {w: [r.__dict__ for r in rows] for w, rows in results.items()},
            "rss": [{**r.__dict__, "kib_per_connection": r.per_connection} for r in rss],
            "rss_errors": rss_errors,
        }))
    failed = any(r.error for rows in results.values() for r in rows) or bool(rss_errors)
    return 1 if failed else 0


async def w1(env: Env, meter: Meter, system: str, n: int, seconds: float) -> float:
    """W1 through ``system`` (raw, nats or a protocol), in this process or
    spread over ``env.client_processes``."""
    if env.client_processes > 1:
        from bench.spread import w1_spread

        return await w1_spread(env, meter, system, n, seconds)
    if system == "raw":
        return await w1_raw(env, meter, n, seconds)
    if system == "nats":
        return await w1_nats(env, meter, n, seconds)
    return await w1_polyport(env, meter, system, n, seconds)


def _w1_fn(env: Env, system: str, n: int, seconds: float) -> Callable[[Meter], Awaitable[float]]:
    return lambda m: w1(env, m, system, n, seconds)


def _w3_fn(env: Env, system: str, seconds: float,
           rate: int) -> Callable[[Meter], Awaitable[Latency]]:
    return lambda m: w3(env, m, system, seconds, rate)


def _w2_fn(env: Env, system: str, seconds: float) -> Callable[[Meter], Awaitable[float]]:
    if system == "raw-tx":
        return lambda m: w2_raw_tx(env, m, seconds)
    if system == "raw-copy":
        return lambda m: w2_raw_copy(env, m, seconds)
    if system == "nats":
        return lambda m: w2_nats(env, m, seconds)
    return lambda m: w2_polyport(env, m, system, seconds)


def _print_header(args: argparse.Namespace, pg_version: str, load: float,
                  nats_server: NatsServer | None, loop: str) -> None:
    nats = "NATS: not measured"
    if nats_server is not None:
        nats = f"{nats_server.version} (" + (
            "fsync per write, sync_interval: always)" if nats_server.fsync else
            "acks before fsync: this version has no sync_interval: always)")
    workers = f"--workers {args.workers}" if args.workers is not None else "default workers"
    print(f"bench peers: {os.cpu_count()} CPUs, load average {load:.2f} at start; "
          f"PostgreSQL {pg_version} (fsync on); {nats}; polyport serve ({workers}); "
          f"client event loop: {loop}; W1 clients in {args.client_processes} process(es)")
    print(f"200-byte events; each figure the median of {args.repeat} run(s) of "
          f"{args.seconds:g} s, the systems alternating; cores = CPU time / wall time of "
          "the server processes (PostgreSQL, plus polyport serve for polyport rows) and of "
          "the client processes")


def _print_workload(w: str, rows: list[Result], args: argparse.Namespace,
                    nats_server: NatsServer | None) -> None:
    nats_ref = [("x nats", "nats")] if nats_server is not None else []
    if w == "w1":
        throughput_table(
            "W1 closed loop: N publishers, each on its own connection, each awaits its ack",
            rows, [("x raw", "raw"), *nats_ref])
        print(f"  raw: single-row INSERTs, one connection per publisher up to {RAW_POOL_MAX}, "
              f"beyond that the publishers share a pool of {RAW_POOL_MAX}")
    elif w == "w2":
        throughput_table(f"W2 pipelined: one publisher, <= {WINDOW:,} unacknowledged", rows,
                         [("x raw-tx", "raw-tx"), ("x copy", "raw-copy"), *nats_ref])
        capped = [p for p in args.protocols if p in WINDOW_CAP]
        print("  raw: 100-row transactions on one connection; COPY of 1,000-row batches")
        if capped:
            print(f"  {', '.join(capped)}: {WINDOW_CAP[capped[0]]} in flight, the server's "
                  "limit of open streams per connection")
    else:
        latency_table(f"W3 delivery at {args.rate:,} events/s: publish call -> live subscriber",
                      rows, ["raw", *(["nats"] if nats_server is not None else [])])
        print("  raw: INSERT, NOTIFY after the commit, a LISTENing connection fetches the rows")
        print("  ack p50/p99: publish call -> its acknowledgement (raw: the NOTIFY after the "
              "commit done too; - where the client acknowledges ranges: micromsg2, segment)")
        if "res01" in args.protocols:
            print(f"  res01: FE/PS loop, {RES01_POLL * 1000:g} ms pause after an empty batch")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench peers",
        description="raw PostgreSQL, NATS JetStream and polyport's protocols in one run")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--repeat", type=int, help="alternating runs per system; the median "
                                              "is reported (default 1, 3 with --full)")
    p.add_argument("--publishers", help="W1 publisher counts, comma-separated "
                                        "(default 32; 32,256,1000 with --full)")
    p.add_argument("--protocols", default=",".join(PROTOCOLS),
                   help=f"polyport protocols, comma-separated (default all: "
                        f"{','.join(PROTOCOLS)}; 'none' for the peers alone)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)} (default all)")
    p.add_argument("--rate", type=int, default=RATE,
                   help=f"W3 publish rate, events/s (default {RATE})")
    p.add_argument("--connections", type=int, default=IDLE_CONNECTIONS,
                   help="idle connections per protocol for the RSS measurement")
    p.add_argument("--workers", type=int, help="passed to polyport serve as --workers N")
    p.add_argument("--full", action="store_true",
                   help="W1 with 32, 256 and 1,000 publishers, 3 runs each")
    p.add_argument("--baseline", metavar="COMMAND", default="",
                   help=BASELINE_HELP + "; its rows read 'base PROTOCOL' (not in the RSS "
                        "measurement)")
    add_client_processes(p)
    args = p.parse_args(argv)
    try:
        args.baseline = baseline_command(args.baseline)
        args.protocols = _choices(args.protocols, PROTOCOLS, "--protocols")
        args.workloads = _choices(args.workloads, WORKLOADS, "--workloads")
        pubs = args.publishers or ("32,256,1000" if args.full else "32")
        args.publishers = positive_counts(pubs, "--publishers")
    except (BenchError, ValueError) as exc:
        print(f"python -m bench peers: {one_line(exc)}", file=sys.stderr)
        return 2
    if args.repeat is None:
        args.repeat = 3 if args.full else 1
    if args.seconds <= 0 or min(args.repeat, args.connections, args.rate,
                                args.client_processes) < 1:
        print("python -m bench peers: --seconds, --repeat, --rate, --connections and "
              "--client-processes must be positive",
              file=sys.stderr)
        return 2
    # Thousands of sockets here and in the children (which inherit the limit).
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    factory, args.loop = client_loop()
    return run_command("python -m bench peers", factory, lambda: run(args))


def add_client_processes(p: argparse.ArgumentParser) -> None:
    from bench.spread import default_client_processes

    default = default_client_processes()
    p.add_argument("--client-processes", type=int, default=default, metavar="N",
                   help="spread W1's publishers over N client processes, so that the load "
                        f"generator is not what is measured (default {default}: one per 4 "
                        "cores)")


def client_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The clients' event loop: uvloop when it is importable (its factory
    and name)."""
    try:
        import uvloop
    except ImportError:
        return None, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def run_command(prog: str, factory: Callable[[], asyncio.AbstractEventLoop] | None,
                main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run a bench's main coroutine; a failure is one line naming the
    command, never a traceback (an interruption: bench/__main__.py)."""
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main())
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"{prog}: {one_line(exc)}", file=sys.stderr)
        return 1


def _choices(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if items == ["none"]:
        return []
    bad = [x for x in items if x not in allowed]
    if bad:
        raise BenchError(f"{flag}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
    return [x for x in allowed if x in items]
