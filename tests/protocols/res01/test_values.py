"""Field encodings: GUID order, DateTime.ToBinary, strict decimal numbers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from polyport.protocols.res01 import (
    DateTimeKind,
    LocalProtocolError,
    Res01Error,
    datetime_to_ticks,
    ticks_to_datetime,
)
from polyport.protocols.res01.values import (
    decode_datetime,
    decode_guid,
    decode_int,
    decode_long,
    decode_text,
    encode_datetime,
    encode_guid,
    encode_int,
    encode_long,
)

GUID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
GUID_WIRE = bytes.fromhex("33 22 11 00 55 44 77 66 88 99 aa bb cc dd ee ff")

T = datetime(2011, 1, 1, 4, 0, 15, tzinfo=UTC)
T_UNSPECIFIED = b"634294512150000000"
T_UTC = b"5245980530577387904"  # 0x4000000000000000 | 634294512150000000
T_LOCAL = b"-8589077524704775808"  # 0x8000000000000000 | ticks, as a signed long


def test_guid_is_dotnet_byte_order() -> None:
    assert encode_guid(GUID) == GUID_WIRE
    assert decode_guid(GUID_WIRE, "id") == GUID


@pytest.mark.parametrize("frame", [b"", b"\x00" * 15, b"\x00" * 17])
def test_guid_must_be_16_bytes(frame: bytes) -> None:
    with pytest.raises(Res01Error) as info:
        decode_guid(frame, "id")
    assert info.value.er_code == 1


def test_datetime_unspecified_kind_vector() -> None:
    naive = datetime(2011, 1, 1, 4, 0, 15)
    assert encode_datetime(naive, DateTimeKind.UNSPECIFIED) == T_UNSPECIFIED
    assert datetime_to_ticks(naive, DateTimeKind.UNSPECIFIED) == 634294512150000000
    assert decode_datetime(T_UNSPECIFIED, "t") == T


def test_datetime_utc_kind_is_the_default() -> None:
    assert encode_datetime(T) == T_UTC
    assert decode_datetime(T_UTC, "t") == T


def test_datetime_local_kind_is_negative_and_decodes_as_utc() -> None:
    assert encode_datetime(T, DateTimeKind.LOCAL) == T_LOCAL
    assert decode_datetime(T_LOCAL, "t") == T
    # Kind 11 (local, ambiguous DST) too.
    assert ticks_to_datetime(634294512150000000 - 2**62) == T


def test_aware_datetimes_are_converted_to_utc() -> None:
    plus_two = T.astimezone(timezone(timedelta(hours=2)))
    assert encode_datetime(plus_two) == T_UTC


def test_decoded_datetimes_are_aware_utc() -> None:
    assert decode_datetime(T_UNSPECIFIED, "t").tzinfo is UTC


def test_sub_microsecond_ticks_are_floored() -> None:
    assert ticks_to_datetime(634294512150000009) == T
    assert ticks_to_datetime(634294512150000019) == T + timedelta(microseconds=1)


def test_datetime_range_ends() -> None:
    assert ticks_to_datetime(0) == datetime(1, 1, 1, tzinfo=UTC)
    assert ticks_to_datetime(3155378975999999999) == datetime.max.replace(tzinfo=UTC)
    assert datetime_to_ticks(datetime.max, DateTimeKind.UNSPECIFIED) == 3155378975999999990
    with pytest.raises(Res01Error):
        ticks_to_datetime(3155378976000000000)
    with pytest.raises(Res01Error):
        decode_datetime(b"9223372036854775808", "t")


def test_local_kind_wrapped_below_min_clamps_to_min() -> None:
    # .NET stores a local 0001-01-01T01:00 at UTC+2 as -1 h wrapped at 2^62.
    wrapped = (2**62 - 36_000_000_000) | 2**63
    assert ticks_to_datetime(wrapped - 2**64) == datetime(1, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "frame",
    # One non-ASCII frame: an Arabic-Indic digit one, a digit to str.isdigit(), not to the wire.
    [b"", b"-", b" 1", b"1 ", b"+1", b"1_0", b"0x10", b"1.0", "١".encode(), b"1\n", b"1" * 21],  # noqa: RUF001
)
def test_numbers_are_strict_decimal(frame: bytes) -> None:
    with pytest.raises(Res01Error) as info:
        decode_long(frame, "n")
    assert info.value.er_code == 1


def test_number_ranges() -> None:
    assert decode_int(b"2147483647", "n") == 2**31 - 1
    assert decode_int(b"-2147483648", "n") == -(2**31)
    assert decode_int(b"007", "n") == 7
    assert decode_long(b"-9223372036854775808", "n") == -(2**63)
    for frame in (b"2147483648", b"-2147483649"):
        with pytest.raises(Res01Error):
            decode_int(frame, "n")
    with pytest.raises(Res01Error):
        decode_long(b"9223372036854775808", "n")
    assert encode_int(-1) == b"-1"
    assert encode_long(2**63 - 1) == b"9223372036854775807"
    with pytest.raises(LocalProtocolError):
        encode_int(2**31)
    with pytest.raises(LocalProtocolError):
        encode_long(-(2**63) - 1)


def test_text_is_strict_utf8() -> None:
    assert decode_text("café".encode(), "s") == "café"
    with pytest.raises(Res01Error) as info:
        decode_text(b"caf\xe9", "s")
    assert info.value.er_code == 1
