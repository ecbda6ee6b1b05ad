"""Handshake negotiation: extension lists, versions and the negotiated result.

Extension list grammar: ``name[:key=value[,key=value...]]`` entries separated
by ``;`` (a trailing ``;`` and empty entries are tolerated); names and keys are
FIELDs, values URL-encoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from polyport.protocols.errors import UNSUPPORTED
from polyport.protocols.micromsg2.errors import RemoteProtocolError
from polyport.protocols.micromsg2.frames import (
    AUTH_PASSWORD,
    AUTH_USER,
    BATCH_ACK_MAX_COUNT,
    DEFAULT_BATCH_ACK_COUNT,
    EXT_ACK,
    EXT_AUTH,
    EXT_BATCH_ACK,
    MAX_BATCH_ACK_COUNT,
    MAX_EXTENSIONS,
    SUPPORTED_MAJOR,
    ExtensionSpec,
    Handshake,
)
from polyport.protocols.micromsg2.text import check_field, url_decode, url_encode

_COUNT = re.compile(r"[0-9]{1,5}")

# At most one ack flavour per connection: they would disagree on the window.
_ACK_EXTENSIONS = (EXT_ACK, EXT_BATCH_ACK)


# --- extension lists -------------------------------------------------------------


def parse_extension(text: str) -> ExtensionSpec:
    name, sep, props_text = text.partition(":")
    check_field(name, "extension name")
    props: dict[str, str] = {}
    if sep and props_text:
        for item in props_text.split(","):
            key, eq, value = item.partition("=")
            if not eq:
                raise RemoteProtocolError(
                    f"extension {name!r}: property {item!r} is not 'key=value'"
                )
            check_field(key, f"extension {name!r} property name")
            if key in props:
                raise RemoteProtocolError(f"extension {name!r}: property {key!r} appears twice")
            props[key] = url_decode(value, f"extension {name!r} property {key!r}")
    return ExtensionSpec(name, props)


def parse_extensions(text: str) -> tuple[ExtensionSpec, ...]:
    return tuple(parse_extension(item) for item in text.split(";") if item)


def format_extension(spec: ExtensionSpec) -> str:
    check_field(spec.name, "extension name")
    if not spec.properties:
        return spec.name
    props = ",".join(
        f"{check_field(k, 'extension property name')}={url_encode(v)}"
        for k, v in spec.properties.items()
    )
    return f"{spec.name}:{props}"


def format_extensions(specs: Iterable[ExtensionSpec]) -> str:
    return ";".join(format_extension(s) for s in specs)


def as_spec(item: str | ExtensionSpec) -> ExtensionSpec:
    return item if isinstance(item, ExtensionSpec) else parse_extension(item)


def _names(specs: Iterable[ExtensionSpec]) -> list[str]:
    return [s.name for s in specs]


# --- result ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NegotiatedExtension:
    index: int  # 1-based, the id EXTENSION frames carry
    name: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))


@dataclass(frozen=True, slots=True)
class Negotiated:
    version: tuple[int, int]
    peer_identity: str
    extensions: tuple[NegotiatedExtension, ...]
    # Messages in flight per direction before an ack is needed; None = no acks.
    ack_window: int | None

    def extension(self, name: str) -> NegotiatedExtension | None:
        return next((e for e in self.extensions if e.name == name), None)

    def has(self, name: str) -> bool:
        return self.extension(name) is not None

    def by_index(self, index: int) -> NegotiatedExtension | None:
        return self.extensions[index - 1] if 1 <= index <= len(self.extensions) else None

    @property
    def ack_index(self) -> int | None:
        ext = next((e for e in self.extensions if e.name in _ACK_EXTENSIONS), None)
        return ext.index if ext else None

    @property
    def credentials(self) -> tuple[str, str | None] | None:
        """``(user, password)`` from ``x-auth``, or None without it."""
        ext = self.extension(EXT_AUTH)
        if ext is None:
            return None
        return ext.properties[AUTH_USER], ext.properties.get(AUTH_PASSWORD)


def _batch_window(spec: ExtensionSpec) -> int:
    raw = spec.get(BATCH_ACK_MAX_COUNT)
    if raw is None:
        return DEFAULT_BATCH_ACK_COUNT
    if not _COUNT.fullmatch(raw) or not 1 <= int(raw) <= MAX_BATCH_ACK_COUNT:
        raise RemoteProtocolError(
            f"batch-ack max-count must be an integer in 1..{MAX_BATCH_ACK_COUNT}, got {raw!r}"
        )
    return int(raw)


def build_negotiated(version: tuple[int, int], peer_identity: str, final: Handshake) -> Negotiated:
    """Index the final handshake's extensions (required, then optional) and
    check the per-extension rules."""
    specs = final.extensions
    names = _names(specs)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RemoteProtocolError(
            f"extension(s) listed twice in the final handshake: {', '.join(dupes)}"
        )
    if len(specs) > MAX_EXTENSIONS:
        raise RemoteProtocolError(
            f"{len(specs)} extensions; an EXTENSION frame id allows {MAX_EXTENSIONS}"
        )
    window: int | None = None
    acks = [s for s in specs if s.name in _ACK_EXTENSIONS]
    if len(acks) > 1:
        raise RemoteProtocolError("'ack' and 'batch-ack' cannot both be used on one connection")
    if acks:
        window = 1 if acks[0].name == EXT_ACK else _batch_window(acks[0])
    auth = next((s for s in specs if s.name == EXT_AUTH), None)
    if auth is not None and not auth.get(AUTH_USER):
        raise RemoteProtocolError("x-auth needs 'user=' (and usually 'password=')")
    return Negotiated(
        version=version,
        peer_identity=peer_identity,
        extensions=tuple(
            NegotiatedExtension(i, s.name, s.properties) for i, s in enumerate(specs, start=1)
        ),
        ack_window=window,
    )


# --- versions ----------------------------------------------------------------------


def negotiate_version(mine: tuple[int, int], theirs: tuple[int, int]) -> tuple[int, int]:
    """The lower version is used; this codec speaks only major 1."""
    version = min(mine, theirs)
    if version[0] != SUPPORTED_MAJOR:
        raise RemoteProtocolError(
            f"protocol version {version[0]}.{version[1]} is not supported "
            f"(this side speaks {SUPPORTED_MAJOR}.x)",
            code=UNSUPPORTED,
        )
    return version


# --- server side -------------------------------------------------------------------


def check_hello(hello: Handshake, supported: Mapping[str, ExtensionSpec]) -> None:
    missing = [n for n in _names(hello.required) if n not in supported]
    if missing:
        raise RemoteProtocolError(
            f"server does not support required extension(s): {', '.join(missing)}",
            code=UNSUPPORTED,
        )


def server_reply(
    identity: str,
    version: tuple[int, int],
    hello: Handshake,
    supported: Mapping[str, ExtensionSpec],
    required: tuple[ExtensionSpec, ...],
) -> Handshake:
    """Require what the server requires; suggest every other supported extension."""
    taken = set(_names(required)) | set(_names(hello.required))
    optional = tuple(spec for name, spec in supported.items() if name not in taken)
    return Handshake(identity, required, optional, major=version[0], minor=version[1])


def check_final(
    final: Handshake,
    hello: Handshake,
    negotiated_version: tuple[int, int],
    supported: Mapping[str, ExtensionSpec],
    required: tuple[ExtensionSpec, ...],
) -> Negotiated:
    if final.version not in (hello.version, negotiated_version):
        raise RemoteProtocolError(
            f"final handshake has version {final.major}.{final.minor}; expected "
            f"{hello.major}.{hello.minor} or {negotiated_version[0]}.{negotiated_version[1]}"
        )
    names = set(_names(final.extensions))
    refused = [n for n in _names(required) if n not in names]
    if refused:
        raise RemoteProtocolError(
            f"client did not accept required extension(s): {', '.join(refused)}",
            code=UNSUPPORTED,
        )
    unknown = [n for n in _names(final.extensions) if n not in supported]
    if unknown:
        raise RemoteProtocolError(
            f"server does not support extension(s): {', '.join(unknown)}", code=UNSUPPORTED
        )
    return build_negotiated(negotiated_version, hello.identity, final)


# --- client side -------------------------------------------------------------------


def check_reply(hello: Handshake, reply: Handshake, supported: Iterable[str]) -> None:
    names = set(supported) | set(_names(hello.extensions))
    missing = [n for n in _names(reply.required) if n not in names]
    if missing:
        raise RemoteProtocolError(
            f"client does not support extension(s) required by the server: {', '.join(missing)}",
            code=UNSUPPORTED,
        )
    if all(n in _names(hello.required + reply.required) for n in _ACK_EXTENSIONS):
        raise RemoteProtocolError(
            "'ack' and 'batch-ack' are both required; only one can be used", code=UNSUPPORTED
        )


def client_final(hello: Handshake, reply: Handshake, supported: Iterable[str]) -> Handshake:
    """The extensions to use: the client's required ones, the server's required
    ones, then the optional ones both sides want or the client can accept.  The
    client's own properties win over the server's for the same extension."""
    mine = {s.name: s for s in hello.extensions}
    supported_names = set(supported) | set(mine)
    offered = set(_names(reply.extensions))

    chosen: list[str] = []
    required: list[ExtensionSpec] = []
    optional: list[ExtensionSpec] = []

    def take(spec: ExtensionSpec, into: list[ExtensionSpec]) -> None:
        if spec.name in chosen:
            return
        if spec.name in _ACK_EXTENSIONS and any(n in _ACK_EXTENSIONS for n in chosen):
            return  # the earlier ack flavour wins (check_reply refused two required ones)
        chosen.append(spec.name)
        into.append(mine.get(spec.name, spec))

    for spec in hello.required:
        take(spec, required)
    for spec in reply.required:
        take(spec, required)
    for spec in hello.optional:
        if spec.name in offered:
            take(spec, optional)
    for spec in reply.optional:
        if spec.name in supported_names:
            take(spec, optional)
    return Handshake(
        hello.identity, tuple(required), tuple(optional), major=hello.major, minor=hello.minor
    )
