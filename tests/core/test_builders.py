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
from polyport.core.events import NO_HEADERS, EventData, RecordedEvent, event_data

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


_bodies = st.one_of(st.binary(max_size=20), st.binary(max_size=20).map(bytearray),
                    st.binary(max_size=20).map(memoryview))
_headers = st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                max_size=3))
_client_times = st.one_of(st.none(), st.datetimes(), _times)


@given(st.text(max_size=8), _bodies, st.uuids(), st.text(max_size=8), _headers, _client_times)
def test_event_data_is_what_init_leaves(
    type_: str, body: bytes, event_id: uuid.UUID, content_type: str,
    headers: dict[str, str] | None, client_time: datetime | None,
) -> None:
    # The protocols' adapters propose events through event_data(), which
    # skips __init__: it must keep every field as __post_init__ would.
    made = event_data(type_, body, event_id, content_type, headers, client_time)
    init = EventData(type_, body, event_id, headers or {}, content_type,  # type: ignore[arg-type]
                     client_time)
    assert made == init
    assert type(made.body) is bytes and made.body == bytes(body)
    assert made.client_time == init.client_time
    assert made.client_time is None or made.client_time.tzinfo is not None
    with pytest.raises(TypeError):
        made.headers["k"] = "changed"  # type: ignore[index]
    if headers:
        headers["after"] = "x"  # the caller's dict is copied, not kept
        assert "after" not in made.headers
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.type = "other"  # type: ignore[misc]


def test_events_without_headers_share_one_empty_read_only_mapping() -> None:
    a = event_data("T", b"x", uuid.uuid4(), "c")
    b = event_data("T", b"y", uuid.uuid4(), "c", {})
    assert a.headers is b.headers is NO_HEADERS and dict(NO_HEADERS) == {}
    with pytest.raises(TypeError):
        NO_HEADERS["k"] = "v"  # type: ignore[index]
