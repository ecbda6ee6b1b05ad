"""Byte-exact vectors: every request and response, both directions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from polyport.protocols.res01 import (
    AppendCommit,
    CommitResult,
    Error,
    EventsFetched,
    FetchedEvent,
    FetchEntry,
    FetchEvents,
    NewEvent,
    ProgressEntry,
    ProgressSubscriptions,
    RegisterSubscriptions,
    Request,
    Response,
    SetEntry,
    SetSubscription,
    SubscribeResult,
    SubscriptionDefinition,
    SubscriptionProgressed,
    SubscriptionSet,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

G1 = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
G1_WIRE = bytes.fromhex("33221100 5544 7766 8899 aabbccddeeff")
G2 = uuid.UUID("a0a1a2a3-b0b1-c0c1-d0d1-d2d3d4d5d6d7")
G2_WIRE = bytes.fromhex("a3a2a1a0 b1b0 c1c0 d0d1 d2d3d4d5d6d7")

T = datetime(2011, 1, 1, 4, 0, 15, tzinfo=UTC)
T_WIRE = b"5245980530577387904"  # UTC kind
T2 = datetime(2011, 1, 1, 4, 0, 15, 123456, tzinfo=UTC)
T2_WIRE = b"5245980530578622464"  # UTC kind, + 1 234 560 ticks

ROUTING = (b"\x00\x80\x00\x41\xa7", b"broker-7")

# (request, frames as a DEALER client sends them, without the leading b"")
# fmt: off
REQUESTS: list[tuple[Request, list[bytes]]] = [
    (
        AppendCommit(
            request_id=b"req-1",
            context="shop",
            stream="order-42",
            expected_version=1,
            events=(
                NewEvent(G1, T, "OrderPlaced", '{"by":"ann"}', '{"total":12}'),
                NewEvent(G2, T2, "Noted", "", "café"),
            ),
        ),
        [
            b"Res01", b"AC", b"req-1", b"shop", b"order-42", b"1", b"2",
            G1_WIRE, T_WIRE, b"OrderPlaced", b'{"by":"ann"}', b'{"total":12}',
            G2_WIRE, T2_WIRE, b"Noted", b"", b"caf\xc3\xa9",
        ],
    ),
    (
        AppendCommit(b"r", "c", "s", -1, ()),
        [b"Res01", b"AC", b"r", b"c", b"s", b"-1", b"0"],
    ),
    (
        RegisterSubscriptions(
            request_id=b"\x00\x01",
            subscriber_id="billing",
            subscriptions=(
                SubscriptionDefinition("shop", "order-", T),
                SubscriptionDefinition("shop", "*", T2),
            ),
        ),
        [
            b"Res01", b"RS", b"\x00\x01", b"billing", b"2",
            b"shop", b"order-", T_WIRE,
            b"shop", b"*", T2_WIRE,
        ],
    ),
    (
        FetchEvents(b"7", (FetchEntry(42, 100), FetchEntry(9223372036854775807, 1))),
        [b"Res01", b"FE", b"7", b"2", b"42", b"100", b"9223372036854775807", b"1"],
    ),
    (
        ProgressSubscriptions(b"8", (ProgressEntry(42, T),)),
        [b"Res01", b"PS", b"8", b"1", b"42", T_WIRE],
    ),
    (
        SetSubscription(b"9", (SetEntry("billing", "shop", "", T2),)),
        [b"Res01", b"SS", b"9", b"1", b"billing", b"shop", b"", T2_WIRE],
    ),
    (
        FetchEvents(b"rc", (), protocol="RC0.1"),
        [b"RC0.1", b"FE", b"rc", b"0"],
    ),
]

# (response, frames after the routing frames and the empty delimiter)
RESPONSES: list[tuple[Response, list[bytes]]] = [
    (CommitResult(b"req-1", G1), [b"Res01", b"req-1", b"CR", G1_WIRE]),
    (
        SubscribeResult(b"\x00\x01", (17, 18)),
        [b"Res01", b"\x00\x01", b"SR", b"2", b"17", b"18"],
    ),
    (
        EventsFetched(
            b"7",
            42,
            (FetchedEvent(G1, "order-42", "shop", 1, T, "OrderPlaced", "{}", "café"),),
        ),
        [
            b"Res01", b"7", b"EF", b"42", b"1",
            G1_WIRE, b"order-42", b"shop", b"1", T_WIRE, b"OrderPlaced", b"{}", b"caf\xc3\xa9",
        ],
    ),
    (EventsFetched(b"7", 43, ()), [b"Res01", b"7", b"EF", b"43", b"0"]),
    (SubscriptionProgressed(b"8", (42,)), [b"Res01", b"8", b"SP", b"1", b"42"]),
    (
        SubscriptionSet(b"9", ("", "no such subscription")),
        [b"Res01", b"9", b"ST", b"2", b"", b"no such subscription"],
    ),
    (
        Error(b"req-1", 6, "wrong expected version"),
        [b"Res01", b"req-1", b"ER", b"6", b"wrong expected version"],
    ),
    (Error(b"", -1, "boom"), [b"Res01", b"", b"ER", b"-1", b"boom"]),
    (CommitResult(b"rc", G2, protocol="RC0.1"), [b"RC0.1", b"rc", b"CR", G2_WIRE]),
]


# fmt: on


@pytest.mark.parametrize(("request_", "frames"), REQUESTS)
def test_encode_request(request_: Request, frames: list[bytes]) -> None:
    assert encode_request(request_) == [b"", *frames]


@pytest.mark.parametrize(("request_", "frames"), REQUESTS)
def test_decode_request_behind_router(request_: Request, frames: list[bytes]) -> None:
    assert decode_request([*ROUTING, b"", *frames]) == (ROUTING, request_)


@pytest.mark.parametrize(("request_", "frames"), REQUESTS)
def test_decode_request_without_routing(request_: Request, frames: list[bytes]) -> None:
    assert decode_request([b"", *frames]) == ((), request_)


@pytest.mark.parametrize(("response", "frames"), RESPONSES)
def test_encode_response(response: Response, frames: list[bytes]) -> None:
    assert encode_response(ROUTING, response) == [*ROUTING, b"", *frames]
    assert encode_response((), response) == [b"", *frames]


@pytest.mark.parametrize(("response", "frames"), RESPONSES)
def test_decode_response(response: Response, frames: list[bytes]) -> None:
    assert decode_response([b"", *frames]) == response


def test_reply_echoes_the_clients_protocol() -> None:
    _, request = decode_request([b"id", b"", b"RC0.1", b"AC", b"r", b"c", b"s", b"1", b"0"])
    reply = CommitResult(request.request_id, G1, protocol=request.protocol)
    assert encode_response((b"id",), reply) == [b"id", b"", b"RC0.1", b"r", b"CR", G1_WIRE]


def test_lists_are_stored_as_tuples() -> None:
    request = FetchEvents(b"r", [FetchEntry(1, 2)])  # type: ignore[arg-type]
    assert request.entries == (FetchEntry(1, 2),)
    hash(request)


def test_message_classes_name_their_command() -> None:
    assert AppendCommit.command == b"AC"
    assert Error.command == b"ER"
