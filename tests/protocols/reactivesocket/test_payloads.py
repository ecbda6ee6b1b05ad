"""The MessagePack schema of the design brief: vectors, round trips, validation."""

from __future__ import annotations

import uuid

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyport.core.errors import ERROR_BY_CODE
from polyport.protocols.reactive import payloads as shared
from polyport.protocols.reactivesocket import PayloadError, RemoteProtocolError
from polyport.protocols.reactivesocket import payloads as P

from .util import h

EVENT_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")

EVENT = P.EventMap(
    id=EVENT_ID,
    context="default",
    stream="s",
    version=1,
    position=7,
    type="t",
    headers={"k": "v"},
    body=b"hi",
    content_type="text/plain",
    recorded_at=1_700_000_000_000,
)

EVENT_HEX = """
8a
a2 6964 c4 10 00112233445566778899aabbccddeeff
a7 636f6e74657874 a7 64656661756c74
a6 73747265616d a1 73
a7 76657273696f6e 01
a8 706f736974696f6e 07
a4 74797065 a1 74
a7 68656164657273 81 a1 6b a1 76
a4 626f6479 c4 02 6869
ac 636f6e74656e745f74797065 aa 746578742f706c61696e
ab 7265636f726465645f6174 cf 0000018bcfe56800
"""


def test_event_map_vector():
    assert P.encode_event(EVENT) == h(EVENT_HEX)
    assert P.decode_event(h(EVENT_HEX)) == EVENT


def test_setup_data_vector():
    wire = h("83 a4 75736572 a1 75 a8 70617373776f7264 a1 70 a7 636f6e74657874 a1 63")
    setup = P.SetupData(user="u", password="p", context="c")
    assert P.encode_setup_data(setup) == wire
    assert P.decode_setup_data(wire) == setup
    assert P.encode_setup_data(P.SetupData()) == h("80")
    assert P.decode_setup_data(b"") == P.SetupData()
    assert P.decode_setup_data(h("80")) == P.SetupData()


def test_append_request_vectors():
    wire = h(
        "83 a2 6f70 a6 617070656e64 a6 73747265616d a1 73"
        " a6 6576656e7473 91 82 a4 74797065 a1 74 a4 626f6479 c4 01 01"
    )
    req = P.AppendRequest("s", (P.AppendEvent("t", b"\x01"),))
    assert P.encode_request(req) == wire
    assert P.decode_request(wire) == req
    with_expected = h(
        "84 a2 6f70 a6 617070656e64 a6 73747265616d a1 73"
        " a6 6576656e7473 91 82 a4 74797065 a1 74 a4 626f6479 c4 01 01"
        " b0 65787065637465645f76657273696f6e 00"
    )
    req0 = P.AppendRequest("s", (P.AppendEvent("t", b"\x01"),), expected_version=0)
    assert P.encode_request(req0) == with_expected
    assert P.decode_request(with_expected) == req0


def test_read_and_query_request_vectors():
    read = h("83 a2 6f70 a4 72656164 a6 73747265616d a1 73 ac 66726f6d5f76657273696f6e 01")
    assert P.decode_request(read) == P.ReadRequest("s")
    assert P.encode_request(P.ReadRequest("s")) == read
    assert P.decode_request(h("82 a2 6f70 a4 72656164 a6 73747265616d a1 73")) == P.ReadRequest(
        "s", 1, None
    )
    query = h("83 a2 6f70 a5 7175657279 a6 62696e646572 a1 62 a7 6d617463686572 81 a1 61 01")
    assert P.decode_request(query) == P.QueryRequest("b", {"a": 1})
    assert P.encode_request(P.QueryRequest("b", {"a": 1})) == query


def test_error_data_vector():
    wire = h("82 a4 636f6465 a9 6d616c666f726d6564 a7 6d657373616765 a3 626164")
    assert P.encode_error_data("malformed", "bad") == wire
    assert P.decode_error_data(wire) == P.ErrorData("malformed", "bad")


def test_canonical_codes_match_core():
    assert P.CANONICAL_ERROR_CODES == set(ERROR_BY_CODE)


def test_encode_error_data_refuses_unknown_codes():
    with pytest.raises(ValueError):
        P.encode_error_data("oops", "x")
    # ... but decoding keeps them (a newer server may have more).
    assert P.decode_error_data(P.pack({"code": "oops", "message": ""})).code == "oops"


def test_subscribe_request_vectors():
    wire = h("82 a6 707265666978 a2 612d a4 66726f6d 81 a8 706f736974696f6e 05")
    req = P.SubscribeRequest(prefix="a-", start=P.StartAt("position", 5))
    assert P.encode_subscribe_request(req) == wire
    assert P.decode_subscribe_request(wire) == req
    assert P.decode_subscribe_request(b"") == P.SubscribeRequest()
    assert P.decode_subscribe_request(h("80")) == P.SubscribeRequest()


@pytest.mark.parametrize(
    "req",
    [
        P.SubscribeRequest(stream="s", types=("a", "b"), start=P.StartAt("version", 3)),
        P.SubscribeRequest(start=P.StartAt("beginning"), group="g"),
        P.SubscribeRequest(start=P.StartAt("end")),
        P.SubscribeRequest(prefix="", start=P.StartAt("time", 1_700_000_000_000)),
    ],
)
def test_subscribe_round_trip(req):
    assert P.decode_subscribe_request(P.encode_subscribe_request(req)) == req


def test_responses_round_trip():
    a = P.AppendResponse(1, 3, 42)
    assert P.decode_append_response(P.encode_append_response(a)) == a
    assert P.encode_append_response(a) == h(
        "83 ad 66697273745f76657273696f6e 01 ac 6c6173745f76657273696f6e 03 a8 706f736974696f6e 2a"
    )
    r = P.ReadResponse((EVENT, EVENT))
    assert P.decode_read_response(P.encode_read_response(r)) == r
    q = P.QueryResponse(({"a": 1}, {"b": [1, 2]}))
    assert P.decode_query_response(P.encode_query_response(q)) == q


def test_append_request_full_round_trip():
    req = P.AppendRequest(
        "orders-1",
        (
            P.AppendEvent("created", b"{}", EVENT_ID, {"h": "v"}, "application/json"),
            P.AppendEvent("noted", b""),
        ),
        expected_version=4,
    )
    assert P.decode_request(P.encode_request(req)) == req


def test_lenient_forms():
    # bytes sent as str by MessagePack libraries without bin; UUID as text;
    # unknown keys ignored.
    obj = {
        "op": "append",
        "stream": "s",
        "events": [{"type": "t", "body": "text", "id": str(EVENT_ID)}],
        "extra": 1,
    }
    req = P.decode_request(P.pack(obj))
    assert isinstance(req, P.AppendRequest)
    assert req.events[0].body == b"text"
    assert req.events[0].id == EVENT_ID
    assert P.decode_request(P.pack({"op": "query", "binder": "b"})) == P.QueryRequest("b", {})


def bad(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize(
    "data,fragment",
    [
        (b"", "not valid MessagePack"),
        (b"\xc1", "not valid MessagePack"),
        (h("80 80"), "trailing bytes"),
        (bad([1]), "expected a MessagePack map, got array"),
        (bad({}), "'op' is required"),
        (bad({"op": 1}), "'op' must be a string"),
        (bad({"op": "append", "events": [{"type": "t", "body": b""}]}), "'stream' is required"),
        (bad({"op": "append", "stream": "", "events": [{}]}), "'stream' must not be empty"),
        (bad({"op": "append", "stream": 5, "events": [{}]}), "'stream' must be a string"),
        (bad({"op": "append", "stream": "s"}), "'events' must be a non-empty array"),
        (bad({"op": "append", "stream": "s", "events": []}), "non-empty array"),
        (bad({"op": "append", "stream": "s", "events": [1]}), "events[0]: expected a map"),
        (bad({"op": "append", "stream": "s", "events": [{"type": "t"}]}), "'body' is required"),
        (bad({"op": "append", "stream": "s", "events": [{"body": b""}]}), "'type' is required"),
        (
            bad({"op": "append", "stream": "s", "events": [{"type": "t", "body": 1}]}),
            "'body' must be binary",
        ),
        (
            bad(
                {"op": "append", "stream": "s", "events": [{"type": "t", "body": b"", "id": b"1"}]}
            ),
            "'id' must be 16 bytes, got 1",
        ),
        (
            bad({"op": "append", "stream": "s", "events": [{"type": "t", "body": b"", "id": "x"}]}),
            "not a UUID",
        ),
        (
            bad(
                {
                    "op": "append",
                    "stream": "s",
                    "events": [{"type": "t", "body": b"", "headers": {"a": 1}}],
                }
            ),
            "'headers' must map strings to strings",
        ),
        (
            bad(
                {
                    "op": "append",
                    "stream": "s",
                    "expected_version": -1,
                    "events": [{"type": "t", "body": b""}],
                }
            ),
            "'expected_version' must be at least 0",
        ),
        (
            bad(
                {
                    "op": "append",
                    "stream": "s",
                    "expected_version": True,
                    "events": [{"type": "t", "body": b""}],
                }
            ),
            "'expected_version' must be an integer, got boolean",
        ),
        (
            bad({"op": "read", "stream": "s", "from_version": 0}),
            "'from_version' must be at least 1",
        ),
        (bad({"op": "read", "stream": "s", "max": 0}), "'max' must be at least 1"),
        (bad({"op": "read", "stream": "s", "max": "3"}), "'max' must be an integer"),
        (bad({"op": "query"}), "'binder' is required"),
        (bad({"op": "query", "binder": "b", "matcher": [1]}), "'matcher' must be a map"),
    ],
)
def test_request_validation(data, fragment):
    with pytest.raises(PayloadError) as info:
        P.decode_request(data)
    assert fragment in info.value.message
    assert info.value.code == "malformed"
    assert isinstance(info.value, RemoteProtocolError)


def test_unknown_op_is_unsupported():
    with pytest.raises(PayloadError) as info:
        P.decode_request(bad({"op": "delete"}))
    assert info.value.code == "unsupported"
    assert "unknown op 'delete'" in info.value.message


@pytest.mark.parametrize(
    "obj,fragment",
    [
        ({"stream": "s", "prefix": "p"}, "not both"),
        ({"types": "a"}, "'types' must be an array of strings"),
        ({"types": [1]}, "'types' must be an array of strings"),
        ({"from": "middle"}, "'from' must be"),
        ({"from": {"position": -1}}, "'position' must be at least 0"),
        ({"from": {"version": 2}}, "needs an exact 'stream'"),
        ({"from": {"position": 1, "version": 2}}, "'from' must be"),
        ({"from": {"time": "now"}}, "'time' must be an integer"),
        ({"group": 3}, "'group' must be a string"),
    ],
)
def test_subscribe_validation(obj, fragment):
    with pytest.raises(PayloadError) as info:
        P.decode_subscribe_request(bad(obj))
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "decode,obj,fragment",
    [
        (P.decode_setup_data, {"user": 1}, "SETUP data: 'user' must be a string"),
        (P.decode_setup_data, {"context": ""}, "'context' must not be empty"),
        (P.decode_error_data, {"message": "m"}, "'code' is required"),
        (P.decode_append_response, {"first_version": 1}, "'last_version' is required"),
        (P.decode_read_response, {"events": 1}, "'events' must be an array"),
        (P.decode_read_response, {"events": [{}]}, "events[0]: 'id' is required"),
        (P.decode_query_response, {}, "'documents' must be an array"),
        (P.decode_event, {"id": b"x" * 16, "body": b""}, "'context' is required"),
        (
            P.decode_event,
            {**P.event_to_map(EVENT), "version": 0},
            "'version' must be at least 1",
        ),
    ],
)
def test_other_validation(decode, obj, fragment):
    with pytest.raises(PayloadError) as info:
        decode(bad(obj))
    assert fragment in info.value.message


def test_non_string_map_keys_are_refused():
    with pytest.raises(PayloadError):
        P.decode_request(bad({1: "x"}))


# --- the event map's fast check -------------------------------------------------------


_field_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=False),
    st.text(max_size=4), st.binary(max_size=17), st.just(b"\x01" * 16),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=1),
    st.lists(st.integers(), max_size=2),
)
_good = {"id": b"\x01" * 16, "context": "c", "stream": "s", "version": 1, "position": 0,
         "type": "", "headers": {}, "body": b"", "content_type": "", "recorded_at": 0}


@given(st.dictionaries(st.sampled_from(sorted(_good)), _field_values, max_size=10),
       st.booleans())
def test_the_fast_event_check_agrees_with_the_field_by_field_one(fields, on_good):
    """event_from_map checks a well-formed map in one expression and sends
    anything else through _checked_event_from_map: the same result, or the
    same error naming the same field, for every map."""
    obj = {**_good, **fields} if on_good else fields

    def outcome(decode):
        try:
            return decode(obj, "event")
        except PayloadError as exc:
            return str(exc)

    assert outcome(shared.event_from_map) == outcome(shared._checked_event_from_map)


def test_the_fast_event_check_refuses_what_msgpack_could_confuse():
    # True is an int to Python but a boolean in MessagePack; a str body is
    # the lenient form older clients send.
    with pytest.raises(PayloadError, match="'version' must be an integer, got boolean"):
        P.event_from_map({**_good, "version": True})
    assert P.event_from_map({**_good, "body": "hé"}).body == "hé".encode()
    assert P.event_from_map({**_good, "headers": {"a": "b"}}).headers == {"a": "b"}
