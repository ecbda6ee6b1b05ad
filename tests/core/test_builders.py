"""frozen_builder: the same objects as __init__ builds, without running it."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyport.core.builders import frozen_builder, uuid_from_bytes, uuid_from_int
from polyport.core.chain_wire import decode_append, encode_append
from polyport.core.commands import Append, AppendResult
from polyport.core.events import EventData, RecordedEvent

_times = st.datetimes(min_value=datetime(1971, 1, 1), timezones=st.just(UTC))


@given(st.tuples(st.text(), st.text(), st.integers(), st.integers(), st.integers(),
                 st.integers(), _times, st.uuids(), st.booleans()))
def test_an_append_result_equals_one_built_by_init(values: tuple[object, ...]) -> None:
    built = frozen_builder(AppendResult)(*values)
    assert built == AppendResult(*values)  # type: ignore[arg-type]
    assert hash(built) == hash(AppendResult(*values))  # type: ignore[arg-type]
    assert dataclasses.astuple(built) == values


@given(st.uuids())
def test_a_uuid_built_from_its_bytes_or_int_is_the_same_uuid(u: uuid.UUID) -> None:
    for built in (uuid_from_bytes(u.bytes), uuid_from_int(u.int)):
        assert built == u and hash(built) == hash(u) and str(built) == str(u)
        assert built.version == u.version and built.is_safe is uuid.SafeUUID.unknown
        assert {built: 1}[u] == 1
        with pytest.raises(TypeError):
            built.int = 0  # type: ignore[misc]


def test_a_recorded_event_equals_one_built_by_init_and_stays_frozen() -> None:
    values = (7, uuid.uuid4(), "ctx", "s", 2, "T", {"k": "v"}, b"body", "application/json",
              None, datetime.now(UTC), "bson", 40)
    built = frozen_builder(RecordedEvent)(*values)
    assert built == RecordedEvent(*values)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.position = 8  # type: ignore[misc]


def test_every_field_is_required_and_positional() -> None:
    build = frozen_builder(AppendResult)
    with pytest.raises(TypeError):
        build("ctx", "s", 1, 1, 1, 1, datetime.now(UTC), uuid.uuid4())  # idempotent left out


def test_field_names_cannot_shadow_the_generated_code() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Awkward:
        obj: int
        _new: str
        _cls: str
        build: int

    assert frozen_builder(Awkward)(1, "n", "c", 2) == Awkward(1, "n", "c", 2)


def test_a_class_it_cannot_build_is_refused_when_the_builder_is_made() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    for cls in (NoSlots, NotFrozen, int):
        with pytest.raises(TypeError, match="frozen dataclass with slots"):
            frozen_builder(cls)


def test_events_decoded_by_the_chain_are_frozen_as_init_leaves_them() -> None:
    # The chain builds EventData without __post_init__: it must leave what
    # that would (read-only headers, a UTC client time).
    sent = Append("ctx", "s", (
        EventData("T", b"x", headers={"k": "v"}, client_time=datetime(2026, 1, 1, tzinfo=UTC)),
        EventData("T", b""),
    ))
    got = decode_append(encode_append(sent))
    assert got == sent
    for event in got.events:
        with pytest.raises(TypeError):
            event.headers["k"] = "changed"  # type: ignore[index]
    assert got.events[0].client_time is not None
    assert got.events[0].client_time.tzinfo is not None
