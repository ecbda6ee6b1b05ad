"""FILTER_VALUE, MESSAGE properties, filters and the pubsub commands."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyport.protocols.micromsg2 import (
    Command,
    Condition,
    Destination,
    Filter,
    PropertyValue,
    ProtocolError,
    Subscribe,
    Unsubscribe,
    decode_properties,
    encode_properties,
    parse_filter,
    parse_pubsub_command,
    parse_value,
    to_command,
)

from .strategies import property_maps, property_values

AT = datetime(2014, 10, 13, 11, 0, tzinfo=UTC)
PROPS: dict[str, PropertyValue] = {"age": 18, "at": AT, "name": "Hello world"}

# Every operator against every value type: (condition, matches PROPS).
OPERATOR_TABLE = [
    # Number
    ("age=N18", True),
    ("age=N17", False),
    ("age!=N17", True),
    ("age!=N18", False),
    ("age<N19", True),
    ("age<N18", False),
    ("age<=N18", True),
    ("age<=N17", False),
    ("age>N17", True),
    ("age>N18", False),
    ("age>N-5", True),
    # Date
    ("at=D1413198000.0", True),
    ("at=D1413198000", True),
    ("at=D1413198000.5", False),
    ("at!=D1", True),
    ("at!=D1413198000.000", False),
    ("at<D1413198000.5", True),
    ("at<D1413198000", False),
    ("at<=D1413198000", True),
    ("at<=D1413197999.999999", False),
    ("at>D1413197999.9", True),
    ("at>D1413198000", False),
    # Text: = equals, < starts with, > ends with, != not equal, ~ does not
    # contain, & contains; case sensitive.
    ("name=THello%20world", True),
    ("name=THello", False),
    ("name=Thello%20world", False),
    ("name!=THello", True),
    ("name!=THello%20world", False),
    ("name<THello", True),
    ("name<Tworld", False),
    ("name<Thello", False),
    ("name>Tworld", True),
    ("name>THello", False),
    ("name~Txyz", True),
    ("name~Tlo%20w", False),
    ("name~TLO", True),
    ("name&Tlo%20w", True),
    ("name&Txyz", False),
    ("name&Tlo+w", True),  # '+' is a space in URL encoding
    # Unprefixed values are literal text.
    ("name=Hello world", True),
    ("name<Hello", True),
    ("name&lo", True),
]


@pytest.mark.parametrize(("text", "expected"), OPERATOR_TABLE)
def test_every_operator_and_type(text: str, expected: bool) -> None:
    assert parse_filter(text)(PROPS) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("age~N5", "'~' does not apply to numbers"),
        ("age&N5", "'&' does not apply to numbers"),
        ("at~D1", "'~' does not apply to dates"),
        ("at&D1.5", "'&' does not apply to dates"),
        ("name<=THello", "'<=' is not used for text"),
        ("name<=Hello", "'<=' is not used for text"),
        ("age>=N5", "'>=' is not an operator"),
        ("age", "has no operator"),
        ("=N5", "no property name"),
        ("a!b=N5", "'!' is not an operator"),
        ("age=N5.5", "is not a number"),
        ("age=N99999999999999999999", "is not a number"),
        ("name=Nina", "is not a number"),
        ("at=Dyesterday", "is not a date"),
        ("at=D99999999999999", "is not a date"),
        ("name=T%ff", "not valid UTF-8"),
    ],
)
def test_rejected_conditions(text: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_filter(text)


def test_operator_is_the_longest_match() -> None:
    assert parse_filter("a<=N1").conditions == (Condition("a", "<=", 1),)
    assert parse_filter("a!=N1").conditions == (Condition("a", "!=", 1),)
    assert parse_filter("a<N1").conditions == (Condition("a", "<", 1),)
    # After the operator the rest is the value, operators included.
    assert parse_filter("a=<x").conditions == (Condition("a", "=", "<x"),)
    assert parse_filter("a==x").conditions == (Condition("a", "=", "=x"),)


def test_conditions_are_anded_and_empty_matches_all() -> None:
    f = parse_filter("age>N17;name<THello;")
    assert len(f.conditions) == 2 and f(PROPS)
    assert not parse_filter("age>N17;name<Tx")(PROPS)
    assert parse_filter("")(PROPS) and Filter()({})


@pytest.mark.parametrize("text", [t for t, _ in OPERATOR_TABLE])
def test_missing_property_never_matches(text: str) -> None:
    assert parse_filter(text)({"other": 1}) is False


@pytest.mark.parametrize(
    ("text", "props", "expected"),
    [
        # Headers from other protocols are text; typed conditions read them.
        ("age>N17", {"age": "18"}, True),
        ("age=N18", {"age": "x18"}, False),
        ("age!=N5", {"age": "abc"}, False),
        ("n=T18", {"n": 18}, True),
        ("at=D1413198000.0", {"at": "2014-10-13T11:00:00+00:00"}, True),
        ("at=D1413198000.0", {"at": "2014-10-13T11:00:00"}, True),
        ("at=D1413198000.0", {"at": "1413198000"}, True),
        ("at=D1413198000", {"at": 1413198000}, True),
        ("at<D1", {"at": "not a date"}, False),
        ("at=T1413198000.0", {"at": AT}, True),
        ("n=N1", {"n": AT}, False),
        ("at=D0", {"at": datetime(1970, 1, 1)}, True),  # naive is UTC
    ],
)
def test_property_coercion(text: str, props: dict[str, PropertyValue], expected: bool) -> None:
    assert parse_filter(text)(props) is expected


def test_filter_property_names_are_url_decoded() -> None:
    assert parse_filter("first%20name=Tx")({"first name": "x"})
    assert str(Filter((Condition("a=b", "=", "x"),))) == "a%3Db=Tx"


def test_conditions_validate_when_built_directly() -> None:
    with pytest.raises(ProtocolError):
        Condition("a", "~", 1)
    with pytest.raises(ProtocolError):
        Condition("a", ">=", 1)
    with pytest.raises(ProtocolError):
        Condition("", "=", 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=10),
            st.sampled_from(["=", "!=", "<", ">"]),
            property_values,
        ),
        max_size=5,
    )
)
def test_filter_text_round_trip(conds: list[tuple[str, str, PropertyValue]]) -> None:
    f = Filter(tuple(Condition(*c) for c in conds))
    assert parse_filter(str(f)) == f


# --- properties ----------------------------------------------------------------


def test_properties_wire_form() -> None:
    props: dict[str, PropertyValue] = {
        "type": "OrderPlaced",
        "amount": 250,
        "at": AT,
        "note": 'a;b:c "d"',
    }
    text = encode_properties(props)
    assert text == "type:TOrderPlaced;amount:N250;at:D1413198000.0;note:Ta%3Bb%3Ac%20%22d%22;"
    assert decode_properties(text.encode()) == props


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", {}),
        (b"a:N1", {"a": 1}),  # last ';' optional
        (b"a:N1;;b:x;", {"a": 1, "b": "x"}),
        (b"name:Nina;", {"name": "Nina"}),  # not a number: literal text
        (b"name:Doe;", {"name": "Doe"}),
        (b"name:Tom;", {"name": "om"}),  # T is the text prefix
        (b"time:12:00;", {"time": "12:00"}),  # split at the first ':'
        (b"e:;", {"e": ""}),
        (b"first%20name:Tx;", {"first name": "x"}),
        (b"n:N-9223372036854775808;", {"n": -(1 << 63)}),
        (b"n:N9223372036854775808;", {"n": "N9223372036854775808"}),
    ],
)
def test_properties_are_read_leniently(raw: bytes, expected: dict[str, PropertyValue]) -> None:
    assert decode_properties(raw) == expected


@pytest.mark.parametrize("raw", [b"novalue;", b":x;", b"a:1;a:2;", b"\xff:x;", b"a:T%ff;"])
def test_malformed_properties(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_properties(raw)


def test_unrepresentable_property_values() -> None:
    with pytest.raises(ProtocolError, match="64-bit"):
        encode_properties({"n": 1 << 63})
    with pytest.raises(ProtocolError, match="unsupported property value type"):
        encode_properties({"n": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ProtocolError, match="empty"):
        encode_properties({"": 1})


def test_dates_keep_microseconds_and_negative_epochs() -> None:
    assert parse_value("D-1.5", strict=True) == datetime(
        1969, 12, 31, 23, 59, 58, 500000, tzinfo=UTC
    )
    assert parse_value("D0.0000005", strict=True) == datetime(1970, 1, 1, tzinfo=UTC)  # half-even
    assert parse_value("D0.0000015", strict=True) == datetime(1970, 1, 1, 0, 0, 0, 2, tzinfo=UTC)
    assert (
        encode_properties({"d": datetime(1969, 12, 31, 23, 59, 58, 500000, tzinfo=UTC)})
        == "d:D-1.5;"
    )


@settings(max_examples=200, deadline=None)
@given(property_maps)
def test_properties_round_trip(props: dict[str, PropertyValue]) -> None:
    assert decode_properties(encode_properties(props).encode()) == props


# --- pubsub commands ----------------------------------------------------------------


def test_subscribe_command() -> None:
    cmd = Command(
        "subscribe", {"destination": "topic/orders", "filter": "amount>N100;type=TOrderPlaced"}
    )
    req = parse_pubsub_command(cmd)
    assert isinstance(req, Subscribe)
    assert req.destination == Destination("topic", "orders")
    assert req.filter is not None and req.filter({"amount": 150, "type": "OrderPlaced"})
    assert to_command(req) == cmd


def test_unsubscribe_and_queue_destination() -> None:
    req = parse_pubsub_command(Command("unsubscribe", {"destination": "queue/jobs/eu"}))
    assert req == Unsubscribe(Destination("queue", "jobs/eu"))
    assert to_command(req) == Command("unsubscribe", {"destination": "queue/jobs/eu"})
    plain = parse_pubsub_command(Command("subscribe", {"destination": "topic/a", "filter": ""}))
    assert plain == Subscribe(Destination("topic", "a"))


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (Command("publish"), "unknown command"),
        (Command("subscribe"), "needs destination="),
        (Command("subscribe", {"destination": "orders"}), "is not 'topic/<stream>'"),
        (Command("subscribe", {"destination": "topic/"}), "is not 'topic/<stream>'"),
        (Command("subscribe", {"destination": "topic/a", "filtre": "x=y"}), "unknown argument"),
        (Command("unsubscribe", {"destination": "topic/a", "filter": "x=y"}), "unknown argument"),
        (Command("subscribe", {"destination": "topic/a", "filter": "x~N1"}), "does not apply"),
    ],
)
def test_bad_pubsub_commands(cmd: Command, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_pubsub_command(cmd)
