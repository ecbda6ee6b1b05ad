"""Load, live readers and the audit shared by the fault-injection tests.

The audit's rules: every acknowledged event is stored exactly once (the
appenders resend a failed append with the same event ids until it is
acknowledged, as docs/errors.md tells clients to); every live subscriber
receives every stored event of its selection in position order with no gap
and no repeat."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from polyport.core.commands import Append, FromBeginning, Selector, Subscribe
from polyport.core.errors import PolyportError, Timeout
from polyport.core.events import EventData
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore


@dataclass(frozen=True, slots=True)
class Row:
    fault: str
    protocol: str
    acknowledged: int
    stored: int
    lost: int
    duplicated: int
    gaps: int
    # Seconds; None where the test does not measure it (printed as "-").
    recovery: float | None


SUMMARY: list[Row] = []
# The key under which a test's rows travel in its report's user_properties.
SUMMARY_PROPERTY = "fault summary"


def summary_lines(rows: Iterable[Row]) -> list[str]:
    head = (f"{'fault':<28} {'protocol':<14} {'acked':>7} {'stored':>7} {'lost':>5} "
            f"{'dup':>5} {'gaps':>5} {'recovery s':>10}")
    return [head, *(
        f"{r.fault:<28} {r.protocol:<14} {r.acknowledged:>7} {r.stored:>7} {r.lost:>5} "
        f"{r.duplicated:>5} {r.gaps:>5} "
        f"{'-' if r.recovery is None else f'{r.recovery:.2f}':>10}" for r in rows
    )]


@dataclass
class Appender:
    """Appends numbered events to its own stream, one at a time; a failed
    append is resent with the same event id until acknowledged.

    With ``trust_failures`` it behaves like a client without event ids of
    its own: a definite failure ("nothing was stored") is resent as a new
    event, so a failure that was in fact stored shows up as a duplicate;
    only ``timeout`` (outcome unknown) is resent with the same id."""

    store: EventStore
    stream: str
    trust_failures: bool = False
    acked: list[int] = field(default_factory=list)
    failures: int = 0
    # Monotonic time of the last failure and of the first success after it.
    last_failure: float = 0.0
    recovered_at: float = 0.0
    _stop: bool = False

    async def run(self) -> None:
        seq = 0
        while not self._stop:
            seq += 1
            event = EventData("n", str(seq).encode(), event_id=uuid.uuid4())
            while True:
                try:
                    await self.store.append(Append("default", self.stream, (event,)))
                    break
                except PolyportError as exc:
                    if self.trust_failures and not isinstance(exc, Timeout):
                        event = EventData("n", event.body, event_id=uuid.uuid4())
                    self.failures += 1
                    self.last_failure = time.monotonic()
                    await asyncio.sleep(0.02)
            if self.last_failure and self.recovered_at < self.last_failure:
                self.recovered_at = time.monotonic()
            self.acked.append(seq)
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self._stop = True


async def stop_appenders(appenders: list[Appender], tasks: list[asyncio.Task[None]],
                         timeout: float = 45.0) -> None:
    """Stop the appenders and wait for their runs to end: each ends once its
    append in flight has an outcome.  An audit taken before that misses an
    append acknowledged after it (one held up by the writer's reconnection,
    6 s once in CI) and counts it lost."""
    for a in appenders:
        a.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout)


@dataclass
class LiveReader:
    """A live subscriber over every stream, recording positions it gets."""

    store: EventStore
    positions: list[int] = field(default_factory=list)

    async def run(self) -> None:
        sub = await self.store.subscribe(Subscribe(Selector(None), FromBeginning()))
        try:
            while True:
                ev = await sub.next()
                if ev is None:
                    return
                self.positions.append(ev.position)
        finally:
            sub.close()


async def stored_sequences(db_url: str) -> dict[str, list[int]]:
    """Each stream's event bodies (the appenders' sequence numbers) in order."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch("SELECT stream, body FROM events ORDER BY position")
    finally:
        await conn.close()
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r["stream"], []).append(int(bytes(r["body"])))
    return out


async def all_positions(db_url: str) -> list[int]:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        return [r[0] for r in await conn.fetch("SELECT position FROM events ORDER BY position")]
    finally:
        await conn.close()


def audit_appends(
    appenders: list[Appender], stored: dict[str, list[int]]
) -> tuple[int, int, int, int]:
    """(acknowledged, stored, lost, duplicated) over the appenders' streams."""
    acked = stored_n = lost = dup = 0
    for a in appenders:
        got = stored.get(a.stream, [])
        counts = Counter(got)
        acked += len(a.acked)
        stored_n += len(got)
        lost += sum(1 for s in a.acked if counts[s] == 0)
        dup += sum(c - 1 for c in counts.values() if c > 1)
    return acked, stored_n, lost, dup


def _gaps(
    received: list[int], expected: list[int]
) -> tuple[list[int], Counter[int], list[tuple[int, int]]]:
    """(positions missing, how often each was received, pairs out of order)."""
    missing = sorted(set(expected) - set(received))
    disorder = [(a, b) for a, b in itertools.pairwise(received) if b <= a]
    return missing, Counter(received), disorder


def describe_gaps(received: list[int], expected: list[int]) -> str:
    """What :func:`delivery_gaps` counted, for an assertion message: a
    one-off failure under load must say whether a reader skipped, repeated,
    reordered or merely lagged."""
    missing, counts, disorder = _gaps(received, expected)
    repeats = sorted(p for p, n in counts.items() if n > 1)
    return (f"received {len(received)} (last {received[-1:]}) of {len(expected)} "
            f"(last {expected[-1:]}); missing {missing[:10]}{'...' if len(missing) > 10 else ''}; "
            f"repeated {repeats[:10]}; out of order {disorder[:5]}")


def delivery_gaps(received: list[int], expected: list[int]) -> int:
    """Events of ``expected`` missing from, or out of order or repeated in,
    ``received`` (a reader that got exactly ``expected`` scores 0)."""
    if received == expected:
        return 0
    missing, counts, disorder = _gaps(received, expected)
    repeats = len(received) - len(counts)
    return max(1, len(missing) + repeats + len(disorder))


class PgProxy:
    """A TCP proxy between the gateway and PostgreSQL that can fail like a
    network: :meth:`stall` stops every byte both ways (connections stay
    open, statements hang, nothing errors), :meth:`drop` cuts every
    connection (both sides see a reset) and lets bytes flow again."""

    def __init__(self, db_url: str) -> None:
        parts = urlsplit(db_url)
        assert parts.hostname is not None and parts.port is not None
        self._target = (parts.hostname, parts.port)
        self._parts = parts
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._transports: set[asyncio.WriteTransport] = set()
        self._server: asyncio.Server | None = None
        self.url = ""
        self.dropped = 0

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._parts.netloc.rsplit(":", 1)[0] + f":{port}"
        self.url = urlunsplit(self._parts._replace(netloc=netloc))
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        await self._server.wait_closed()

    def stall(self) -> None:
        self._flowing.clear()

    def drop(self) -> None:
        for t in list(self._transports):
            t.abort()
            self.dropped += 1
        self._transports.clear()
        self._flowing.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, up_writer.transport)
        self._transports.update(pair)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for t in pair:
                t.abort()
                self._transports.discard(t)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            # A stall holds what was read: nothing reaches the other side
            # until the connection is dropped (then the write fails).
            await self._flowing.wait()
            if writer.transport.is_closing():
                return
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()
