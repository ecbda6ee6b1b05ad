"""FILTER_VALUE, MESSAGE properties and subscription filters.

Values: ``N<long>`` (Number), ``D<epoch seconds[.fraction]>`` (Date, UTC),
``T<url-encoded text>`` (Text); a value without a known prefix is Text, taken
literally.  Properties: ``key:value;`` pairs.  Filters: conditions
``<property><operator><FILTER_VALUE>`` joined by ``;``, all of which must hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from polyport.protocols.micromsg2.errors import LocalProtocolError, RemoteProtocolError
from polyport.protocols.micromsg2.frames import PropertyValue
from polyport.protocols.micromsg2.text import decode_utf8, url_decode, url_encode

NUMBER_PREFIX = "N"
DATE_PREFIX = "D"
TEXT_PREFIX = "T"

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_NUMBER = re.compile(r"-?[0-9]{1,19}")
# Digit counts bound the work a hostile value can cause; 12 integer digits
# reach past year 9999, the end of datetime's range.
_DATE = re.compile(r"-?[0-9]{1,12}(?:\.[0-9]{1,18})?")

# Longest match first: "<=" and "!=" before "<" and "=".
OPERATORS: tuple[str, ...] = ("<=", "!=", "=", "<", ">", "~", "&")
_OPERATOR_CHARS = frozenset("<>=!~&")
NUMERIC_OPERATORS = frozenset({"=", "!=", "<", "<=", ">"})
TEXT_OPERATORS = frozenset({"=", "!=", "<", ">", "~", "&"})


# --- FILTER_VALUE --------------------------------------------------------------


def parse_number(text: str) -> int | None:
    if not _NUMBER.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def parse_date(text: str) -> datetime | None:
    """Epoch seconds with an optional fraction, rounded to microseconds."""
    if not _DATE.fullmatch(text):
        return None
    micros = int(Decimal(text).scaleb(6).to_integral_value(rounding=ROUND_HALF_EVEN))
    try:
        return EPOCH + micros * _MICROSECOND
    except OverflowError:
        return None


def format_date(value: datetime) -> str:
    """Epoch seconds, always with a fraction (``1413198000.0``), exact to the µs."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # naive datetimes are taken as UTC
    micros = (value - EPOCH) // _MICROSECOND
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    digits = f"{fraction:06d}".rstrip("0") or "0"
    return f"{sign}{seconds}.{digits}"


def format_value(value: PropertyValue) -> str:
    """The wire form of a value; text is always written with its ``T`` prefix.
    Only this side writes values, so what cannot be written is our fault."""
    if isinstance(value, datetime):
        return DATE_PREFIX + format_date(value)
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise LocalProtocolError(f"number {value} does not fit a 64-bit long")
        return f"{NUMBER_PREFIX}{int(value)}"
    if isinstance(value, str):
        return TEXT_PREFIX + url_encode(value)
    raise LocalProtocolError(f"unsupported property value type {type(value).__name__}")


def parse_value(text: str, *, strict: bool) -> PropertyValue:
    """Read a FILTER_VALUE.

    ``strict`` (filters) rejects an ``N``/``D`` value that does not parse.  Not
    strict (MESSAGE properties) takes such a value as literal text, because
    unprefixed text like ``first_name:jonas`` is in use and a name such as
    ``Nina`` must not make a message unreadable.
    """
    prefix, rest = text[:1], text[1:]
    if prefix == TEXT_PREFIX:
        return url_decode(rest, "text value")
    if prefix == NUMBER_PREFIX:
        number = parse_number(rest)
        if number is not None:
            return number
        if strict:
            raise RemoteProtocolError(
                f"{text!r} is not a number (N followed by a 64-bit integer); "
                f"write text as T<url-encoded text>"
            )
        return text
    if prefix == DATE_PREFIX:
        date = parse_date(rest)
        if date is not None:
            return date
        if strict:
            raise RemoteProtocolError(
                f"{text!r} is not a date (D followed by epoch seconds, e.g. D1413198000.0); "
                f"write text as T<url-encoded text>"
            )
        return text
    return text


# --- MESSAGE properties ------------------------------------------------------------


def decode_properties(raw: bytes | str) -> dict[str, PropertyValue]:
    text = decode_utf8(raw, "MESSAGE properties") if isinstance(raw, bytes) else raw
    props: dict[str, PropertyValue] = {}
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise RemoteProtocolError(f"property {item!r} is not 'key:value'")
        # Keys are percent-decoded so that any event header name can travel;
        # FIELD-style keys (first_name, type) contain no '%' and pass unchanged.
        name = url_decode(key, "property name")
        if not name:
            raise RemoteProtocolError(f"property {item!r} has an empty name")
        if name in props:
            raise RemoteProtocolError(f"property {name!r} appears twice")
        props[name] = parse_value(value, strict=False)
    return props


def encode_properties(props: Mapping[str, PropertyValue]) -> str:
    parts = []
    for name, value in props.items():
        if not name:
            raise LocalProtocolError("property name must not be empty")
        parts.append(f"{url_encode(name)}:{format_value(value)};")
    return "".join(parts)


# --- filters -------------------------------------------------------------------------


def _as_number(value: PropertyValue) -> int | None:
    if isinstance(value, datetime):
        return None
    if isinstance(value, int):
        return value
    return parse_number(value)


def _as_date(value: PropertyValue) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, int):
        try:
            return EPOCH + timedelta(seconds=value)
        except OverflowError:
            return None
    date = parse_date(value)
    if date is not None:
        return date
    # Headers written by other protocols may carry ISO 8601 timestamps.
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _as_text(value: PropertyValue) -> str:
    if isinstance(value, datetime):
        return format_date(value)
    if isinstance(value, int):
        return str(value)
    return value


_ORDERED: dict[str, Callable[[int | datetime, int | datetime], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,  # type: ignore[operator]
    "<=": lambda a, b: a <= b,  # type: ignore[operator]
    ">": lambda a, b: a > b,  # type: ignore[operator]
}

_TEXT: dict[str, Callable[[str, str], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a.startswith(b),
    ">": lambda a, b: a.endswith(b),
    "~": lambda a, b: b not in a,
    "&": lambda a, b: b in a,
}


def _kind(value: PropertyValue) -> str:
    if isinstance(value, datetime):
        return "date"
    if isinstance(value, int):
        return "number"
    return "text"


@dataclass(frozen=True, slots=True)
class Condition:
    """``<property><operator><value>``; the value's type chooses the comparison.

    A property that is missing, or cannot be read as the value's type, fails
    the condition whatever the operator (``!=`` and ``~`` included).
    """

    property: str
    operator: str
    value: PropertyValue

    def __post_init__(self) -> None:
        if not self.property:
            raise RemoteProtocolError("filter condition has an empty property name")
        if self.operator not in OPERATORS:
            raise RemoteProtocolError(f"unknown filter operator {self.operator!r}")
        kind = _kind(self.value)
        if kind == "text":
            if self.operator not in TEXT_OPERATORS:
                raise RemoteProtocolError(
                    f"filter on {self.property!r}: operator {self.operator!r} is not used "
                    f"for text (text operators: = != < > ~ &)"
                )
        elif self.operator not in NUMERIC_OPERATORS:
            raise RemoteProtocolError(
                f"filter on {self.property!r}: operator {self.operator!r} does not apply "
                f"to {kind}s (use = != < <= >)"
            )

    def matches(self, props: Mapping[str, PropertyValue]) -> bool:
        actual = props.get(self.property)
        if actual is None:
            return False
        value = self.value
        if isinstance(value, str):
            return _TEXT[self.operator](_as_text(actual), value)
        other: int | datetime | None
        if isinstance(value, datetime):
            other = _as_date(actual)
            value = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        else:
            other = _as_number(actual)
        if other is None:
            return False
        return _ORDERED[self.operator](other, value)

    def __str__(self) -> str:
        return f"{url_encode(self.property)}{self.operator}{format_value(self.value)}"


@dataclass(frozen=True, slots=True)
class Filter:
    """A compiled filter: a predicate over a property mapping.  No conditions
    matches everything."""

    conditions: tuple[Condition, ...] = ()

    def __call__(self, props: Mapping[str, PropertyValue]) -> bool:
        return all(c.matches(props) for c in self.conditions)

    def __str__(self) -> str:
        return ";".join(str(c) for c in self.conditions)


def parse_condition(text: str) -> Condition:
    start = next((i for i, ch in enumerate(text) if ch in _OPERATOR_CHARS), None)
    if start is None:
        raise RemoteProtocolError(f"filter condition {text!r} has no operator (<= != = < > ~ &)")
    name = url_decode(text[:start], "filter property name")
    if not name:
        raise RemoteProtocolError(f"filter condition {text!r} has no property name")
    operator = next((op for op in OPERATORS if text.startswith(op, start)), None)
    if operator is None:
        raise RemoteProtocolError(
            f"filter condition {text!r}: {text[start]!r} is not an operator (<= != = < > ~ &)"
        )
    rest = text[start + len(operator) :]
    if operator == ">" and rest.startswith("="):
        # Longest match would read "a>=N5" as "ends with '=N5'", which is never
        # what was meant; text starting with '=' can still be written T%3D...
        raise RemoteProtocolError(
            f"filter condition {text!r}: '>=' is not an operator (<= != = < > ~ &)"
        )
    try:
        value = parse_value(rest, strict=True)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"filter condition {text!r}: {exc.message}") from None
    return Condition(name, operator, value)


def parse_filter(text: str) -> Filter:
    return Filter(tuple(parse_condition(part) for part in text.split(";") if part))
