"""``python -m bench fuzz [--iterations N] [--seed S]``: fuzz the server-side
sans-IO connection of every wire codec with plain seeded random inputs.

Each codec's server object is fed random bytes, mutated valid client input
(bytes flipped, inserted, deleted, spans duplicated) and valid input cut into
random chunks.  A call may only return or raise the codec's documented
``RemoteProtocolError`` family; anything else is a crash.  A call taking more
than a second is slow.  ``tests/fuzz`` drives the same generators through
hypothesis (a few hundred cases per codec in CI); this command runs many more
without hypothesis's overhead, printing per codec: iterations, crashes, slow
calls and the slowest call.
"""

from __future__ import annotations

import argparse
import random
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from polyport.protocols.bson import connection as bson_conn
from polyport.protocols.bson import errors as bson_errors
from polyport.protocols.bson.frames import Connect, Ping
from polyport.protocols.micromsg2 import connection as mm2_conn
from polyport.protocols.micromsg2 import errors as mm2_errors
from polyport.protocols.micromsg2.frames import Handshake, Message
from polyport.protocols.micromsg2.state import State as Mm2State
from polyport.protocols.reactivesocket import connection as rs_conn
from polyport.protocols.reactivesocket import errors as rs_errors
from polyport.protocols.reactivesocket import frames as rs_frames
from polyport.protocols.res01 import connection as res01_conn
from polyport.protocols.res01 import errors as res01_errors
from polyport.protocols.res01.frames import AppendCommit, FetchEntry, FetchEvents, NewEvent
from polyport.protocols.rsocket import connection as rsocket_conn
from polyport.protocols.rsocket import errors as rsocket_errors
from polyport.protocols.rsocket import frames as rsocket_frames
from polyport.protocols.rsocket import metadata as rsocket_metadata
from polyport.protocols.rsocket.frames import Setup
from polyport.protocols.segment import connection as segment_conn
from polyport.protocols.segment import errors as segment_errors
from polyport.protocols.segment.frames import KeepAlive, ReadSegment, SetupAppend

# A call slower than this is reported (and fails tests/fuzz).
SLOW_SECONDS = 1.0

Input = list[bytes]  # chunks of one TCP stream, or the parts of one Res01 message


# One valid client input and the frames a server connection decodes from it.
Case = tuple[Input, list[object]]


@dataclass(frozen=True)
class Codec:
    """One codec's fuzz target: valid client inputs to mutate (each with the
    frames it decodes to), and how to feed an input to a fresh server
    connection (returning what it decoded)."""

    name: str
    cases: Callable[[], list[Case]]
    feed: Callable[[Input], list[object]]
    # The documented errors a server connection raises on bad input.
    allowed: type[Exception]
    # Res01 takes whole messages (lists of parts), the others byte streams.
    stream: bool = True

    def seeds(self) -> list[Input]:
        return [data for data, _frames in self.cases()]


# --- valid inputs, from each codec's own client-side encoders ---------------------------


def _bson_cases() -> list[Case]:
    client = bson_conn.ClientConnection()
    connect = Connect(version="1.0", username="user", password="secret")
    hello = client.send(connect)
    # PING is answered by the connection itself: no frame for the session.
    return [([hello], [connect]), ([hello, client.send(Ping())], [connect])]


def _mm2_cases() -> list[Case]:
    client = mm2_conn.ClientConnection("fuzz-client")
    server = mm2_conn.ServerConnection("fuzz-server")
    hello_frame = client.hello_frame()
    hello = client.send(hello_frame)
    server.receive_data(hello)
    client.receive_data(server.send(server.reply_frame()))
    final_frame = client.final_frame()
    final = client.send(final_frame)
    msg = Message(client.next_seq, "/queue/a", b'{"k": 1}', {"p": "v"})
    message = client.send(msg)
    return [([hello], [hello_frame]), ([hello, final], [hello_frame, final_frame]),
            ([hello, final, message], [hello_frame, final_frame, msg])]


def _rs_cases() -> list[Case]:
    client = rs_conn.ClientConnection("tcp", max_fragment=8)
    setup = client.setup(b"")
    read = b'{"op": "read", "stream": "s"}'
    rr_id, request = client.request_response(read)
    rs_id, stream = client.request_stream(b"sub", 4)
    got = [rs_frames.Setup(b""), rs_frames.RequestResponse(rr_id, read)]
    return [([setup], got[:1]), ([setup, *request], got),
            ([setup, *request, *stream], [*got, rs_frames.RequestStream(rs_id, 4, b"sub")])]


def _rsocket_cases() -> list[Case]:
    client = rsocket_conn.ClientConnection("tcp", max_fragment=8)
    setup_frame = Setup(30_000, 90_000, rsocket_metadata.COMPOSITE, "application/json")
    setup = client.setup(setup_frame)
    data = b'{"stream": "s", "events": []}'
    rr_id, request = client.request_response(None, data)
    fnf_id, fnf = client.request_fnf(b"meta", b"data")
    got = [setup_frame, rsocket_frames.RequestResponse(rr_id, None, data)]
    return [([setup], got[:1]), ([setup, *request], got),
            ([setup, *request, *fnf],
             [*got, rsocket_frames.RequestFnf(fnf_id, b"meta", b"data")])]


def _segment_cases() -> list[Case]:
    client = segment_conn.ClientConnection()
    ka, setup_frame = KeepAlive(b"ping"), SetupAppend(uuid.UUID(int=7), "seg-1")
    read_frame = ReadSegment("seg-1", 0, 4096)
    keepalive = client.send(ka)
    setup = client.send(setup_frame)
    read = client.send(read_frame)
    return [([keepalive], [ka]), ([keepalive, read], [ka, read_frame]),
            ([setup, read], [setup_frame, read_frame])]


def _res01_cases() -> list[Case]:
    client = res01_conn.ClientConnection()
    event = NewEvent(uuid.UUID(int=1), datetime(2024, 1, 1, tzinfo=UTC), "t", "{}", '{"k": 1}')
    commit = AppendCommit(b"r1", "default", "s-1", -1, (event,))
    fetch = FetchEvents(b"r2", (FetchEntry(1, 10),))
    # What the ROUTER socket hands over: the peer's routing id first.
    return [([b"\x00peer", *client.send(commit)], [commit]),
            ([b"\x00peer", *client.send(fetch)], [fetch])]


# --- feeding a fresh server connection ---------------------------------------------------


def _feed_bson(chunks: Input) -> list[object]:
    conn = bson_conn.ServerConnection()
    return [f for chunk in chunks for f in conn.receive_data(chunk)]


def _feed_mm2(chunks: Input) -> list[object]:
    conn = mm2_conn.ServerConnection("fuzz-server")
    out: list[object] = []
    for chunk in chunks:
        for frame in conn.receive_data(chunk):
            out.append(frame)
            # As the adapter does: answer the hello so a final can follow.
            if (
                isinstance(frame, Handshake)
                and conn.state is not Mm2State.CLOSED
                and conn.negotiated is None
            ):
                conn.send(conn.reply_frame())
    return out


def _feed_rs(chunks: Input) -> list[object]:
    conn = rs_conn.ServerConnection("tcp", max_reassembly_bytes=1 << 16)
    return [f for chunk in chunks for f in conn.receive_data(chunk)]


def _feed_rsocket(chunks: Input) -> list[object]:
    conn = rsocket_conn.ServerConnection("tcp", max_reassembly_bytes=1 << 16)
    return [f for chunk in chunks for f in conn.receive_data(chunk)]


def _feed_segment(chunks: Input) -> list[object]:
    conn = segment_conn.ServerConnection()
    return [f for chunk in chunks for f in conn.receive_data(chunk)]


def _feed_res01(parts: Input) -> list[object]:
    exchange = res01_conn.ServerConnection(max_request_bytes=1 << 20).receive_message(parts)
    return [exchange.request]


CODECS: tuple[Codec, ...] = (
    Codec("bson", _bson_cases, _feed_bson, bson_errors.RemoteProtocolError),
    Codec("micromsg2", _mm2_cases, _feed_mm2, mm2_errors.RemoteProtocolError),
    Codec("reactivesocket", _rs_cases, _feed_rs, rs_errors.RemoteProtocolError),
    Codec("res01", _res01_cases, _feed_res01, res01_errors.RemoteProtocolError, stream=False),
    Codec("rsocket", _rsocket_cases, _feed_rsocket, rsocket_errors.RemoteProtocolError),
    Codec("segment", _segment_cases, _feed_segment, segment_errors.RemoteProtocolError),
)


# --- the generators ----------------------------------------------------------------------


def _random_bytes(rng: random.Random, most: int = 256) -> bytes:
    return rng.randbytes(rng.randint(0, most))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """A few byte-level edits: flip, set, insert, delete, duplicate a span."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:  # flip bits of one byte
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # an interesting value (lengths, flags)
            i = rng.randrange(len(buf))
            buf[i] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF))
        elif op == 2:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and buf:
            del buf[pos : pos + rng.randint(1, 8)]
        elif buf:
            start = rng.randrange(len(buf))
            buf[pos:pos] = buf[start : start + rng.randint(1, 16)]
    return bytes(buf)


def _split(rng: random.Random, data: bytes) -> list[bytes]:
    """``data`` cut at random places (possibly one byte at a time)."""
    if not data:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data) + 1), k=min(len(data), rng.randint(1, 12))))
    if cuts[-1] != len(data):
        cuts.append(len(data))
    out, start = [], 0
    for cut in cuts:
        out.append(data[start:cut])
        start = cut
    return out


def generate(codec: Codec, rng: random.Random, seeds: Sequence[Input]) -> Input:
    """One fuzz input for ``codec``: random, mutated valid, or valid re-split."""
    kind = rng.randrange(3)
    if not codec.stream:
        parts = list(rng.choice(seeds))
        if kind == 0:
            return [_random_bytes(rng, 64) for _ in range(rng.randint(0, 12))]
        if kind == 1:
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(parts))
                parts[i] = _mutate(rng, parts[i])
            return parts
        # Whole parts dropped, duplicated or swapped.
        i, j = rng.randrange(len(parts)), rng.randrange(len(parts))
        op = rng.randrange(3)
        if op == 0:
            del parts[i]
        elif op == 1:
            parts.insert(i, parts[j])
        else:
            parts[i], parts[j] = parts[j], parts[i]
        return parts
    if kind == 0:
        return [_random_bytes(rng) for _ in range(rng.randint(1, 4))]
    whole = b"".join(rng.choice(seeds))
    if kind == 1:
        whole = _mutate(rng, whole)
    return _split(rng, whole)


@dataclass(frozen=True)
class Outcome:
    """One call: how long it took, and the unexpected exception if any."""

    seconds: float
    crash: BaseException | None


def run_one(codec: Codec, data: Input) -> Outcome:
    start = time.perf_counter()
    crash: BaseException | None = None
    try:
        codec.feed(data)
    except codec.allowed:
        pass
    except Exception as exc:  # noqa: BLE001 - the finding: reported, not raised
        crash = exc
    return Outcome(time.perf_counter() - start, crash)


# --- the command --------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fuzz", description=__doc__)
    parser.add_argument("--iterations", type=int, default=10_000, help="inputs per codec")
    parser.add_argument("--seed", type=int, default=0, help="random seed (reproducible runs)")
    parser.add_argument("--codec", action="append", help="only these codecs (repeatable)")
    args = parser.parse_args(argv)
    failed = False
    print(f"{'codec':<15} {'iterations':>10} {'crashes':>8} {'slow':>5} {'max ms':>8}")
    for codec in CODECS:
        if args.codec and codec.name not in args.codec:
            continue
        rng = random.Random(f"{args.seed}:{codec.name}")
        seeds = codec.seeds()
        crashes: dict[str, tuple[int, Input, BaseException]] = {}
        slow = 0
        worst = 0.0
        for _ in range(args.iterations):
            data = generate(codec, rng, seeds)
            outcome = run_one(codec, data)
            worst = max(worst, outcome.seconds)
            slow += outcome.seconds > SLOW_SECONDS
            if outcome.crash is not None:
                key = f"{type(outcome.crash).__name__}: {outcome.crash}"[:200]
                count = crashes[key][0] + 1 if key in crashes else 1
                crashes[key] = (count, crashes[key][1] if key in crashes else data, outcome.crash)
        total = sum(c for c, _, _ in crashes.values())
        failed |= bool(total or slow)
        print(f"{codec.name:<15} {args.iterations:>10} {total:>8} {slow:>5} {worst * 1000:>8.1f}")
        for key, (count, data, exc) in crashes.items():
            print(f"  {count} x {key}\n    input: {data!r}"[:2000])
            print("    " + "".join(traceback.format_exception(exc)[-3:]).replace("\n", "\n    "))
    return 1 if failed else 0
