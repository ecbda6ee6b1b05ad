"""Res01 field encodings: the .NET client's way of putting values in frames.

- int / long: ASCII decimal text (``ToString(CultureInfo.InvariantCulture)``);
- GUID: 16 bytes in ``Guid.ToByteArray()`` order (``uuid.UUID.bytes_le``);
- datetime: ``DateTime.ToBinary()`` as decimal text;
- string: UTF-8.

Decoders raise :class:`Res01Error` (ER 1, malformed); encoders raise
:class:`LocalProtocolError` (a ``ValueError``) for values the wire cannot
carry (a caller bug, not bad input).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Final

from polyport.protocols.res01.errors import ErrorCode, LocalProtocolError, Res01Error

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

# Strict on purpose: Python's int() also takes whitespace, "_", "+" and
# non-ASCII digits, none of which a .NET InvariantCulture ToString produces.
# The length cap keeps a hostile frame from costing a huge int parse.
_DECIMAL = re.compile(rb"-?[0-9]{1,20}")

# Longest repr of a bad frame quoted in an error message.
_QUOTE_MAX = 32


class DateTimeKind(IntEnum):
    """.NET ``DateTimeKind``, as stored in the top two bits of ``ToBinary()``."""

    UNSPECIFIED = 0
    UTC = 1
    LOCAL = 2


TICKS_PER_MICROSECOND: Final = 10
TICKS_PER_DAY: Final = 864_000_000_000
# DateTime.MaxValue.Ticks (9999-12-31T23:59:59.9999999).
MAX_TICKS: Final = 3_155_378_975_999_999_999
_TICKS_MASK: Final = 0x3FFF_FFFF_FFFF_FFFF
_KIND_SHIFT: Final = 62
# .NET's TicksCeiling: local-kind values that were negative after the UTC
# offset was removed are stored wrapped around it.
_TICKS_CEILING: Final = 0x4000_0000_0000_0000
_DOTNET_EPOCH: Final = datetime(1, 1, 1, tzinfo=UTC)


def quote(frame: bytes) -> str:
    """A short printable form of a frame for error messages."""
    if len(frame) <= _QUOTE_MAX:
        return repr(bytes(frame))
    return f"{bytes(frame[:_QUOTE_MAX])!r}... ({len(frame)} bytes)"


def _malformed(message: str) -> Res01Error:
    return Res01Error(message, ErrorCode.MALFORMED)


# --- integers ---------------------------------------------------------------


def _decode_integer(frame: bytes, what: str, low: int, high: int, kind: str) -> int:
    if _DECIMAL.fullmatch(frame) is None:
        raise _malformed(f"{what}: expected {kind} as decimal text, got {quote(frame)}")
    value = int(frame)
    if not low <= value <= high:
        raise _malformed(f"{what}: {value} is out of range for {kind}")
    return value


def decode_int(frame: bytes, what: str) -> int:
    """A .NET ``int`` (32-bit signed) as decimal text."""
    return _decode_integer(frame, what, INT32_MIN, INT32_MAX, "a 32-bit integer")


def decode_long(frame: bytes, what: str) -> int:
    """A .NET ``long`` (64-bit signed) as decimal text."""
    return _decode_integer(frame, what, INT64_MIN, INT64_MAX, "a 64-bit integer")


def encode_int(value: int) -> bytes:
    if not INT32_MIN <= value <= INT32_MAX:
        raise LocalProtocolError(f"{value} does not fit a 32-bit Res01 int")
    return str(int(value)).encode("ascii")


def encode_long(value: int) -> bytes:
    if not INT64_MIN <= value <= INT64_MAX:
        raise LocalProtocolError(f"{value} does not fit a 64-bit Res01 long")
    return str(int(value)).encode("ascii")


# --- text -------------------------------------------------------------------


def decode_text(frame: bytes, what: str) -> str:
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"{what}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def encode_text(value: str) -> bytes:
    return value.encode("utf-8")


# --- GUID -------------------------------------------------------------------


def decode_guid(frame: bytes, what: str) -> uuid.UUID:
    if len(frame) != 16:
        raise _malformed(f"{what}: a GUID is 16 bytes, got {len(frame)}")
    return uuid.UUID(bytes_le=bytes(frame))


def encode_guid(value: uuid.UUID) -> bytes:
    return value.bytes_le


# --- datetime ---------------------------------------------------------------


def datetime_to_ticks(dt: datetime, kind: DateTimeKind = DateTimeKind.UTC) -> int:
    """``dt`` as .NET ``DateTime.ToBinary()`` would give it (a signed 64-bit int).

    A naive ``dt`` is taken as UTC.  Ticks are 100 ns; Python has 1 µs, so the
    result is always a multiple of 10 ticks.  ``kind`` only sets the top bits:
    UTC (the default) for the server's own timestamps, UNSPECIFIED to match a
    client that sent ``DateTime(…)`` without a kind, LOCAL like .NET does for
    a local time (the stored ticks are then UTC ticks, with the top bit set,
    which makes the signed value negative).
    """
    if dt.tzinfo is not None:
        try:
            dt = dt.astimezone(UTC).replace(tzinfo=None)
        except OverflowError as exc:
            raise LocalProtocolError(f"{dt!r} is outside the DateTime range in UTC") from exc
    delta = dt - datetime(1, 1, 1)
    ticks = (
        (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    ) * TICKS_PER_MICROSECOND
    kind = DateTimeKind(kind)
    value = ticks | (int(kind) << _KIND_SHIFT)
    # ToBinary returns a signed long: local kind has bit 63 set.
    return value - (1 << 64) if value > INT64_MAX else value


def ticks_to_datetime(value: int) -> datetime:
    """A .NET ``DateTime.ToBinary()`` value as an aware UTC datetime.

    Every kind is taken as UTC (design brief).  For local kind that is exactly
    right: .NET stores the UTC ticks and converts on ``FromBinary``.  Sub-µs
    ticks are truncated (floor), so a decoded time is never later than sent.
    """
    if not INT64_MIN <= value <= INT64_MAX:
        raise _malformed(f"DateTime binary value {value} does not fit 64 bits")
    raw = value & 0xFFFF_FFFF_FFFF_FFFF
    kind = raw >> _KIND_SHIFT
    ticks = raw & _TICKS_MASK
    if kind >= DateTimeKind.LOCAL:
        # Mirror DateTime.FromBinary: a value near the ceiling is a small
        # negative tick count that wrapped (a local time on 0001-01-01 east of
        # UTC).  Within a day of either end, clamp like .NET's range does.
        if ticks > _TICKS_CEILING - TICKS_PER_DAY:
            ticks -= _TICKS_CEILING
        if ticks < 0:
            ticks = 0
        elif MAX_TICKS < ticks <= MAX_TICKS + TICKS_PER_DAY:
            ticks = MAX_TICKS
    if ticks > MAX_TICKS:
        raise _malformed(f"DateTime ticks {ticks} are past DateTime.MaxValue")
    return _DOTNET_EPOCH + timedelta(microseconds=ticks // TICKS_PER_MICROSECOND)


def decode_datetime(frame: bytes, what: str) -> datetime:
    value = decode_long(frame, what)
    try:
        return ticks_to_datetime(value)
    except Res01Error as exc:
        raise _malformed(f"{what}: {exc.message}") from None


def encode_datetime(dt: datetime, kind: DateTimeKind = DateTimeKind.UTC) -> bytes:
    return str(datetime_to_ticks(dt, kind)).encode("ascii")
