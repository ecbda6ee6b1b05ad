"""Client-chosen event ids on BSON EMIT and MicroMsg2 MESSAGE: a resend after
an unknown outcome must be stored once."""

from __future__ import annotations

import uuid

import bson
import bson.binary
import pytest

from polyport.core.commands import Append
from polyport.core.errors import Malformed
from polyport.core.events import EventData
from polyport.core.store import EventStore
from polyport.protocols.bson.adapter import emit_event_id
from polyport.protocols.micromsg2.adapter import message_event_id, message_to_event
from polyport.protocols.micromsg2.frames import Message

ID = uuid.UUID("0b4c7e8e-2f7e-4c53-9a55-1a2b3c4d5e6f")


def test_bson_event_id_forms() -> None:
    assert emit_event_id({"eventID": str(ID), "x": 1}) == ID
    assert emit_event_id({"eventID": bson.binary.Binary(ID.bytes, 4)}) == ID
    assert emit_event_id({"eventID": ID}) == ID
    a, b = emit_event_id({"x": 1}), emit_event_id({"x": 1})
    assert a != b  # no id: fresh each time
    for bad in ("not-a-uuid", 12, bson.binary.Binary(ID.bytes, 0)):
        with pytest.raises(Malformed):
            emit_event_id({"eventID": bad})


def test_micromsg2_message_id_forms() -> None:
    def msg(**props: object) -> Message:
        return Message(seq=1, destination="/s", payload=b"x", properties=props)  # type: ignore[arg-type]

    assert message_event_id(msg(**{"message-id": str(ID)})) == ID
    assert message_event_id(msg(id=str(ID))) == ID
    jms = message_event_id(msg(**{"message-id": "ID:host-1-42"}))
    assert jms == message_event_id(msg(**{"message-id": "ID:host-1-42"}))
    assert message_event_id(msg()) != message_event_id(msg())
    # A name-derived id is its context's own: the same text, another tenant.
    assert message_event_id(msg(**{"message-id": "ID:host-1-42"}), "other") != jms
    assert message_event_id(msg(**{"message-id": str(ID)}), "other") == ID
    event = message_to_event(msg(**{"message-id": str(ID)}), json_negotiated=False)
    assert event.event_id == ID
    assert event.headers["message-id"] == str(ID)  # still seen by subscribers


async def test_resent_ids_are_stored_once(store: EventStore) -> None:
    first = EventData("t", b"1", event_id=emit_event_id({"eventID": str(ID)}))
    again = EventData("t", b"1", event_id=emit_event_id({"eventID": str(ID)}))
    r1 = await store.append(Append("default", "resend", (first,)))
    r2 = await store.append(Append("default", "resend", (again,)))
    assert r2.idempotent and not r1.idempotent
    assert (r2.first_position, r2.last_version) == (r1.first_position, r1.last_version)
    assert len(await store.read_all(0)) == 1
