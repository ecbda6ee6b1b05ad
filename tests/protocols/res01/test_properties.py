"""Property tests: round trips, fuzzed multipart input, truncation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyport.protocols.res01 import (
    AppendCommit,
    CommitResult,
    DateTimeKind,
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
    Res01Error,
    Response,
    SetEntry,
    SetSubscription,
    SubscribeResult,
    SubscriptionDefinition,
    SubscriptionProgressed,
    SubscriptionSet,
    datetime_to_ticks,
    decode_request,
    decode_response,
    encode_error_reply,
    encode_request,
    encode_response,
    ticks_to_datetime,
)
from polyport.protocols.res01.values import MAX_TICKS

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)
times = st.datetimes(timezones=st.just(UTC))
protocols = st.sampled_from(["Res01", "RC0.1"])
request_ids = st.binary(max_size=8)
routing = st.lists(st.binary(min_size=1, max_size=6), max_size=3).map(tuple)


def small(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(strategy, max_size=3).map(tuple)


requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(
        AppendCommit,
        request_id=request_ids,
        context=text,
        stream=text,
        expected_version=int64,
        events=small(st.builds(NewEvent, st.uuids(), times, text, text, text)),
        protocol=protocols,
    ),
    st.builds(
        RegisterSubscriptions,
        request_id=request_ids,
        subscriber_id=text,
        subscriptions=small(st.builds(SubscriptionDefinition, text, text, times)),
        protocol=protocols,
    ),
    st.builds(
        FetchEvents,
        request_id=request_ids,
        entries=small(st.builds(FetchEntry, int64, int32)),
        protocol=protocols,
    ),
    st.builds(
        ProgressSubscriptions,
        request_id=request_ids,
        entries=small(st.builds(ProgressEntry, int64, times)),
        protocol=protocols,
    ),
    st.builds(
        SetSubscription,
        request_id=request_ids,
        entries=small(st.builds(SetEntry, text, text, text, times)),
        protocol=protocols,
    ),
)

responses: st.SearchStrategy[Response] = st.one_of(
    st.builds(CommitResult, request_id=request_ids, commit_id=st.uuids(), protocol=protocols),
    st.builds(
        SubscribeResult, request_id=request_ids, subscription_ids=small(int64), protocol=protocols
    ),
    st.builds(
        EventsFetched,
        request_id=request_ids,
        subscription_id=int64,
        events=small(
            st.builds(FetchedEvent, st.uuids(), text, text, int64, times, text, text, text)
        ),
        protocol=protocols,
    ),
    st.builds(
        SubscriptionProgressed,
        request_id=request_ids,
        subscription_ids=small(int64),
        protocol=protocols,
    ),
    st.builds(SubscriptionSet, request_id=request_ids, results=small(text), protocol=protocols),
    st.builds(Error, request_id=request_ids, code=int32, message=text, protocol=protocols),
)

# Frames that steer random messages past the envelope checks.
interesting_frames = st.one_of(
    st.binary(max_size=20),
    st.sampled_from(
        [
            b"",
            b"Res01",
            b"RC0.1",
            b"AC",
            b"RS",
            b"FE",
            b"PS",
            b"SS",
            b"CR",
            b"SR",
            b"EF",
            b"SP",
            b"ST",
            b"ER",
            b"0",
            b"1",
            b"2",
            b"-1",
            b"5245980530577387904",
            bytes(16),
        ]
    ),
    int64.map(lambda n: str(n).encode()),
)
multipart = st.lists(interesting_frames, max_size=16)


def assert_refused_properly(err: Res01Error) -> None:
    assert err.er_code in (1, 2, 3)
    # Whatever was refused, the server can always build its ER reply.
    reply = encode_error_reply(err)
    assert reply[len(err.routing)] == b""


@SETTINGS
@given(routing, requests)
def test_requests_round_trip(route: tuple[bytes, ...], request: Request) -> None:
    frames = encode_request(request)
    assert decode_request([*route, *frames]) == (route, request)


@SETTINGS
@given(routing, responses)
def test_responses_round_trip(route: tuple[bytes, ...], response: Response) -> None:
    frames = encode_response(route, response)
    assert frames[: len(route)] == list(route)
    assert decode_response(frames[len(route) :]) == response
    assert decode_response(frames) == response


@SETTINGS
@given(multipart)
def test_random_multipart_requests_only_raise_res01_error(frames: list[bytes]) -> None:
    try:
        decode_request(frames)
    except Res01Error as err:
        assert_refused_properly(err)


@SETTINGS
@given(multipart)
def test_random_multipart_responses_only_raise_res01_error(frames: list[bytes]) -> None:
    try:
        decode_response(frames)
    except Res01Error as err:
        assert err.er_code in (1, 2, 3)


@SETTINGS
@given(routing, requests, st.data())
def test_truncated_requests_are_refused(
    route: tuple[bytes, ...], request: Request, data: st.DataObject
) -> None:
    frames = [*route, *encode_request(request)]
    keep = data.draw(st.integers(0, len(frames) - 1))
    try:
        decode_request(frames[:keep])
    except Res01Error as err:
        assert_refused_properly(err)
    else:
        raise AssertionError(f"truncated to {keep} frames but decoded")


@SETTINGS
@given(requests, st.data())
def test_every_truncation_is_refused(request: Request, data: st.DataObject) -> None:
    frames = [b"peer", *encode_request(request)]
    for keep in range(len(frames)):
        try:
            decode_request(frames[:keep])
        except Res01Error as err:
            assert_refused_properly(err)
        else:
            raise AssertionError(f"truncated to {keep} frames but decoded")


@SETTINGS
@given(responses)
def test_truncated_responses_are_refused(response: Response) -> None:
    frames = encode_response((), response)
    for keep in range(len(frames)):
        try:
            decode_response(frames[:keep])
        except Res01Error as err:
            assert err.er_code in (1, 2, 3)
        else:
            raise AssertionError(f"truncated to {keep} frames but decoded")


@SETTINGS
@given(routing, requests, st.data())
def test_extra_trailing_frames_are_refused(
    route: tuple[bytes, ...], request: Request, data: st.DataObject
) -> None:
    extra = data.draw(st.lists(st.binary(max_size=4), min_size=1, max_size=3))
    try:
        decode_request([*route, *encode_request(request), *extra])
    except Res01Error as err:
        assert err.er_code == 1
    else:
        raise AssertionError("extra frames accepted")


@SETTINGS
@given(st.integers(0, MAX_TICKS // 10), st.sampled_from(list(DateTimeKind)))
def test_microsecond_ticks_round_trip(micros: int, kind: DateTimeKind) -> None:
    ticks = micros * 10
    dt = ticks_to_datetime(ticks)
    assert dt == datetime(1, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    binary = datetime_to_ticks(dt, kind)
    assert ticks_to_datetime(binary) == dt
    if kind is not DateTimeKind.LOCAL:
        assert binary == ticks | (kind << 62)


@SETTINGS
@given(int64)
def test_any_binary_datetime_decodes_or_is_malformed(value: int) -> None:
    try:
        dt = ticks_to_datetime(value)
    except Res01Error as err:
        assert err.er_code == 1
    else:
        assert dt.tzinfo is UTC
