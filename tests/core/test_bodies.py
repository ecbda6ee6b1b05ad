"""Body conversions between content types (core.bodies): pure functions."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import bson
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyport.core import bodies


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("application/json", bodies.JSON),
        ("Application/JSON; charset=utf-8", bodies.JSON),
        ("application/cloudevents+json", bodies.JSON),
        ("text/json", bodies.JSON),
        ("application/bson", bodies.BSON),
        ("application/x-msgpack", bodies.MSGPACK),
        ("application/vnd.msgpack ; q=1", bodies.MSGPACK),
        ("text/plain; charset=utf-8", "text/plain"),
        ("", ""),
    ],
)
def test_media_type(content_type: str, kind: str) -> None:
    assert bodies.media_type(content_type) == kind


def test_json_with_parameters_is_a_document() -> None:
    doc = bodies.body_document("application/json; charset=utf-8", b'{"a": 1}')
    assert doc == {"a": 1}


@pytest.mark.parametrize("text", [b"NaN", b'{"a": Infinity}', b"[-Infinity]"])
def test_nan_and_infinity_are_not_json(text: bytes) -> None:
    assert bodies.guess_text_content_type(text) == bodies.TEXT
    assert bodies.body_document(bodies.JSON, text) == {"data": text.decode()}


def test_msgpack_binary_and_numeric_keys_become_text() -> None:
    body = msgpack.packb({b"name": 1, b"\xff\x00": 2, 7: {b"inner": True}, None: 0},
                         use_bin_type=True)
    doc = bodies.body_document(bodies.MSGPACK, body)
    assert doc == {"name": 1, "0xff00": 2, "7": {"inner": True}, "null": 0}
    bson.encode(doc)  # storable as a BSON document
    assert json.loads(bodies.body_json_text(bodies.MSGPACK, body)) == doc


def test_msgpack_timestamps_become_dates() -> None:
    when = datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=UTC)
    body = msgpack.packb({"at": when}, datetime=True)
    assert bodies.body_document("application/msgpack", body) == {"at": when}
    assert json.loads(bodies.body_json_text(bodies.MSGPACK, body)) == {
        "at": {"$date": "2024-02-29T12:00:00.123Z"}}


@given(st.binary(max_size=64), st.sampled_from(
    [bodies.JSON, bodies.BSON, bodies.MSGPACK, bodies.TEXT, bodies.OCTETS, "x/y; a=b"]))
def test_any_body_has_a_document_and_text(body: bytes, content_type: str) -> None:
    assert isinstance(bodies.body_document(content_type, body), dict)
    assert isinstance(bodies.body_json_text(content_type, body), str)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(_JSON_VALUES, st.sampled_from(["utf-8", "utf-16", "utf-32-le", "utf-8-sig"]))
def test_loads_json_is_json_loads_without_the_constants(value, encoding) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert bodies.loads_json(text) == json.loads(text)
    assert bodies.loads_json(text.encode(encoding)) == json.loads(text.encode(encoding))


@pytest.mark.parametrize("doc", ["NaN", "[Infinity]", '{"a": -Infinity}', "\ufeff{}", "{"])
def test_loads_json_refuses_what_is_not_json(doc: str) -> None:
    with pytest.raises(ValueError):
        bodies.loads_json(doc)
