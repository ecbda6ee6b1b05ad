"""The ``pubsub`` extension: destinations and the subscribe/unsubscribe commands.

    subscribe;destination=<url-encoded destination>[,filter=<url-encoded filter>]
    unsubscribe;destination=<url-encoded destination>

Destinations: ``topic/<stream>`` (every subscriber gets every message) and
``queue/<stream>`` (competing consumers: each message goes to one subscriber).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.errors import UNSUPPORTED
from polyport.protocols.micromsg2.errors import RemoteProtocolError
from polyport.protocols.micromsg2.filters import Filter, parse_filter
from polyport.protocols.micromsg2.frames import Command

TOPIC = "topic"
QUEUE = "queue"
DESTINATION_KINDS = (TOPIC, QUEUE)

CMD_SUBSCRIBE = "subscribe"
CMD_UNSUBSCRIBE = "unsubscribe"
ARG_DESTINATION = "destination"
ARG_FILTER = "filter"


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # TOPIC or QUEUE
    stream: str

    @classmethod
    def parse(cls, text: str) -> Destination:
        kind, slash, stream = text.partition("/")
        if not slash or kind not in DESTINATION_KINDS or not stream:
            raise RemoteProtocolError(
                f"destination {text!r} is not 'topic/<stream>' or 'queue/<stream>'"
            )
        return cls(kind, stream)

    def __str__(self) -> str:
        return f"{self.kind}/{self.stream}"


@dataclass(frozen=True, slots=True)
class Subscribe:
    destination: Destination
    filter: Filter | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Ends every subscription of the connection to ``destination``."""

    destination: Destination


def parse_pubsub_command(cmd: Command) -> Subscribe | Unsubscribe:
    allowed = {CMD_SUBSCRIBE: {ARG_DESTINATION, ARG_FILTER}, CMD_UNSUBSCRIBE: {ARG_DESTINATION}}
    if cmd.name not in allowed:
        raise RemoteProtocolError(f"unknown command {cmd.name!r}", code=UNSUPPORTED)
    unknown = sorted(set(cmd.args) - allowed[cmd.name])
    if unknown:
        raise RemoteProtocolError(f"{cmd.name}: unknown argument(s) {', '.join(unknown)}")
    raw = cmd.args.get(ARG_DESTINATION)
    if raw is None:
        raise RemoteProtocolError(f"{cmd.name} needs destination=")
    destination = Destination.parse(raw)
    if cmd.name == CMD_UNSUBSCRIBE:
        return Unsubscribe(destination)
    text = cmd.args.get(ARG_FILTER)
    return Subscribe(destination, parse_filter(text) if text else None)


def to_command(request: Subscribe | Unsubscribe) -> Command:
    args = {ARG_DESTINATION: str(request.destination)}
    if isinstance(request, Unsubscribe):
        return Command(CMD_UNSUBSCRIBE, args)
    if request.filter is not None and request.filter.conditions:
        args[ARG_FILTER] = str(request.filter)
    return Command(CMD_SUBSCRIBE, args)
