"""MicroMsg2 frames and constants.

One frozen dataclass per thing that crosses the wire.  ``Ack`` is the typed
form of an ``ack``/``batch-ack`` EXTENSION frame: the connection converts
between the two because only it knows the negotiated extension index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TypeAlias

# The listener's name, its settings prefix and the origin of appended events.
PROTOCOL = "micromsg2"
DEFAULT_PORT = 7090

# The version this codec speaks; peers with another minor of major 1 are
# accepted (the lower version is used), any other major is refused.
PROTOCOL_VERSION: tuple[int, int] = (1, 0)
SUPPORTED_MAJOR = 1

# Frame prefix flags.
FLAG_COMMAND = 0x01
FLAG_EXTENSION = 0x02
FLAG_ERROR = 0x04
FLAG_LARGE_PAYLOAD = 0x08
FLAG_CONTINUED = 0x10
TYPE_FLAGS = FLAG_COMMAND | FLAG_EXTENSION | FLAG_ERROR
KNOWN_FLAGS = TYPE_FLAGS | FLAG_LARGE_PAYLOAD | FLAG_CONTINUED

# Sequence numbers run 1..65535 and wrap back to 1 (0 is never used).
SEQ_FIRST = 1
SEQ_LAST = 65535

MAX_IDENTITY_BYTES = 255
MAX_DESTINATION_BYTES = 255
MAX_PROPERTIES_BYTES = 65535
MAX_EXTENSIONS_BYTES = 65535
MAX_SHORT_PAYLOAD = 255  # above this the sender sets LARGE_PAYLOAD
MAX_LARGE_PAYLOAD = 0xFFFFFFFF
MAX_EXTENSIONS = 255  # the EXTENSION frame's id is one byte, 1-based

# The spec asks for several frames above 1 MiB; the receiver's bound on a whole
# (reassembled) payload is separate and configurable.
FRAGMENT_SIZE = 1 << 20
DEFAULT_MAX_PAYLOAD = 16 << 20

# Extensions.
EXT_JSON = "json"
EXT_ACK = "ack"
EXT_BATCH_ACK = "batch-ack"
EXT_PUBSUB = "pubsub"
EXT_AUTH = "x-auth"
SERVER_EXTENSIONS: tuple[str, ...] = (EXT_JSON, EXT_ACK, EXT_BATCH_ACK, EXT_PUBSUB, EXT_AUTH)
BATCH_ACK_MAX_COUNT = "max-count"
DEFAULT_BATCH_ACK_COUNT = 10
# A window of 65535 would make "ack of the last acked number" ambiguous.
MAX_BATCH_ACK_COUNT = SEQ_LAST - 1
AUTH_USER = "user"
AUTH_PASSWORD = "password"

# A MESSAGE property value: Number (N), Date (D, always UTC-aware) or Text (T).
PropertyValue: TypeAlias = int | datetime | str


def _frozen(mapping: Mapping[str, object] | None) -> MappingProxyType[str, object]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class ExtensionSpec:
    """One entry of a handshake extension list: ``name:key=value,key=value``."""

    name: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "properties", _frozen(self.properties))

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)


@dataclass(frozen=True, slots=True)
class Handshake:
    """Client hello, server reply and client final all share this layout."""

    identity: str
    required: tuple[ExtensionSpec, ...] = ()
    optional: tuple[ExtensionSpec, ...] = ()
    major: int = PROTOCOL_VERSION[0]
    minor: int = PROTOCOL_VERSION[1]
    flags: int = 0  # reserved by the spec; carried as received

    @property
    def version(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def extensions(self) -> tuple[ExtensionSpec, ...]:
        return self.required + self.optional


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    destination: str
    payload: bytes = b""
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "properties", _frozen(self.properties))
        if not isinstance(self.payload, bytes):
            object.__setattr__(self, "payload", bytes(self.payload))


@dataclass(frozen=True, slots=True)
class Command:
    """``name;key=value,key=value`` (values URL-encoded on the wire)."""

    name: str
    args: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", _frozen(self.args))


@dataclass(frozen=True, slots=True)
class Extension:
    ext_id: int  # 1-based index into the negotiated extension list
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.payload, bytes):
            object.__setattr__(self, "payload", bytes(self.payload))


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledges every MESSAGE up to and including ``seq`` (across the wrap).

    On receipt ``acked`` lists the sequence numbers this ack released, oldest
    first; it is not part of the wire form.
    """

    seq: int
    acked: tuple[int, ...] = field(default=(), compare=False, repr=False)


_CODE_PREFIX = re.compile(r"([a-z][a-z_]*): ")


@dataclass(frozen=True, slots=True)
class Error:
    """ERROR frame: payload is a UTF-8 message.  polyport writes it as
    ``<canonical code>: <text>`` so clients can branch on the code."""

    message: str

    @classmethod
    def from_code(cls, code: str, text: str) -> Error:
        return cls(f"{code}: {text}")

    @property
    def code(self) -> str | None:
        m = _CODE_PREFIX.match(self.message)
        return m.group(1) if m else None

    @property
    def text(self) -> str:
        m = _CODE_PREFIX.match(self.message)
        return self.message[m.end() :] if m else self.message


Frame: TypeAlias = Handshake | Message | Command | Extension | Ack | Error
