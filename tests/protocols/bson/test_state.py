"""Connection state machines: legal and illegal sequences, on both ends."""

from __future__ import annotations

import pytest

from polyport.protocols.bson import (
    AbortTx,
    AckEv,
    ClientConnection,
    CommitTx,
    Connect,
    Emit,
    LocalProtocolError,
    Ping,
    ProtocolError,
    Query,
    QueryAck,
    QueryResponse,
    QueryResult,
    Recev,
    RemoteProtocolError,
    RequestError,
    Response,
    ServerConnection,
    StartTx,
    State,
    SubResponse,
    Subscribe,
    TransactionTable,
    Unsubscribe,
    decode_frame,
    encode_frame,
)
from polyport.protocols.bson.frames import CLIENT_FRAME_TYPES, CONNECT, SERVER_FRAME_TYPES, Frame
from polyport.protocols.bson.state import (
    CLIENT_RECEIVE,
    CLIENT_SEND,
    REPLIES,
    REQUEST_TYPES,
    SERVER_RECEIVE,
    SERVER_SEND,
)


def wire(*frames: Frame) -> bytes:
    return b"".join(encode_frame(f) for f in frames)


def connected_server(**kwargs: int) -> ServerConnection:
    conn = ServerConnection(**kwargs)
    conn.receive_data(wire(Connect("1.0")))
    conn.send(Response(ok=True))
    return conn


def connected_client() -> ClientConnection:
    conn = ClientConnection()
    conn.send(Connect("1.0"))
    conn.receive_data(wire(Response(ok=True)))
    assert conn.state is State.CONNECTED
    return conn


def subscribed_server(sub_id: int = 5, **kwargs: int) -> ServerConnection:
    conn = connected_server(**kwargs)
    conn.receive_data(wire(Subscribe("orders")))
    conn.send(SubResponse(ok=True, sub_id=sub_id))
    return conn


def recev(sub_id: int = 5, seq: int = 0, size: int = 0) -> Recev:
    return Recev(sub_id, "orders", "t", 1, seq, {"pad": "x" * size})


# --- tables --------------------------------------------------------------------------


def test_tables_only_hold_frames_of_the_right_direction() -> None:
    assert {t for _, t in SERVER_RECEIVE} <= CLIENT_FRAME_TYPES
    assert {t for _, t in CLIENT_SEND} <= CLIENT_FRAME_TYPES
    assert {t for _, t in SERVER_SEND} <= SERVER_FRAME_TYPES
    assert {t for _, t in CLIENT_RECEIVE} <= SERVER_FRAME_TYPES


def test_only_connect_is_legal_before_connect() -> None:
    assert [t for (s, t) in SERVER_RECEIVE if s is State.AWAIT_CONNECT] == [CONNECT]
    assert all(SERVER_RECEIVE[(State.CONNECTED, t)] is State.CONNECTED for t in REQUEST_TYPES)
    assert (State.CONNECTED, CONNECT) not in SERVER_RECEIVE


def test_every_request_has_a_reply_or_is_an_ack() -> None:
    assert set(REPLIES) | {"ACKEV", "QUERYACK"} == CLIENT_FRAME_TYPES


# --- server: CONNECT ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame", [Emit("s", "t", {}), Ping(), StartTx(1), Subscribe("s"), Query(1, "b", {})]
)
def test_server_rejects_anything_before_connect(frame: Frame) -> None:
    conn = ServerConnection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(wire(frame))
    assert info.value.code == "unauthenticated"
    assert info.value.fatal
    assert "first frame must be CONNECT" in info.value.message
    assert conn.state is State.MUST_CLOSE


def test_fatal_error_is_answered_then_closed() -> None:
    conn = ServerConnection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(wire(Ping()))
    data = conn.send_error(info.value)
    assert decode_frame(data) == Response(
        ok=False, err_code="unauthenticated", err_msg=info.value.message
    )
    assert conn.state is State.CLOSED
    assert conn.receive_data(wire(Connect("1.0"))) == []
    with pytest.raises(LocalProtocolError):
        conn.send(Response(ok=True))


def test_connect_then_verdict_ok() -> None:
    conn = ServerConnection()
    assert conn.receive_data(wire(Connect("1.0", "tim", "1234"))) == [
        Connect("1.0", "tim", "1234")
    ]
    assert conn.state is State.CONNECTING
    assert conn.pending_requests == (Connect("1.0", "tim", "1234"),)
    assert decode_frame(conn.send(Response(ok=True))) == Response(ok=True)
    assert conn.state is State.CONNECTED
    assert conn.pending_requests == ()


def test_pipelined_requests_wait_for_the_verdict() -> None:
    conn = ServerConnection()
    emit = Emit("s", "t", {"a": 1})
    assert conn.receive_data(wire(Connect("1.0"), emit, Ping())) == [Connect("1.0")]
    # More input while CONNECTING is only buffered.
    assert conn.receive_data(wire(Ping())) == []
    assert conn.receive_data(b"") == []
    conn.send(Response(ok=True))
    assert conn.receive_data(b"") == [emit, Ping(), Ping()]


def test_refused_connect_closes_and_drops_pipelined_requests() -> None:
    conn = ServerConnection()
    conn.receive_data(wire(Connect("9.0"), Emit("s", "t", {})))
    conn.send(Response(ok=False, err_code="unsupported", err_msg="version 9.0"))
    assert conn.state is State.CLOSED
    assert conn.buffered_bytes == 0
    assert conn.receive_data(b"") == []
    with pytest.raises(LocalProtocolError, match="closed"):
        conn.send(Response(ok=True))


def test_nothing_but_the_verdict_while_connecting() -> None:
    conn = ServerConnection()
    conn.receive_data(wire(Connect("1.0")))
    with pytest.raises(LocalProtocolError):
        conn.send(SubResponse(ok=True, sub_id=1))


def test_too_much_pipelined_before_the_verdict() -> None:
    conn = ServerConnection(max_frame_size=150)
    frames = conn.receive_data(wire(Connect("1.0")) + wire(Ping()) * 10)
    assert frames == [Connect("1.0")]
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(b"")
    assert info.value.code == "busy"


def test_connect_twice() -> None:
    conn = connected_server()
    with pytest.raises(RemoteProtocolError, match="already connected") as info:
        conn.receive_data(wire(Connect("1.0")))
    assert info.value.code == "malformed"


@pytest.mark.parametrize(
    "frame",
    [Response(ok=True), SubResponse(ok=True, sub_id=1), recev(), QueryResponse(1, 0)],
)
def test_server_rejects_server_frames_from_the_client(frame: Frame) -> None:
    conn = connected_server()
    with pytest.raises(RemoteProtocolError, match="is sent by the server, not by the client"):
        conn.receive_data(wire(frame))


def test_good_frames_come_before_the_error_that_follows_them() -> None:
    conn = connected_server()
    frames = conn.receive_data(wire(Ping()) + b"\x05\x00\x00\x00\x01")
    assert frames == [Ping()]
    assert conn.state is State.CONNECTED
    with pytest.raises(RemoteProtocolError, match="invalid BSON"):
        conn.receive_data(b"")
    assert conn.state is State.MUST_CLOSE
    # In-flight requests may still be answered, then the error closes.
    assert decode_frame(conn.send(Response(ok=True))) == Response(ok=True)
    conn.send_error(ProtocolError("bye"))
    assert conn.state is State.CLOSED


def test_must_close_allows_no_new_deliveries() -> None:
    conn = subscribed_server()
    with pytest.raises(RemoteProtocolError):
        conn.receive_data(b"\x00\x00\x00\x00")
    with pytest.raises(LocalProtocolError, match="MUST_CLOSE"):
        conn.send(recev())
    assert conn.receive_data(wire(Ping())) == []


# --- server: replies -----------------------------------------------------------------------


def test_replies_must_follow_request_order() -> None:
    conn = connected_server()
    conn.receive_data(wire(Subscribe("s"), Ping()))
    with pytest.raises(LocalProtocolError, match="cannot answer the pending SUBSCRIBE"):
        conn.send(QueryResponse(1, 0))
    with pytest.raises(LocalProtocolError, match="successful SUBSCRIBE"):
        conn.send(Response(ok=True))
    conn.send(SubResponse(ok=True, sub_id=1))
    assert conn.pending_requests == (Ping(),)
    conn.send(Response(ok=True))
    with pytest.raises(LocalProtocolError, match="none is pending"):
        conn.send(Response(ok=True))


def test_acks_get_no_reply() -> None:
    conn = subscribed_server()
    conn.receive_data(wire(AckEv(5), QueryAck(1)))
    assert conn.pending_requests == ()


def test_failed_subscribe_or_query_may_get_a_plain_response() -> None:
    conn = connected_server()
    conn.receive_data(wire(Subscribe("s"), Query(1, "b", {}), Subscribe("s")))
    conn.send(Response(ok=False, err_code="forbidden"))
    conn.send(Response(ok=False, err_code="not_found"))
    with pytest.raises(LocalProtocolError, match="SUBRESPONSE"):
        conn.send(Response(ok=True))
    conn.send(SubResponse(ok=False, err_code="not_found", err_msg="no stream"))
    assert conn.subscriptions == frozenset()


def test_subresponse_ok_needs_a_fresh_sub_id() -> None:
    conn = subscribed_server(sub_id=5)
    conn.receive_data(wire(Subscribe("s")))
    with pytest.raises(LocalProtocolError, match="must carry subID"):
        conn.send(SubResponse(ok=True))
    with pytest.raises(LocalProtocolError, match="already in use"):
        conn.send(SubResponse(ok=True, sub_id=5))
    conn.send(SubResponse(ok=True, sub_id=6))
    assert conn.subscriptions == {5, 6}


def test_recev_only_for_granted_subscriptions() -> None:
    conn = subscribed_server(sub_id=5)
    with pytest.raises(LocalProtocolError, match="unknown subID 6"):
        conn.send(recev(sub_id=6))
    conn.send(recev(sub_id=5))
    conn.receive_data(wire(Unsubscribe(5)))
    conn.send(recev(sub_id=5))  # still allowed until the UNSUBSCRIBE is answered
    conn.send(Response(ok=True))
    assert conn.subscriptions == frozenset()
    with pytest.raises(LocalProtocolError, match="unknown subID 5"):
        conn.send(recev(sub_id=5))


def test_failed_unsubscribe_keeps_the_subscription() -> None:
    conn = subscribed_server(sub_id=5)
    conn.receive_data(wire(Unsubscribe(5)))
    conn.send(Response(ok=False, err_code="not_found"))
    assert conn.subscriptions == {5}


def test_ackev_flow_control() -> None:
    conn = subscribed_server(flow_pause_bytes=1000, flow_resume_bytes=500)
    sizes = [len(conn.send(recev(seq=i, size=150))) for i in range(3)]
    assert conn.unacked_bytes(5) == sum(sizes)
    assert not conn.is_delivery_paused(5)
    conn.send(recev(seq=3, size=150))
    assert conn.is_delivery_paused(5)
    # Acknowledging some is not enough to resume: hysteresis down to 500.
    conn.receive_data(wire(AckEv(5, num_bytes=sizes[0])))
    assert conn.is_delivery_paused(5)
    conn.receive_data(wire(AckEv(5, num_bytes=sizes[1] + sizes[2])))
    assert conn.unacked_bytes(5) < 500
    assert not conn.is_delivery_paused(5)
    conn.receive_data(wire(AckEv(5)))
    assert conn.unacked_bytes(5) == 0
    # Acks for unknown subscriptions are ignored (they may cross an UNSUBSCRIBE).
    conn.receive_data(wire(AckEv(99, num_bytes=10)))
    assert conn.state is State.CONNECTED


def test_query_results_and_window() -> None:
    conn = connected_server(max_unacked_query_results=2)
    conn.receive_data(wire(Query(3, "baskets", {"qty": {"$gt": 1}})))
    with pytest.raises(LocalProtocolError, match="answered by QUERYRESPONSE"):
        conn.send(Response(ok=True))
    with pytest.raises(LocalProtocolError, match="queryID 4"):
        conn.send(QueryResponse(4, 3))
    with pytest.raises(LocalProtocolError, match="no results due"):
        conn.send(QueryResult(3, {}))
    conn.send(QueryResponse(3, 3))
    assert conn.is_query_active(3)
    conn.send(QueryResult(3, {"id": 1}))
    conn.send(QueryResult(3, {"id": 2}))
    assert not conn.can_send_query_result(3)
    assert conn.unacked_query_results(3) == 2
    conn.receive_data(wire(QueryAck(3)))
    assert conn.can_send_query_result(3)
    conn.send(QueryResult(3, {"id": 3}))
    assert not conn.is_query_active(3)
    with pytest.raises(LocalProtocolError, match="no results due"):
        conn.send(QueryResult(3, {"id": 4}))
    conn.receive_data(wire(QueryAck(3), QueryAck(3), QueryAck(3)))
    assert conn.unacked_query_results(3) == 0


def test_query_id_reusable_only_when_finished() -> None:
    conn = connected_server()
    conn.receive_data(wire(Query(3, "b", {}), Query(3, "b", {})))
    conn.send(QueryResponse(3, 1))
    with pytest.raises(LocalProtocolError, match="still active"):
        conn.send(QueryResponse(3, 1))
    conn.send(Response(ok=False, err_code="malformed", err_msg="queryID 3 in use"))
    conn.receive_data(wire(Query(4, "b", {})))
    conn.send(QueryResponse(4, 0))
    assert not conn.is_query_active(4)


def test_server_cannot_send_client_frames_or_bad_values() -> None:
    conn = connected_server()
    conn.receive_data(wire(Ping(), Ping()))
    with pytest.raises(LocalProtocolError, match="sent by the client"):
        conn.send(Ping())
    with pytest.raises(LocalProtocolError, match="'ok' must be a boolean"):
        conn.send(Response(ok="yes"))  # type: ignore[arg-type]
    conn.send(Response(ok=True))
    big = ServerConnection(max_frame_size=100)
    big.receive_data(wire(Connect("1.0")))
    with pytest.raises(LocalProtocolError) as info:
        big.send(Response(ok=True, err_msg="x" * 100))
    assert info.value.code == "too_large"
    assert big.state is State.CONNECTING


# --- transactions ----------------------------------------------------------------------


def test_transaction_table() -> None:
    table = TransactionTable()
    table.start(1)
    assert table.is_open(1)
    with pytest.raises(RequestError) as info:
        table.start(1)
    assert info.value.code == "malformed"
    assert not info.value.fatal
    assert "already in progress for sessID 1" in info.value.message
    table.commit(1)
    assert not table.is_open(1)
    for finish in (table.commit, table.abort):
        with pytest.raises(RequestError) as info:
            finish(1)
        assert info.value.code == "not_found"
        assert "no transaction in progress for sessID 1" in info.value.message
    table.start(1)
    table.start(2)
    table.abort(1)
    assert table.open_sessions == {2}
    assert table.clear() == {2}
    assert table.open_sessions == frozenset()


def test_transaction_misuse_is_answered_and_the_connection_stays() -> None:
    """How the adapter uses ``conn.transactions``: as it handles each frame in
    order, a RequestError becomes the RESPONSE; the connection carries on."""
    conn = connected_server()
    frames = conn.receive_data(
        wire(StartTx(7), Emit("s", "t", {}, sess_id=7), StartTx(7), CommitTx(7), AbortTx(7))
    )
    replies: list[Response] = []
    for frame in frames:
        try:
            if isinstance(frame, StartTx):
                conn.transactions.start(frame.sess_id)
            elif isinstance(frame, CommitTx):
                conn.transactions.commit(frame.sess_id)
            elif isinstance(frame, AbortTx):
                conn.transactions.abort(frame.sess_id)
            reply = Response(ok=True)
        except RequestError as err:
            reply = err.to_response()
        replies.append(reply)
        conn.send(reply)
    assert [r.ok for r in replies] == [True, True, False, True, False]
    assert replies[2].err_code == "malformed"
    assert replies[4].err_code == "not_found"
    assert conn.state is State.CONNECTED


# --- client ----------------------------------------------------------------------------


def test_client_must_connect_first() -> None:
    conn = ClientConnection()
    with pytest.raises(LocalProtocolError, match="AWAIT_CONNECT"):
        conn.send(Ping())
    with pytest.raises(RemoteProtocolError, match="before the client sent CONNECT"):
        ClientConnection().receive_data(wire(Response(ok=True)))


def test_client_pipelines_behind_connect() -> None:
    conn = ClientConnection()
    conn.send(Connect("1.0"))
    conn.send(Emit("s", "t", {}))
    assert conn.state is State.CONNECTING
    with pytest.raises(LocalProtocolError):
        conn.send(Connect("1.0"))
    assert conn.receive_data(wire(Response(ok=True), Response(ok=True))) == [
        Response(ok=True),
        Response(ok=True),
    ]
    assert conn.state is State.CONNECTED
    assert conn.pending_requests == ()


def test_client_refused_connect() -> None:
    conn = ClientConnection()
    conn.send(Connect("7.0"))
    refused = Response(ok=False, err_code="unsupported")
    assert conn.receive_data(wire(refused, Response(ok=True))) == [refused]
    assert conn.state is State.CLOSED
    assert conn.receive_data(wire(Response(ok=True))) == []
    with pytest.raises(LocalProtocolError):
        conn.send(Ping())


def test_client_rejects_frames_before_the_connect_answer() -> None:
    conn = ClientConnection()
    conn.send(Connect("1.0"))
    with pytest.raises(RemoteProtocolError, match="before answering CONNECT"):
        conn.receive_data(wire(recev()))
    assert conn.state is State.MUST_CLOSE
    with pytest.raises(LocalProtocolError):
        conn.send(Ping())


def test_client_unsolicited_responses() -> None:
    conn = connected_client()
    with pytest.raises(RemoteProtocolError, match="none is pending"):
        conn.receive_data(wire(Response(ok=True)))
    # A failure nobody asked for is the server's fatal-error notice.
    conn = connected_client()
    notice = Response(ok=False, err_code="malformed", err_msg="bad frame")
    assert conn.receive_data(wire(notice)) == [notice]
    assert conn.state is State.CLOSED


def test_client_checks_replies_and_deliveries() -> None:
    conn = connected_client()
    conn.send(Subscribe("orders"))
    with pytest.raises(RemoteProtocolError, match="successful SUBSCRIBE"):
        conn.receive_data(wire(Response(ok=True)))
    conn = connected_client()
    with pytest.raises(RemoteProtocolError, match="unknown subID"):
        conn.receive_data(wire(recev()))
    conn = connected_client()
    with pytest.raises(RemoteProtocolError, match="no results due"):
        conn.receive_data(wire(QueryResult(1, {})))
    conn = connected_client()
    with pytest.raises(RemoteProtocolError, match="sent by the client, not by the server"):
        conn.receive_data(wire(Ping()))


def test_client_and_server_conversation() -> None:
    client, server = ClientConnection(), ServerConnection()

    def to_server(*frames: Frame) -> list[Frame]:
        return server.receive_data(b"".join(client.send(f) for f in frames))

    def to_client(*frames: Frame) -> list[Frame]:
        return client.receive_data(b"".join(server.send(f) for f in frames))

    assert to_server(Connect("0.1", "tim", "1234"), Subscribe("orders")) == [
        Connect("0.1", "tim", "1234")
    ]
    assert to_client(Response(ok=True)) == [Response(ok=True)]
    assert server.receive_data(b"") == [Subscribe("orders")]
    to_client(SubResponse(ok=True, sub_id=1))
    assert client.subscriptions == server.subscriptions == {1}

    event = recev(sub_id=1)
    assert to_client(event) == [event]
    assert client.unacked_bytes(1) == server.unacked_bytes(1) == len(encode_frame(event))
    to_server(AckEv(1, num_bytes=client.unacked_bytes(1)))
    assert client.unacked_bytes(1) == server.unacked_bytes(1) == 0

    to_server(Query(2, "baskets", {}))
    to_client(QueryResponse(2, 1), QueryResult(2, {"id": "b1"}))
    assert client.unacked_query_results(2) == server.unacked_query_results(2) == 1
    to_server(QueryAck(2))
    assert client.unacked_query_results(2) == server.unacked_query_results(2) == 0

    to_server(Unsubscribe(1), Ping())
    to_client(Response(ok=True), Response(ok=True))
    assert client.subscriptions == server.subscriptions == frozenset()
    assert client.pending_requests == server.pending_requests == ()


def test_receive_sized_reports_each_frame_size() -> None:
    client = connected_client()
    client.send(Subscribe("s"))
    recevs = [Recev(1, "s", "t", 0, n, {"pad": "x" * n}) for n in range(3)]
    data = wire(SubResponse(ok=True, sub_id=1), *recevs)
    got = client.receive_sized(data[:-3]) + client.receive_sized(data[-3:])
    assert [f for f, _ in got] == [SubResponse(ok=True, sub_id=1), *recevs]
    assert [n for _, n in got] == [len(encode_frame(f)) for f, _ in got]
    assert client.unacked_bytes(1) == sum(n for _, n in got[1:])
