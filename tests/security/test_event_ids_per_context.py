"""Event ids are each tenant's own (issue 27, item 3): tenant B appending
the ids tenant A will use neither blocks A's appends nor tells B anything;
a re-sent id is recognised within its own context only.  Two users of two
contexts over ReactiveSocket, a real gateway and the real database."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyport.core.commands import ReadStream
from polyport.protocols.reactive.client import NewEvent, RemoteError
from polyport.protocols.reactivesocket.client import ReactiveSocketClient

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]


async def test_another_tenants_ids_neither_block_nor_reveal(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(allow_anonymous=False)
    await gw.store.users.add("alice", "pa", default_context="a", contexts=["a"])
    await gw.store.users.add("bob", "pb", default_context="b", contexts=["b"])
    host, port = gw.listeners["reactivesocket"].address
    planned = [uuid.uuid4(), uuid.uuid4()]  # ids alice's client will use
    bob = await ReactiveSocketClient.connect(host, port, user="bob", password="pb")
    alice = await ReactiveSocketClient.connect(host, port, user="alice", password="pa")
    try:
        # Bob takes the ids first, in his own context.
        await bob.append("orders", [NewEvent("squat", b"b", id=i) for i in planned])
        # Alice's appends with them are hers: stored, not "already appended".
        first = await alice.append("orders", [NewEvent("placed", b"a", id=i) for i in planned])
        assert (first.first_version, first.last_version) == (1, 2)
        # Her own resend is recognised as hers: the same positions, nothing new.
        again = await alice.append("orders", [NewEvent("placed", b"a", id=i) for i in planned])
        assert (again.first_version, again.last_version, again.position) == (
            first.first_version, first.last_version, first.position)
        # An id of hers in another of her streams is a conflict in her context only.
        with pytest.raises(RemoteError, match="another stream") as conflict:
            await alice.append("refunds", [NewEvent("x", b"a", id=planned[0])])
        assert conflict.value.code == "wrong_expected_version"
    finally:
        await bob.close()
        await alice.close()
    mine = await gw.store.read_stream(ReadStream("a", "orders"))
    theirs = await gw.store.read_stream(ReadStream("b", "orders"))
    assert [(e.event_id, e.type) for e in mine] == [(i, "placed") for i in planned]
    assert [(e.event_id, e.type) for e in theirs] == [(i, "squat") for i in planned]
