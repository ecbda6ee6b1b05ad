"""The request/reply table and the sans-IO connections that keep it (no sockets)."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyport.protocols import errors as shared
from polyport.protocols.res01 import (
    AppendCommit,
    CommitResult,
    Error,
    EventsFetched,
    FetchEntry,
    FetchEvents,
    LocalProtocolError,
    NewEvent,
    ProgressEntry,
    ProgressSubscriptions,
    RegisterSubscriptions,
    RemoteProtocolError,
    Request,
    Res01Error,
    Response,
    SetEntry,
    SetSubscription,
    SubscribeResult,
    SubscriptionDefinition,
    SubscriptionProgressed,
    SubscriptionSet,
    decode_response,
    encode_request,
    encode_response,
)
from polyport.protocols.res01.connection import Answered, ClientConnection, ServerConnection
from polyport.protocols.res01.frames import CMD_ERROR
from polyport.protocols.res01.state import (
    ANSWERS,
    TRANSITIONS,
    Event,
    RequestProgress,
    RequestState,
    replies_due,
)

T0 = datetime(2020, 1, 1, tzinfo=UTC)
PEER = (b"peer-1",)


# --- messages -------------------------------------------------------------------

REQUEST_KINDS = ("AC", "RS", "FE0", "FE1", "FE3", "PS", "SS")
REPLY_KINDS = ("CR", "SR", "EF", "SP", "ST", "ER")


def make_request(kind: str, rid: bytes, protocol: str = "Res01") -> Request:
    if kind == "AC":
        event = NewEvent(uuid.UUID(int=1), T0, "T", "{}", "{}")
        return AppendCommit(rid, "ctx", "s", -1, (event,), protocol)
    if kind == "RS":
        return RegisterSubscriptions(rid, "me", (SubscriptionDefinition("ctx", "*", T0),), protocol)
    if kind.startswith("FE"):
        entries = tuple(FetchEntry(i + 1, 10) for i in range(int(kind[2:])))
        return FetchEvents(rid, entries, protocol)
    if kind == "PS":
        return ProgressSubscriptions(rid, (ProgressEntry(1, T0),), protocol)
    assert kind == "SS"
    return SetSubscription(rid, (SetEntry("me", "ctx", "*", T0),), protocol)


def make_reply(kind: str, rid: bytes, protocol: str = "Res01") -> Response:
    if kind == "CR":
        return CommitResult(rid, uuid.UUID(int=7), protocol)
    if kind == "SR":
        return SubscribeResult(rid, (1,), protocol)
    if kind == "EF":
        return EventsFetched(rid, 1, (), protocol)
    if kind == "SP":
        return SubscriptionProgressed(rid, (1,), protocol)
    if kind == "ST":
        return SubscriptionSet(rid, ("",), protocol)
    assert kind == "ER"
    return Error(rid, 4, "busy", protocol)


# The successful reply of each request kind.
OK = {"AC": "CR", "RS": "SR", "FE0": "EF", "FE1": "EF", "FE3": "EF", "PS": "SP", "SS": "ST"}


def reply_frames(kind: str, rid: bytes) -> list[bytes]:
    return encode_response((), make_reply(kind, rid))


# --- the table ------------------------------------------------------------------


def test_every_request_command_is_answered_by_its_reply_or_er() -> None:
    for kind, ok in OK.items():
        request = make_request(kind, b"r")
        assert ANSWERS[request.command] == {make_reply(ok, b"r").command, CMD_ERROR}


def test_replies_due() -> None:
    assert [replies_due(make_request(k, b"r")) for k in REQUEST_KINDS] == [1, 1, 0, 1, 3, 1, 1]


def test_nothing_leaves_answered_and_extra_is_never_legal() -> None:
    for event in Event:
        assert (RequestState.ANSWERED, event) not in TRANSITIONS
    assert not any(e is Event.EXTRA for _, e in TRANSITIONS)


def test_fetch_gets_one_ef_per_entry_then_nothing() -> None:
    progress = RequestProgress(make_request("FE3", b"r"))
    ef = make_reply("EF", b"r")
    assert progress.advance(ef, LocalProtocolError) is RequestState.PENDING
    assert progress.owed == 2
    assert progress.advance(ef, LocalProtocolError) is RequestState.PENDING
    assert progress.advance(ef, LocalProtocolError) is RequestState.ANSWERED
    assert progress.owed == 0
    with pytest.raises(LocalProtocolError, match="beyond the 3 due"):
        progress.advance(ef, LocalProtocolError)
    with pytest.raises(LocalProtocolError, match="in state ANSWERED"):
        progress.advance(make_reply("ER", b"r"), LocalProtocolError)


def test_er_ends_a_fetch_midway() -> None:
    progress = RequestProgress(make_request("FE3", b"r"))
    progress.advance(make_reply("EF", b"r"), RemoteProtocolError)
    assert progress.advance(make_reply("ER", b"r"), RemoteProtocolError) is RequestState.ANSWERED


def test_illegal_replies_change_nothing() -> None:
    progress = RequestProgress(make_request("FE1", b"r"))
    with pytest.raises(RemoteProtocolError, match="does not answer"):
        progress.advance(make_reply("CR", b"r"), RemoteProtocolError)
    with pytest.raises(RemoteProtocolError, match="carries its request's id"):
        progress.advance(make_reply("EF", b"other"), RemoteProtocolError)
    assert (progress.state, progress.replies) == (RequestState.PENDING, 0)
    empty = RequestProgress(make_request("FE0", b"r"))
    with pytest.raises(LocalProtocolError, match="beyond the 0 due"):
        empty.advance(make_reply("EF", b"r"), LocalProtocolError)
    assert empty.advance(make_reply("ER", b"r"), LocalProtocolError) is RequestState.ANSWERED


def test_abandoned_requests_count_their_late_replies() -> None:
    progress = RequestProgress(make_request("FE3", b"r"))
    progress.advance(make_reply("EF", b"r"), RemoteProtocolError)
    assert progress.abandon() is RequestState.ABANDONED
    ef = make_reply("EF", b"r")
    assert progress.advance(ef, RemoteProtocolError) is RequestState.ABANDONED
    assert progress.advance(ef, RemoteProtocolError) is RequestState.ANSWERED
    assert progress.abandon() is RequestState.ANSWERED  # answered stays answered


# --- server connection --------------------------------------------------------------


def receive(conn: ServerConnection, kind: str, rid: bytes, routing: tuple[bytes, ...] = PEER):
    return conn.receive_message([*routing, *encode_request(make_request(kind, rid))])


def test_server_pairs_replies_per_request() -> None:
    conn = ServerConnection()
    fe = receive(conn, "FE3", b"1")
    ac = receive(conn, "AC", b"2", (b"peer-2",))
    assert (conn.in_flight(), conn.in_flight(PEER), conn.peers) == (2, 1, {PEER, (b"peer-2",)})
    frames = conn.send(ac, make_reply("CR", b"2"))
    assert frames[:5] == [b"peer-2", b"", b"Res01", b"2", b"CR"]
    assert conn.peers == {PEER}  # a peer is kept only while a request is open
    for _ in range(3):
        assert decode_response(conn.send(fe, make_reply("EF", b"1"))).request_id == b"1"
    assert not conn.is_open(fe) and conn.peers == frozenset()
    with pytest.raises(LocalProtocolError, match="not open"):
        conn.send(fe, make_reply("ER", b"1"))


def test_server_refuses_illegal_replies_as_local_errors() -> None:
    conn = ServerConnection()
    ac = receive(conn, "AC", b"r")
    for reply in (make_reply("EF", b"r"), make_reply("CR", b"x"), make_reply("CR", b"r", "RC0.1")):
        with pytest.raises(LocalProtocolError) as info:
            conn.send(ac, reply)
        assert not isinstance(info.value, shared.RemoteProtocolError)
    assert conn.owed(ac) == 1  # nothing changed: the request still wants its reply
    conn.send(ac, make_reply("CR", b"r"))
    assert conn.in_flight() == 0


def test_server_reply_that_cannot_be_encoded_leaves_the_request_open() -> None:
    conn = ServerConnection()
    fe = receive(conn, "FE1", b"r")
    bad = EventsFetched(b"r", 2**63, (), "Res01")  # subscription id past a long
    with pytest.raises(LocalProtocolError, match="64-bit"):
        conn.send(fe, bad)
    assert conn.is_open(fe)
    conn.send(fe, Error(b"r", -1, "reply could not be encoded", "Res01"))
    assert not conn.is_open(fe)


def test_server_serves_one_peers_duplicate_request_ids_apart() -> None:
    conn = ServerConnection()
    first, second = receive(conn, "AC", b"same"), receive(conn, "PS", b"same")
    assert conn.in_flight(PEER) == 2
    conn.send(second, make_reply("SP", b"same"))
    assert conn.is_open(first) and not conn.is_open(second)
    conn.abandon(first)
    conn.abandon(first)  # twice is harmless
    assert conn.in_flight() == 0 and conn.peers == frozenset()


def test_server_fetch_without_entries_owes_nothing_but_may_get_an_er() -> None:
    conn = ServerConnection()
    fe = receive(conn, "FE0", b"r")
    assert conn.is_open(fe) and conn.owed(fe) == 0
    conn.send(fe, make_reply("ER", b"r"))
    assert not conn.is_open(fe)


def test_server_refuses_undecodable_and_too_large_messages() -> None:
    conn = ServerConnection(max_request_bytes=60)
    with pytest.raises(Res01Error) as info:
        conn.receive_message([*PEER, b"", b"Res01", b"XX", b"r"])
    assert (info.value.er_code, info.value.code) == (3, "unsupported")
    big = [*PEER, *encode_request(make_request("AC", b"big", "RC0.1"))]
    with pytest.raises(Res01Error) as info:
        conn.receive_message(big)
    err = info.value
    assert isinstance(err, RemoteProtocolError)
    assert (err.er_code, err.code, err.routing, err.request_id) == (1, "too_large", PEER, b"big")
    assert "exceeds the limit of 60 bytes" in err.message
    assert conn.refuse(err)[:6] == [*PEER, b"", b"RC0.1", b"big", b"ER", b"1"]
    assert conn.in_flight() == 0  # nothing was opened


# --- client connection ------------------------------------------------------------


def test_client_collects_a_fetchs_replies() -> None:
    conn = ClientConnection()
    frames = conn.send(make_request("FE3", b"1"))
    assert frames[:4] == [b"", b"Res01", b"FE", b"1"]
    assert conn.pending == {b"1"}
    assert conn.receive_message(reply_frames("EF", b"1")) is None
    assert conn.receive_message(reply_frames("EF", b"1")) is None
    answered = conn.receive_message(reply_frames("EF", b"1"))
    assert isinstance(answered, Answered) and len(answered.replies) == 3
    assert answered.error is None and conn.pending == frozenset()


def test_client_er_ends_the_request() -> None:
    conn = ClientConnection()
    conn.send(make_request("FE3", b"1"))
    conn.receive_message(reply_frames("EF", b"1"))
    answered = conn.receive_message(reply_frames("ER", b"1"))
    assert answered is not None and answered.error == make_reply("ER", b"1")
    assert len(answered.replies) == 2


def test_client_refuses_a_second_request_with_an_id_in_flight() -> None:
    conn = ClientConnection()
    conn.send(make_request("AC", b"1"))
    with pytest.raises(LocalProtocolError, match="already in flight"):
        conn.send(make_request("PS", b"1"))
    assert conn.receive_message(reply_frames("CR", b"1")) is not None
    conn.send(make_request("PS", b"1"))  # answered: the id is free again


def test_client_reply_for_an_id_never_sent_is_a_remote_error() -> None:
    conn = ClientConnection()
    with pytest.raises(RemoteProtocolError, match="not in flight") as info:
        conn.receive_message(reply_frames("CR", b"9"))
    assert isinstance(info.value, shared.RemoteProtocolError)
    assert info.value.request_id == b"9"


def test_client_wrong_reply_fails_the_request() -> None:
    conn = ClientConnection()
    conn.send(make_request("AC", b"1"))
    with pytest.raises(RemoteProtocolError, match="does not answer") as info:
        conn.receive_message(reply_frames("EF", b"1"))
    assert info.value.request_id == b"1" and not conn.is_pending(b"1")
    # The right reply coming after all is the abandoned request's: dropped.
    assert conn.receive_message(reply_frames("CR", b"1")) is None


def test_client_undecodable_reply_fails_the_request_it_names() -> None:
    conn = ClientConnection()
    conn.send(make_request("AC", b"1"))
    with pytest.raises(Res01Error) as info:
        conn.receive_message([b"", b"Res01", b"1", b"CR", b"short guid"])
    assert info.value.request_id == b"1" and conn.pending == frozenset()


def test_client_drops_late_replies_to_abandoned_requests() -> None:
    conn = ClientConnection(max_abandoned=2)
    conn.send(make_request("FE3", b"1"))
    conn.abandon(b"1")
    assert conn.receive_message(reply_frames("EF", b"1")) is None
    assert conn.receive_message(reply_frames("ER", b"1")) is None  # final: now forgotten
    with pytest.raises(RemoteProtocolError):
        conn.receive_message(reply_frames("ER", b"1"))
    # Memory for abandoned ids is bounded: the oldest is forgotten first.
    for rid in (b"a", b"b", b"c"):
        conn.send(make_request("AC", rid))
        conn.abandon(rid)
    assert conn.receive_message(reply_frames("CR", b"c")) is None
    with pytest.raises(RemoteProtocolError):
        conn.receive_message(reply_frames("CR", b"a"))


def test_client_does_not_wait_for_a_fetch_without_entries() -> None:
    conn = ClientConnection()
    conn.send(make_request("FE0", b"1"))
    assert not conn.is_pending(b"1")
    assert conn.receive_message(reply_frames("ER", b"1")) is None  # a busy ER is dropped


def test_client_refuses_what_it_cannot_encode() -> None:
    conn = ClientConnection()
    with pytest.raises(LocalProtocolError):
        conn.send(make_request("AC", b"1", protocol="Res02"))
    assert conn.pending == frozenset()


# --- random sequences against a plain model ----------------------------------------

RIDS = (b"1", b"2")
# "OK" stands for the successful reply of whatever request is open under the
# id, so that sequences reach the ends of requests often, not by chance.
REPLY_OR_OK = (*REPLY_KINDS, "OK", "OK", "OK")


@dataclass
class _ModelRequest:
    kind: str
    due: int
    given: int = 0
    abandoned: bool = False


@dataclass
class _ClientModel:
    """The client's rules written out longhand, without the table."""

    max_abandoned: int
    open: dict[bytes, _ModelRequest] = field(default_factory=dict)
    order: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def _forget(self, rid: bytes) -> None:
        self.open.pop(rid, None)
        self.order.pop(rid, None)

    def _abandon(self, rid: bytes) -> None:
        self.open[rid].abandoned = True
        self.order[rid] = None
        while len(self.order) > self.max_abandoned:
            self._forget(next(iter(self.order)))

    def send(self, kind: str, rid: bytes) -> str:
        req = self.open.get(rid)
        if req is not None and not req.abandoned:
            return "local"
        self._forget(rid)
        due = replies_due(make_request(kind, rid))
        self.open[rid] = _ModelRequest(kind, due)
        if due == 0:
            self._abandon(rid)
        return "ok"

    def reply(self, reply_kind: str, rid: bytes) -> str:
        req = self.open.get(rid)
        if req is None:
            return "remote"
        if reply_kind not in (OK[req.kind], "ER") or (reply_kind != "ER" and req.given >= req.due):
            # The request stops being waited for; its later replies are dropped.
            if not req.abandoned:
                self._abandon(rid)
            return "remote"
        req.given += 1
        if reply_kind == "ER" or req.given == req.due:
            self._forget(rid)
            return "none" if req.abandoned else f"answered:{req.given}"
        return "none"

    def garbage(self, rid: bytes) -> str:
        req = self.open.get(rid)
        if req is not None and not req.abandoned:
            self._abandon(rid)
        return "remote"

    def abandon(self, rid: bytes) -> str:
        req = self.open.get(rid)
        if req is not None and not req.abandoned:
            self._abandon(rid)
        return "ok"


client_ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(REQUEST_KINDS), st.sampled_from(RIDS)),
        st.tuples(st.just("reply"), st.sampled_from(REPLY_OR_OK), st.sampled_from(RIDS)),
        st.tuples(st.just("garbage"), st.just(""), st.sampled_from(RIDS)),
        st.tuples(st.just("abandon"), st.just(""), st.sampled_from(RIDS)),
    ),
    max_size=40,
)


def _client_step(conn: ClientConnection, op: str, kind: str, rid: bytes) -> str:
    try:
        if op == "send":
            conn.send(make_request(kind, rid))
            return "ok"
        if op == "reply":
            answered = conn.receive_message(reply_frames(kind, rid))
            return "none" if answered is None else f"answered:{len(answered.replies)}"
        if op == "garbage":  # a reply naming rid that cannot be decoded
            conn.receive_message([b"", b"Res01", rid, b"CR", b"not a guid"])
            return "decoded"
        conn.abandon(rid)
        return "ok"
    except LocalProtocolError:
        return "local"
    except RemoteProtocolError:
        return "remote"


@settings(max_examples=300, deadline=None)
@given(ops=client_ops, max_abandoned=st.integers(0, 3))
def test_client_random_sequences_follow_the_model(
    ops: list[tuple[str, str, bytes]], max_abandoned: int
) -> None:
    conn = ClientConnection(max_abandoned=max_abandoned)
    model = _ClientModel(max_abandoned)
    for op, drawn, rid in ops:
        kind = drawn
        if kind == "OK":
            open_request = model.open.get(rid)
            kind = OK[open_request.kind] if open_request is not None else "CR"
        if op == "send":
            expected = model.send(kind, rid)
        elif op == "reply":
            expected = model.reply(kind, rid)
        elif op == "garbage":
            expected = model.garbage(rid)
        else:
            expected = model.abandon(rid)
        assert _client_step(conn, op, kind, rid) == expected, (op, kind, rid)
        waited = {r for r, m in model.open.items() if not m.abandoned}
        assert conn.pending == waited


server_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("receive"),
            st.sampled_from(REQUEST_KINDS),
            st.sampled_from(RIDS),
            st.sampled_from([(b"p1",), (b"p2",), (b"p1", b"broker")]),
        ),
        st.tuples(st.just("send"), st.sampled_from(REPLY_OR_OK), st.integers(0, 7), st.just(())),
        st.tuples(st.just("abandon"), st.just(""), st.integers(0, 7), st.just(())),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=server_ops)
def test_server_random_sequences_keep_pairing(ops: list[tuple]) -> None:
    conn = ServerConnection()
    received: list = []
    model: dict[int, _ModelRequest] = {}  # index in received → open request
    for op, drawn, arg, routing in ops:
        kind = drawn
        if op == "receive":
            received.append(receive(conn, kind, arg, routing))
            model[len(received) - 1] = _ModelRequest(kind, replies_due(received[-1].request))
            continue
        if not received:
            continue
        index = arg % len(received)
        exchange = received[index]
        if op == "abandon":
            conn.abandon(exchange)
            model.pop(index, None)
            continue
        req = model.get(index)
        if kind == "OK":
            kind = OK[req.kind] if req is not None else "CR"
        reply = make_reply(kind, exchange.request.request_id)
        legal = req is not None and (kind == "ER" or (kind == OK[req.kind] and req.given < req.due))
        if not legal:
            with pytest.raises(LocalProtocolError):
                conn.send(exchange, reply)
        else:
            assert req is not None
            frames = conn.send(exchange, reply)
            assert frames[: len(exchange.routing)] == list(exchange.routing)
            req.given += 1
            if kind == "ER" or req.given == req.due:
                del model[index]
        assert conn.in_flight() == len(model)
        assert conn.peers == {received[i].routing for i in model}
        for i, r in enumerate(received):
            assert conn.is_open(r) == (i in model)
