"""The Res01 session's AppendCommit answered from the commit's callback.

Against a real store on PostgreSQL; the ROUTER transport is replaced by a
recorder that can report the peer's queue as full (what ZeroMQ's
``EAGAIN`` on a ``DONTWAIT`` send means), which a loopback socket cannot be
made to do on demand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from polyport.core.commands import ReadStream
from polyport.core.store import EventStore
from polyport.protocols.res01 import (
    AppendCommit,
    CommitResult,
    Error,
    ErrorCode,
    decode_response,
    encode_request,
)
from polyport.protocols.res01.client import new_event
from polyport.protocols.res01.limits import Limits
from polyport.protocols.res01.peers import NO_SOURCE, Source
from polyport.protocols.res01.session import Res01Session
from polyport.protocols.session import ListenerStats, SessionContext
from tests.pg import HEAD_LOCK, row_locked

pytestmark = pytest.mark.timeout(30)

PEER = b"\x00peer-1"


class Recorder:
    """A Router whose peer's queue is full for the next ``full`` tries."""

    def __init__(self) -> None:
        self.full = 0
        self.tries = 0
        self.sent: list[list[bytes]] = []

    async def send(self, endpoint: int, frames: list[bytes], *, wait: bool) -> bool:
        while True:
            sent = self.send_now(endpoint, frames)
            if sent is not None or not wait:
                return bool(sent)
            await asyncio.sleep(0.01)

    def send_now(self, endpoint: int, frames: list[bytes]) -> bool | None:
        self.tries += 1
        if self.full:
            self.full -= 1
            return None
        self.sent.append(frames)
        return True

    def source(self, fd: int) -> Source:
        return NO_SOURCE

    def disconnect(self, source: Source) -> bool:
        return False

    def replies(self) -> list[object]:
        return [decode_response(f[1:]) for f in self.sent]


@pytest.fixture
async def session(store: EventStore) -> AsyncIterator[tuple[Res01Session, Recorder]]:
    ctx = SessionContext(store, stats=ListenerStats("res01"), settings={},
                         log=logging.getLogger("test.res01"))
    router = Recorder()
    session = Res01Session(ctx, Limits(), router, logins=[False])
    yield session, router
    await session.close()


async def deliver(session: Res01Session, request: AppendCommit) -> None:
    assembler = session.assembler()
    frames = [PEER, *encode_request(request)]
    received = None
    for i, part in enumerate(frames):
        received = assembler.add(part, i < len(frames) - 1)
    assert received is not None
    await session.message_received(0, received, None)


async def settle(session: Res01Session) -> None:
    for _ in range(500):
        if session.in_flight == (0, 0) and not session._tasks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"requests still in flight: {session.in_flight}")


def commit(rid: bytes, stream: str, expected: int = -1) -> AppendCommit:
    return AppendCommit(rid, "default", stream, expected, (new_event("T", "{}"),))


async def test_commits_are_answered_from_the_callback_in_order(session, store) -> None:
    s, router = session
    await deliver(s, commit(b"r0", "cb-1", 1))  # looks the anonymous tenant up (a task)
    await settle(s)
    for i in range(1, 4):
        await deliver(s, commit(b"r%d" % i, "cb-1"))
    assert len(s._tasks) == 0  # no task per request once the tenant is known
    await settle(s)
    replies = router.replies()
    assert [r.request_id for r in replies] == [b"r0", b"r1", b"r2", b"r3"]
    assert all(isinstance(r, CommitResult) for r in replies)
    events = await store.read_stream(ReadStream(context="default", stream="cb-1"))
    assert len(events) == 4


async def test_a_full_peer_queue_is_retried_until_the_reply_goes(session) -> None:
    s, router = session
    await deliver(s, commit(b"r0", "cb-2", 1))
    await settle(s)
    router.full = 3
    await deliver(s, commit(b"r1", "cb-2"))
    await settle(s)
    assert router.tries == 1 + 4
    assert [r.request_id for r in router.replies()] == [b"r0", b"r1"]


async def test_a_refused_commit_is_answered_at_once(session) -> None:
    s, router = session
    await deliver(s, commit(b"r0", "cb-3", 1))
    await settle(s)
    await deliver(s, AppendCommit(b"bad", "default", "", -1, (new_event("T", "{}"),)))
    assert s.in_flight == (0, 0)
    await deliver(s, commit(b"wrong", "cb-3", 7))  # the stream is at version 1
    await settle(s)
    bad, wrong = router.replies()[1:]
    assert isinstance(bad, Error) and bad.code == ErrorCode.MALFORMED
    assert isinstance(wrong, Error) and wrong.code == ErrorCode.CONCURRENCY


async def test_close_waits_for_a_commit_in_flight(session, db_url: str) -> None:
    s, router = session
    await deliver(s, commit(b"r0", "cb-4", 1))
    await settle(s)
    async with row_locked(db_url, HEAD_LOCK):
        await deliver(s, commit(b"r1", "cb-4"))
        closing = asyncio.create_task(s.close())
        await asyncio.sleep(0.3)
        assert not closing.done()  # the commit waits on the head row
    await asyncio.wait_for(closing, 10)
    assert [r.request_id for r in router.replies()] == [b"r0", b"r1"]
    assert s.in_flight == (0, 0)
