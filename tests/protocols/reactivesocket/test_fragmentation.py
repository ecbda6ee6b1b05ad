"""B/E fragmentation: RESPONSEs (spec) and requests (polyport's extension)."""

from __future__ import annotations

import pytest

from polyport.protocols.budgets import ByteBudget
from polyport.protocols.reactivesocket import (
    Cancel,
    LocalProtocolError,
    Phase,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    StreamError,
    fragment,
)

from .util import deliver, open_pair, open_server, tcp


def test_fragment_helper_flags_and_sizes():
    frames = fragment(Response(1, b"abcdefg", complete=True), 3)
    assert frames == [
        Response(1, b"abc", begin=True, end=False),
        Response(1, b"def", begin=False, end=False),
        Response(1, b"g", complete=True, begin=False, end=True),
    ]
    assert fragment(Response(1, b"abc"), 3) == [Response(1, b"abc")]
    assert fragment(Response(1, b"", complete=True), 1) == [Response(1, b"", complete=True)]
    assert fragment(RequestStream(1, 4, b"abcd"), 2) == [
        RequestStream(1, 4, b"ab", begin=True, end=False),
        RequestStream(1, 4, b"cd", begin=False, end=True),
    ]
    with pytest.raises(LocalProtocolError):
        fragment(Response(1, b"x"), 0)


def test_server_fragment_response_uses_its_default():
    server = open_server(max_fragment=4)
    frames = server.fragment_response(1, b"0123456789")
    assert [len(f.data) for f in frames] == [4, 4, 2]
    assert server.fragment_response(1, b"0123456789", max_fragment=100) == [
        Response(1, b"0123456789")
    ]


def test_fragmented_response_costs_one_credit():
    client, server = open_pair()
    sid, wire = client.request_stream(b"", 1)
    deliver(server, wire)
    wire = server.send_response(sid, b"x" * 10, max_fragment=3)
    assert len(wire) == 4
    assert server.credits(sid) == 0
    assert deliver(client, wire) == [Response(sid, b"x" * 10)]
    assert client.credits(sid) == 0


def test_server_send_rules_for_fragments():
    server = open_server()
    server.receive_data(tcp(RequestStream(1, 5)) + tcp(RequestResponse(3)))
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"a", begin=False, end=False))  # middle without begin
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"a", begin=False, end=True))  # end without begin
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"a", complete=True, begin=True, end=False))
    server.send(Response(1, b"a", begin=True, end=False))
    assert server.streams[1].phase is Phase.SENDING_FRAGMENTS
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"b"))  # a new whole response in the middle
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, b"b", complete=True, begin=False, end=False))
    server.send(Response(1, b"b", begin=False, end=False))
    server.send(Response(1, b"c", begin=False, end=True))
    assert server.streams[1].phase is Phase.RESPONDING
    # Fragments of different streams interleave freely.
    server.send(Response(3, b"a", begin=True, end=False))
    server.send(Response(1, b"d", begin=True, end=False))
    with pytest.raises(LocalProtocolError) as info:
        server.send(Response(3, b"b", begin=False, end=True))  # RR must end with C
    assert "one RESPONSE with C" in info.value.message
    server.send(Response(3, b"b", complete=True, begin=False, end=True))
    # ERROR may cut a fragmented response short.
    server.send_error(1, "internal", "oops")
    assert server.streams == {}


def test_send_response_is_all_or_nothing():
    server = open_server()
    server.receive_data(tcp(RequestResponse(1)))
    with pytest.raises(LocalProtocolError):
        server.send_response(1, b"x" * 10, max_fragment=3)  # not complete: illegal on RR
    assert server.streams[1].phase is Phase.RESPONDING
    assert len(server.send_response(1, b"x" * 10, complete=True, max_fragment=3)) == 4


@pytest.mark.parametrize("cls", [RequestResponse, RequestFnf, RequestStream, RequestSub])
def test_server_reassembles_fragmented_requests(cls):
    client, server = open_pair(max_fragment=3)
    data = bytes(range(20))
    sid, wire = {
        RequestResponse: lambda: client.request_response(data),
        RequestFnf: lambda: client.request_fnf(data),
        RequestStream: lambda: client.request_stream(data, 2),
        RequestSub: lambda: client.request_sub(data, 2),
    }[cls]()
    assert len(wire) == 7
    for chunk in wire[:-1]:
        assert server.receive_data(chunk) == []
    [request] = server.receive_data(wire[-1])
    assert isinstance(request, cls)
    assert request.data == data
    assert (request.begin, request.end) == (False, False)
    if cls in (RequestStream, RequestSub):
        assert request.initial_n == 2
        assert server.credits(sid) == 2


def test_request_n_during_request_fragments_counts_later():
    server = open_server()
    events = server.receive_data(
        tcp(RequestStream(1, 2, b"a", begin=True))
        + tcp(RequestN(1, 5))
        + tcp(RequestStream(1, 2, b"b", end=True))
    )
    assert events == [RequestStream(1, 2, b"ab")]
    assert server.credits(1) == 7


def test_cancel_during_request_fragments_is_silent():
    server = open_server()
    events = server.receive_data(tcp(RequestResponse(1, b"a", begin=True)) + tcp(Cancel(1)))
    assert events == []
    assert server.streams == {}


@pytest.mark.parametrize(
    "frames,fragment_of_message",
    [
        (
            [RequestResponse(1, b"a", begin=True), RequestStream(1, 1, b"b", end=True)],
            "continues a REQUEST_RESPONSE",
        ),
        (
            [RequestResponse(1, b"a", begin=True), RequestResponse(1, b"b", begin=True)],
            "still receiving a fragmented request",
        ),
        ([RequestResponse(1, b"b", end=True)], "E but no earlier B"),
    ],
)
def test_bad_request_fragment_sequences(frames, fragment_of_message):
    server = open_server()
    events = server.receive_data(b"".join(tcp(f) for f in frames))
    [event] = events
    assert isinstance(event, StreamError) and event.stream_id == 1
    assert fragment_of_message in event.message
    server.send_error(1, event.code, event.message)


def test_too_large_request_is_rejected_and_its_rest_discarded():
    server = open_server(max_message_size=5)
    events = server.receive_data(
        tcp(RequestResponse(1, b"abc", begin=True)) + tcp(RequestResponse(1, b"def"))
    )
    assert events == [StreamError(1, "too_large", events[0].message)]
    assert "max_message_size 5" in events[0].message
    assert server.streams[1].phase is Phase.REJECTED_MID_REQUEST
    server.send_error(1, "too_large", "request too large")
    assert server.streams[1].phase is Phase.DISCARDING
    # The remaining fragments (neither bit, then E) are not mistaken for new requests.
    assert server.receive_data(tcp(RequestResponse(1, b"ghi"))) == []
    assert server.receive_data(tcp(RequestResponse(1, b"j", end=True))) == []
    assert server.streams == {}
    assert server.receive_data(tcp(RequestResponse(1, b"ok"))) == [RequestResponse(1, b"ok")]


def test_rejected_request_fragments_can_end_before_the_error():
    server = open_server(max_message_size=2)
    events = server.receive_data(
        tcp(RequestStream(1, 1, b"abc", begin=True))
        + tcp(RequestStream(1, 1, b"d"))
        + tcp(RequestStream(1, 1, b"e", end=True))
    )
    assert [type(e) for e in events] == [StreamError]
    assert server.streams[1].phase is Phase.REJECTED
    server.send_error(1, "too_large", "x")
    assert server.streams == {}


def test_too_large_fire_and_forget_is_dropped_silently():
    server = open_server(max_message_size=2)
    events = server.receive_data(
        tcp(RequestFnf(1, b"abc", begin=True)) + tcp(RequestFnf(1, b"d", end=True))
    )
    assert events == []
    assert server.streams == {}


def test_exactly_max_message_size_is_accepted():
    server = open_server(max_message_size=4)
    events = server.receive_data(
        tcp(RequestFnf(1, b"ab", begin=True)) + tcp(RequestFnf(1, b"cd", end=True))
    )
    assert events == [RequestFnf(1, b"abcd")]


def test_client_reassembly_limit_abandons_the_stream():
    client, server = open_pair(max_message_size=4)
    sid, wire = client.request_sub(b"", 10)
    deliver(server, wire)
    wire = server.send_response(sid, b"0123456789", max_fragment=3)
    [event] = deliver(client, wire)
    assert isinstance(event, StreamError) and event.code == "too_large"
    assert client.streams[sid].phase is Phase.ABANDONED
    # The application owes a CANCEL; until then the responder's frames are dropped.
    assert deliver(client, server.send_response(sid, b"z")) == []
    cancel = client.cancel(sid)
    assert server.receive_data(cancel) == [Cancel(sid)]
    assert client.streams == {} and server.streams == {}


@pytest.mark.parametrize(
    "frames,text",
    [
        ([Response(1, b"x", begin=False, end=True)], "E but no earlier B"),
        ([Response(1, b"x", complete=True, begin=True, end=False)], "first RESPONSE fragment"),
        (
            [Response(1, b"x", begin=True, end=False), Response(1, b"y", begin=True, end=False)],
            "still receiving",
        ),
        (
            [
                Response(1, b"x", begin=True, end=False),
                Response(1, b"y", complete=True, begin=False, end=False),
            ],
            "before the last",
        ),
    ],
)
def test_client_bad_fragment_sequences(frames, text):
    client, _ = open_pair()
    sid, _ = client.request_stream(b"", 5)
    assert sid == 1
    [event] = client.receive_data(b"".join(tcp(f) for f in frames))
    assert isinstance(event, StreamError) and text in event.message
    assert client.cancel(sid)


def test_client_fragmented_request_sends_all_or_nothing():
    client, _ = open_pair(max_fragment=2)
    sid, wire = client.request_response(b"abcde")
    assert len(wire) == 3
    assert client.is_live(sid)
    with pytest.raises(LocalProtocolError):
        client.send(RequestResponse(sid, b"x", end=True))


def test_client_sends_fragments_by_hand():
    client, server = open_pair()
    sid = client.next_stream_id()
    wire = [client.send(RequestSub(sid, 3, b"ab", begin=True, end=False))]
    assert client.streams[sid].phase is Phase.SENDING_REQUEST
    with pytest.raises(LocalProtocolError):
        client.send(RequestSub(sid, 3, b"x", begin=True, end=False))
    with pytest.raises(LocalProtocolError):
        client.send(RequestStream(sid, 3, b"x", end=True))
    wire.append(client.send(RequestN(sid, 2)))
    wire.append(client.send(RequestSub(sid, 3, b"cd", end=True)))
    assert deliver(server, wire) == [RequestSub(sid, 3, b"abcd")]
    assert server.credits(sid) == 5 == client.credits(sid)


def test_server_may_refuse_a_request_before_its_last_fragment():
    client, server = open_pair(max_message_size=3)
    sid = client.next_stream_id()
    first = client.send(RequestResponse(sid, b"abcd", begin=True))
    [event] = server.receive_data(first)
    err = server.send_error(sid, event.code, event.message)
    assert [type(e).__name__ for e in client.receive_data(err)] == ["ErrorFrame"]
    assert not client.is_live(sid)
    # The client no longer sends the rest; the server would have discarded it.
    with pytest.raises(LocalProtocolError):
        client.send(RequestResponse(sid, b"e", end=True))


def test_reassembly_budget_is_per_connection():
    # Each stream is within max_message_size, but all of them together hold
    # no more than max_reassembly_bytes: past it the new fragment's stream
    # is refused (too_large) and the others go on.
    server = open_server(max_message_size=4, max_reassembly_bytes=6)
    events = server.receive_data(
        tcp(RequestResponse(1, b"abc", begin=True))
        + tcp(RequestResponse(3, b"def", begin=True))
        + tcp(RequestResponse(5, b"g", begin=True))
    )
    assert events == [StreamError(5, "too_large", events[0].message)]
    assert "max_reassembly_bytes 6" in events[0].message
    assert server.reassembly_bytes == 6
    server.send_error(5, "too_large", "x")
    assert server.receive_data(tcp(RequestResponse(1, b"h", end=True))) == [
        RequestResponse(1, b"abch")
    ]
    assert server.reassembly_bytes == 3
    assert server.receive_data(tcp(RequestResponse(7, b"ij", begin=True))) == []
    assert server.reassembly_bytes == 5


def test_one_request_alone_always_fits_the_reassembly_budget():
    server = open_server(max_message_size=4, max_reassembly_bytes=1)
    events = server.receive_data(
        tcp(RequestFnf(1, b"ab", begin=True)) + tcp(RequestFnf(1, b"cd", end=True))
    )
    assert events == [RequestFnf(1, b"abcd")]


def test_connections_share_the_gateway_reassembly_budget():
    # Every connection's fragments draw on one budget, with a share per
    # source address; past it the stream is rejected busy (its remaining
    # fragments are dropped) and what was held goes back as requests
    # complete or are cancelled and when a connection closes.
    budget = ByteBudget(8, per_address=5, what="fragmented requests",
                        setting="reassembly_budget",
                        per_address_setting="reassembly_budget_per_address")
    one, two, other = open_server(), open_server(), open_server()
    one.budget, two.budget = budget.account("10.0.0.1"), budget.account("10.0.0.1")
    other.budget = budget.account("10.0.0.2")
    assert one.receive_data(tcp(RequestResponse(1, b"abc", begin=True))) == []
    events = two.receive_data(tcp(RequestResponse(1, b"def", begin=True)))
    assert events == [StreamError(1, "busy", events[0].message)]
    assert "reassembly_budget_per_address 5; retry later" in events[0].message
    assert two.receive_data(tcp(RequestResponse(1, b"g", end=True))) == []
    assert other.receive_data(tcp(RequestStream(1, 1, b"hijk", begin=True))) == []
    events = other.receive_data(tcp(RequestStream(3, 1, b"lm", begin=True)))
    assert "exceed reassembly_budget 8" in events[0].message
    assert budget.used == 7
    assert one.receive_data(tcp(RequestResponse(1, b"d", end=True))) == [
        RequestResponse(1, b"abcd")
    ]
    other.receive_data(tcp(Cancel(1)))
    assert budget.used == 0
    assert two.receive_data(tcp(RequestFnf(3, b"ab", begin=True))) == []
    assert budget.used == 2
    two.release_budget()
    assert budget.used == 0 and not budget.by_address
