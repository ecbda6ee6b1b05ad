"""The ROUTER transport's own wait for a message (``Readable``) against
ZeroMQ's edge-triggered descriptor, on real sockets over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import zmq

from polyport.gateway.transports.zmq_router import Readable, send_message

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"peer")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield router, dealer
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


async def receive(router: zmq.Socket[bytes], readable: Readable) -> list[bytes]:
    """The receive loop's way: a wake-up may find nothing (the descriptor
    signals any change of the socket's state), then it waits again."""
    while True:
        try:
            return router.recv_multipart(zmq.DONTWAIT)
        except zmq.Again:
            await readable.wait()


@contextlib.asynccontextmanager
async def waiting(
    router: zmq.Socket[bytes],
) -> AsyncIterator[tuple[Readable, asyncio.Task[list[bytes]]]]:
    """A receive that has found nothing and waits."""
    readable = Readable(router)
    try:
        task = asyncio.create_task(receive(router, readable))
        await asyncio.sleep(0.05)
        assert not task.done()
        yield readable, task
    finally:
        readable.close()


async def test_a_message_that_arrives_wakes_the_wait(pair) -> None:
    router, dealer = pair
    async with waiting(router) as (_, task):
        dealer.send(b"hello")
        assert await asyncio.wait_for(task, 5) == [b"peer", b"hello"]


async def test_a_send_that_takes_the_signal_still_wakes_the_wait(pair) -> None:
    router, dealer = pair
    dealer.send(b"first")  # the peer is known to the ROUTER
    assert router.recv_multipart() == [b"peer", b"first"]
    async with waiting(router) as (readable, task):
        dealer.send(b"second")
        # Blocking: the event loop does not run while the message reaches the
        # ROUTER's side and leaves its signal on the descriptor.
        time.sleep(0.1)
        # The reply is sent before the loop sees the descriptor: libzmq
        # takes the descriptor's signal while it sends (its commands are
        # processed at most once a millisecond, and it has been longer).
        assert send_message(router, [b"peer", b"reply"], readable) is True
        assert await asyncio.wait_for(task, 5) == [b"peer", b"second"]
        assert dealer.recv() == b"reply"


def test_a_send_to_a_gone_peer_or_a_full_queue(pair) -> None:
    router, dealer = pair
    assert send_message(router, [b"nobody", b"x"], None) is False
    dealer.send(b"hi")
    assert router.recv_multipart() == [b"peer", b"hi"]
    router.setsockopt(zmq.SNDHWM, 1)
    dealer.setsockopt(zmq.RCVHWM, 1)
    results = [send_message(router, [b"peer", b"x" * 65536], None) for _ in range(200)]
    assert results[0] is True
    assert None in results  # the peer does not read: its queue fills
