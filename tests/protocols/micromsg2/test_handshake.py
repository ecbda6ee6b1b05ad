"""Handshake negotiation: versions, required/optional extensions, indexes."""

from __future__ import annotations

import pytest

from polyport.protocols.micromsg2 import (
    ClientConnection,
    Error,
    ExtensionSpec,
    Handshake,
    ProtocolError,
    ServerConnection,
    State,
    encode_handshake,
    error_frame,
)

from ._support import open_pair, run_handshake


def _names(specs: tuple[ExtensionSpec, ...]) -> list[str]:
    return [s.name for s in specs]


@pytest.mark.parametrize("client_version", [(1, 0), (1, 5), (2, 0), (7, 3)])
def test_lowest_version_is_used(client_version: tuple[int, int]) -> None:
    server = ServerConnection("srv")
    client = ClientConnection("cli", version=client_version)
    run_handshake(server, client)
    assert server.negotiated is not None and client.negotiated is not None
    assert server.negotiated.version == client.negotiated.version == (1, 0)


def test_server_refuses_a_lower_version_it_does_not_speak() -> None:
    server = ServerConnection("srv")
    with pytest.raises(ProtocolError, match=r"0\.9 is not supported") as info:
        server.receive_data(encode_handshake(Handshake("old", major=0, minor=9)))
    assert info.value.code == "unsupported"
    assert server.state is State.CLOSED
    # The spec: send an ERROR frame, then disconnect.
    data = server.send(error_frame(info.value))
    assert data[0] == 0x04 and b"unsupported: protocol version 0.9" in data


def test_client_refuses_a_server_version_it_does_not_speak() -> None:
    client = ClientConnection("cli")
    client.send(client.hello_frame())
    with pytest.raises(ProtocolError, match="not supported"):
        client.receive_data(encode_handshake(Handshake("srv", major=0, minor=1)))
    assert client.state is State.CLOSED


def test_final_may_repeat_the_hello_version_or_use_the_negotiated_one() -> None:
    for final_version in ((2, 0), (1, 0)):
        server = ServerConnection("srv")
        server.receive_data(encode_handshake(Handshake("c", major=2, minor=0)))
        server.send(server.reply_frame())
        server.receive_data(encode_handshake(Handshake("c", major=final_version[0], minor=0)))
        assert server.negotiated is not None and server.negotiated.version == (1, 0)

    server = ServerConnection("srv")
    server.receive_data(encode_handshake(Handshake("c", major=1, minor=5)))
    server.send(server.reply_frame())
    with pytest.raises(ProtocolError, match=r"final handshake has version 1.7"):
        server.receive_data(encode_handshake(Handshake("c", major=1, minor=7)))


def test_server_refuses_unsupported_required_extension() -> None:
    server = ServerConnection("srv")
    client = ClientConnection("cli", ["json", "dotnet"])
    with pytest.raises(ProtocolError, match=r"does not support required extension.*dotnet") as info:
        server.receive_data(client.send(client.hello_frame()))
    assert info.value.code == "unsupported"
    # The client gets the ERROR frame instead of a reply and is done.
    frames = client.receive_data(server.send(error_frame(info.value)))
    assert frames == [Error("unsupported: server does not support required extension(s): dotnet")]
    assert client.state is State.CLOSED


def test_client_refuses_extension_the_server_requires() -> None:
    server = ServerConnection("srv", required_extensions=["x-auth"])
    client = ClientConnection("cli", ["json"])
    server.receive_data(client.send(client.hello_frame()))
    reply = server.send(server.reply_frame())
    with pytest.raises(ProtocolError, match="required by the server: x-auth"):
        client.receive_data(reply)
    [err] = server.receive_data(client.send(Error("unsupported: x-auth")))
    assert isinstance(err, Error) and server.state is State.CLOSED


def test_spec_negotiation_walkthrough() -> None:
    # 1. Client: I require A, B and suggest X, Y.  2. Server: I support A, B,
    # but also require C; I suggest Y like you but also Z.  3. Client: I
    # support C and we'll use the optional Y and Z.
    server = ServerConnection("srv", ["a", "b", "y", "z"], ["c"])
    client = ClientConnection("cli", ["a", "b"], ["x", "y"], supported=["c", "z"])
    server.receive_data(client.send(client.hello_frame()))
    reply = server.reply_frame()
    assert _names(reply.required) == ["c"]
    assert _names(reply.optional) == ["y", "z"]
    client.receive_data(server.send(reply))
    final = client.final_frame()
    assert _names(final.required) == ["a", "b", "c"]
    assert _names(final.optional) == ["y", "z"]
    server.receive_data(client.send(final))
    for conn in (server, client):
        assert conn.negotiated is not None
        assert [(e.index, e.name) for e in conn.negotiated.extensions] == [
            (1, "a"),
            (2, "b"),
            (3, "c"),
            (4, "y"),
            (5, "z"),
        ]


def test_optional_frames_example() -> None:
    # Client: json;xml;protobuf  Server: json;ack;batch-ack  Client: json
    server = ServerConnection("srv", ["json", "ack", "batch-ack"])
    client = ClientConnection("cli", optional=["json", "xml", "protobuf"])
    server.receive_data(client.send(client.hello_frame()))
    reply = server.reply_frame()
    assert _names(reply.optional) == ["json", "ack", "batch-ack"]
    client.receive_data(server.send(reply))
    final = client.final_frame()
    assert final.required == () and _names(final.optional) == ["json"]
    server.receive_data(client.send(final))
    assert server.negotiated is not None and server.negotiated.ack_window is None


def test_default_server_extensions() -> None:
    server, _client = open_pair(optional=["json", "pubsub"])
    assert server.supported.keys() == {"json", "ack", "batch-ack", "pubsub", "x-auth"}
    assert server.negotiated is not None
    assert [e.name for e in server.negotiated.extensions] == ["json", "pubsub"]


def test_x_auth_credentials_from_the_final_handshake() -> None:
    server, client = open_pair(
        server_required=["x-auth"],
        optional=[ExtensionSpec("x-auth", {"user": "jonas", "password": "p@ss;w,rd=1"})],
    )
    assert server.reply is not None and _names(server.reply.required) == ["x-auth"]
    assert server.negotiated is not None and client.negotiated is not None
    assert server.negotiated.credentials == ("jonas", "p@ss;w,rd=1")
    assert server.negotiated.extensions[0].name == "x-auth"  # moved to required
    assert client.negotiated.credentials == server.negotiated.credentials


def test_x_auth_url_encoded_on_the_wire() -> None:
    spec = ExtensionSpec("x-auth", {"user": "a b", "password": "p%;"})
    wire = encode_handshake(Handshake("c", (spec,)))
    assert b"x-auth:user=a%20b,password=p%25%3B" in wire


def test_x_auth_without_user_is_refused() -> None:
    with pytest.raises(ProtocolError, match="x-auth needs 'user='"):
        open_pair(required=[ExtensionSpec("x-auth", {"password": "p"})])


@pytest.mark.parametrize(
    ("spec", "window"),
    [("ack", 1), ("batch-ack", 10), ("batch-ack:max-count=100", 100), ("batch-ack:max-count=1", 1)],
)
def test_ack_window_from_negotiation(spec: str, window: int) -> None:
    server, client = open_pair(required=[spec])
    assert server.negotiated is not None and client.negotiated is not None
    assert server.negotiated.ack_window == client.negotiated.ack_window == window
    assert server.outbound.size == server.inbound.size == window


# The last is a fullwidth digit one, on purpose.
@pytest.mark.parametrize("count", ["0", "abc", "65535", "", "-1", "１"])  # noqa: RUF001
def test_bad_batch_ack_count(count: str) -> None:
    with pytest.raises(ProtocolError, match="max-count"):
        open_pair(required=[ExtensionSpec("batch-ack", {"max-count": count})])


def test_spec_batch_ack_colon_typo_is_a_clear_error() -> None:
    # The spec's "batch-ack:max-count:100" is not key=value.
    with pytest.raises(ProtocolError, match="is not 'key=value'"):
        ClientConnection("c", ["batch-ack:max-count:100"])


def test_client_keeps_one_ack_flavour() -> None:
    server, _client = open_pair(optional=["ack", "batch-ack"])
    assert server.negotiated is not None
    assert [e.name for e in server.negotiated.extensions] == ["ack"]
    assert server.negotiated.ack_window == 1


def test_both_ack_flavours_required_is_refused() -> None:
    server = ServerConnection("srv", required_extensions=["batch-ack"])
    client = ClientConnection("c", ["ack"], supported=["batch-ack"])
    server.receive_data(client.send(client.hello_frame()))
    with pytest.raises(ProtocolError, match="only one can be used"):
        client.receive_data(server.send(server.reply_frame()))


def _server_awaiting_final(**kwargs: object) -> ServerConnection:
    server = ServerConnection("srv", **kwargs)  # type: ignore[arg-type]
    server.receive_data(encode_handshake(Handshake("c")))
    server.send(server.reply_frame())
    return server


@pytest.mark.parametrize(
    ("final", "message"),
    [
        (Handshake("c", (ExtensionSpec("json"), ExtensionSpec("json"))), "listed twice"),
        (Handshake("c", optional=(ExtensionSpec("dotnet"),)), "does not support extension.*dotnet"),
        (Handshake("c", (ExtensionSpec("ack"), ExtensionSpec("batch-ack"))), "cannot both"),
        (
            Handshake("c", tuple(ExtensionSpec(f"e{i}") for i in range(256))),
            "EXTENSION frame id allows 255",
        ),
    ],
)
def test_server_checks_the_final(final: Handshake, message: str) -> None:
    supported = ["json", "ack", "batch-ack", *(f"e{i}" for i in range(256))]
    server = _server_awaiting_final(supported_extensions=supported)
    with pytest.raises(ProtocolError, match=message):
        server.receive_data(encode_handshake(final))
    assert server.state is State.CLOSED


def test_final_without_server_required_extension() -> None:
    server = _server_awaiting_final(required_extensions=["pubsub"])
    with pytest.raises(ProtocolError, match=r"did not accept required extension.*pubsub"):
        server.receive_data(encode_handshake(Handshake("c", (ExtensionSpec("json"),))))


def test_client_will_not_send_a_final_missing_server_requirements() -> None:
    server = ServerConnection("srv", required_extensions=["pubsub"])
    client = ClientConnection("c", supported=["pubsub"])
    server.receive_data(client.send(client.hello_frame()))
    client.receive_data(server.send(server.reply_frame()))
    with pytest.raises(ProtocolError, match="leaves out"):
        client.send(Handshake("c"))
    assert client.state is State.REPLY_RECEIVED  # a local mistake changes nothing
    client.send(client.final_frame())
    assert client.state is State.OPEN


def test_required_extension_is_supported_implicitly() -> None:
    server = ServerConnection("srv", ["json"], ["x-special:mode=fast"])
    assert server.supported["x-special"].properties == {"mode": "fast"}


def test_server_sends_error_instead_of_final_reply() -> None:
    server = _server_awaiting_final()
    [err] = server.receive_data(b"\x04\x05nope!")
    assert err == Error("nope!") and server.state is State.CLOSED
    with pytest.raises(ProtocolError, match="closed"):
        server.receive_data(b"")


def test_handshake_flags_byte_is_carried() -> None:
    server = ServerConnection("srv")
    [hello] = server.receive_data(encode_handshake(Handshake("c", flags=0x80)))
    assert isinstance(hello, Handshake) and hello.flags == 0x80


def test_frame_builders_need_the_right_state() -> None:
    with pytest.raises(ProtocolError, match="no client hello"):
        ServerConnection("srv").reply_frame()
    with pytest.raises(ProtocolError, match="no server reply"):
        ClientConnection("c").final_frame()


@pytest.mark.parametrize(
    "text",
    ["JSON!", "a b", "json:", "batch-ack:=3", "x:k=%ff", "é"],
)
def test_malformed_extension_lists(text: str) -> None:
    raw = text.encode()
    wire = b"\x01\x00\x00\x01c" + len(raw).to_bytes(2, "big") + raw + b"\x00\x00"
    server = ServerConnection("srv", ["json"])
    if text == "json:":  # an empty property list is just the name
        [hello] = server.receive_data(wire)
        assert isinstance(hello, Handshake) and hello.required == (ExtensionSpec("json"),)
        return
    with pytest.raises(ProtocolError):
        server.receive_data(wire)
