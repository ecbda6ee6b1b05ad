"""Hypothesis strategies and helpers shared by the BSON frames tests."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

import bson
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import strategies as st

from polyport.protocols.bson.frames import (
    FRAME_CLASSES,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Field,
    Frame,
    Kind,
)


def h(annotated: str) -> bytes:
    """Bytes from hand-written hex: whitespace and ``# comments`` ignored."""
    return bytes.fromhex("".join(re.sub(r"#.*", "", line) for line in annotated.splitlines()))


def raw(document: dict[str, Any]) -> bytes:
    """Encode a document with pymongo directly, bypassing the codec's checks."""
    return bson.encode(document)


_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
text = st.text(alphabet=st.characters(blacklist_categories=_SURROGATES), max_size=12)
keys = st.text(
    alphabet=st.characters(blacklist_categories=_SURROGATES, blacklist_characters="\x00"),
    max_size=8,
).filter(lambda k: not k.startswith("$"))
int32s = st.integers(INT32_MIN, INT32_MAX)
int64s = st.integers(INT64_MIN, INT64_MAX)
datetimes_ms = st.datetimes(timezones=st.just(UTC)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    int32s,
    int64s.map(Int64),
    st.floats(allow_nan=False),
    text,
    st.binary(max_size=16),
    st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4)),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    datetimes_ms,
)
documents: st.SearchStrategy[dict[str, Any]] = st.recursive(
    st.dictionaries(keys, scalars, max_size=4),
    lambda children: st.dictionaries(
        keys, st.one_of(scalars, children, st.lists(st.one_of(scalars, children), max_size=3)),
        max_size=4,
    ),
    max_leaves=12,
)

_KIND_VALUES: dict[Kind, st.SearchStrategy[Any]] = {
    Kind.STRING: text,
    Kind.BOOL: st.booleans(),
    Kind.INT32: int32s,
    Kind.INT64: int64s,
    Kind.DOCUMENT: documents,
}


def field_values(field: Field) -> st.SearchStrategy[Any]:
    values = _KIND_VALUES[field.kind]
    if field.min_value is not None:
        upper = INT32_MAX if field.kind is Kind.INT32 else INT64_MAX
        values = st.integers(field.min_value, upper)
    return values if field.required else st.none() | values


def frames_of(cls: type[Frame]) -> st.SearchStrategy[Frame]:
    return st.builds(cls, **{f.attr: field_values(f) for f in cls.FIELDS})


all_frames: st.SearchStrategy[Frame] = st.one_of(
    [frames_of(cls) for cls in FRAME_CLASSES.values()]
)

# One value of every BSON type (None stands for BSON null).
BSON_SAMPLES: list[Any] = [
    "s",
    True,
    7,
    Int64(7),
    1.5,
    {},
    {"a": 1},
    [1],
    b"x",
    Binary(b"0123456789abcdef", 4),
    None,
    ObjectId(b"0123456789ab"),
    datetime(2020, 1, 1, tzinfo=UTC),
    Regex("a", "i"),
    Decimal128("1.5"),
    Timestamp(1, 1),
    MinKey(),
    MaxKey(),
    Code("x"),
]


def accepted(field: Field, value: Any) -> bool:
    """Whether the codec must accept ``value`` (as decoded by pymongo) for ``field``."""
    if value is None:
        return not field.required
    if field.kind is Kind.STRING:
        return type(value) is str
    if field.kind is Kind.BOOL:
        return type(value) is bool
    if field.kind is Kind.INT32:
        return type(value) is int
    if field.kind is Kind.INT64:
        return type(value) in (int, Int64)
    return type(value) is dict


def wire_body(frame: Frame) -> dict[str, Any]:
    """The frame's body as a plain document (what a peer would send)."""
    from polyport.protocols.bson.wire import frame_to_document

    body = frame_to_document(frame)["frame"]
    assert isinstance(body, dict)
    return body


def envelope(frame_type: Any, body: Any) -> bytes:
    return raw({"type": frame_type, "frame": body})
