"""Structural limits on what a client may hand the core, checked at admission.

Every protocol's appends reach :meth:`core.writer.Writer.submit`, which calls
:func:`check_appends` before anything is queued: a name, header set or body
that would cost the store disproportionately (a name too long for the unique
index, a body nested deep enough to exhaust the recursion of every decoder
downstream) is refused there, for that append alone, with a message naming
the limit.  ``docs/operations.md`` ("Limits") lists each one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyport.core.bodies import body_depth_exceeds
from polyport.core.errors import Malformed, TooLarge

if TYPE_CHECKING:
    from polyport.core.commands import Append, Selector


@dataclass(frozen=True, slots=True)
class EventLimits:
    # Context, stream name, event type and content type, in UTF-8 bytes.
    # PostgreSQL's btree entries top out near 2.7 KB: a longer stream name
    # would fail the unique index inside the group commit instead of here.
    max_name_bytes: int = 256
    max_headers: int = 64
    max_header_name_bytes: int = 256
    max_header_value_bytes: int = 4096
    # Nesting of documents and arrays in JSON, BSON and MessagePack bodies
    # (the top-level document is level 1).
    max_body_depth: int = 64


@dataclass(frozen=True, slots=True)
class MatcherLimits:
    # Nesting of documents and arrays in a matcher (``{"a": 1}`` is level 1).
    max_depth: int = 32
    # Documents, arrays and values in a matcher, all counted.
    max_nodes: int = 1000
    # The matcher as (relaxed Extended) JSON text.
    max_bytes: int = 64 << 10


@dataclass(frozen=True, slots=True)
class DurableLimits:
    """Durable subscription and consumer-group names, checked by the store
    wherever one is made or looked up (every protocol, the admin API too)."""

    # A durable name in UTF-8 bytes.  Res01 composes its names from the
    # subscriber id, context and filter, MicroMsg2 from the destination and
    # filter: they need more room than a stream name.  With a context of at
    # most max_name_bytes the (context, name) key stays far below
    # PostgreSQL's btree entry limit (about 2.7 KB), which a longer name
    # used to hit as an internal error.
    max_name_bytes: int = 1024
    # Durable subscriptions (rows) one context may hold, 0 = no limit.  The
    # names are the clients' to choose: without a bound one principal,
    # anonymous included, could fill the table.  Counted per context (the
    # tenant), under a lock, so concurrent creations cannot pass it.
    max_per_context: int = 1000
    # And those one principal may create, over every context it may use (0 =
    # no limit): a user allowed every context, or many, is bounded too.  The
    # anonymous principal is one principal.  Rows record who created them.
    max_per_principal: int = 1000


DEFAULT_MATCHER_LIMITS = MatcherLimits()


def check_appends(
    appends: Sequence[Append], limits: EventLimits, max_event_bytes: int
) -> tuple[int, int]:
    """Refuse a submission that breaks a limit; else return (body bytes, cost)
    where cost adds header names and values and names to the bodies: what
    the writer's memory budget counts.  Raises :class:`Malformed` or
    :class:`TooLarge` naming the limit."""
    n = sum(len(a.events) for a in appends)
    bodies = names = 0
    if n > 1:
        check_unique_ids((e.event_id for a in appends for e in a.events), "one append")
    max_name = limits.max_name_bytes
    for a in appends:
        if not a.stream:
            raise Malformed("stream name must not be empty")
        names += _name(a.context, "context", max_name)
        names += _name(a.stream, "stream name", max_name)
        check_text(a.origin, "origin")
        for e in a.events:
            names += _name(e.type, "event type", max_name)
            names += _name(e.content_type, "content type", max_name)
            headers = e.headers
            if headers:
                if len(headers) > limits.max_headers:
                    raise TooLarge(
                        f"{len(headers)} headers exceed the limit of {limits.max_headers} "
                        "(max_headers)"
                    )
                for key, value in headers.items():
                    names += _text_bytes(key, "header name", limits.max_header_name_bytes,
                                        "max_header_name_bytes")
                    names += _text_bytes(value, f"header {key!r}", limits.max_header_value_bytes,
                                        "max_header_value_bytes")
            size = len(e.body)
            check_body_size(size, max_event_bytes)
            if body_depth_exceeds(e.content_type, e.body, limits.max_body_depth):
                raise Malformed(
                    f"event body ({e.content_type}) is nested deeper than "
                    f"{limits.max_body_depth} levels (max_body_depth)"
                )
            bodies += size
    return bodies, bodies + names


def check_body_size(size: int, limit: int, what: str = "event body") -> None:
    """An event body within ``max_event_bytes``: the one check, whether core
    or a protocol's own (smaller or larger) setting asks; ``what`` names the
    event the way the protocol's request does."""
    if size > limit:
        raise TooLarge(f"{what} of {size} bytes exceeds the limit of {limit} bytes")


def check_unique_ids(ids: Iterable[object], where: str) -> None:
    """Each event id is one event's idempotency key: a submission naming
    one twice cannot be stored, and must not reach the shared group commit."""
    seen: set[object] = set()
    for event_id in ids:
        if event_id in seen:
            raise Malformed(f"event id {event_id} appears twice in {where}")
        seen.add(event_id)


def _name(value: str, what: str, limit: int) -> int:
    return _text_bytes(value, what, limit, "max_name_bytes")


def check_name(value: str, what: str, limits: EventLimits) -> None:
    """A context, stream, prefix or type a request names: the rules of
    appended names, so a read or subscription cannot hand PostgreSQL what
    an append could not."""
    _text_bytes(value, what, limits.max_name_bytes, "max_name_bytes")


def check_selector(selector: Selector, limits: EventLimits) -> None:
    if selector.context is not None:
        check_name(selector.context, "context", limits)
    if selector.stream is not None:
        check_name(selector.stream, "stream name", limits)
    if selector.prefix is not None:
        check_name(selector.prefix, "stream prefix", limits)
    for t in selector.types:
        check_name(t, "event type", limits)


def check_durable_name(name: str, limits: DurableLimits) -> None:
    """A durable subscription or consumer-group name, whatever protocol
    spelled it: text, not empty, at most ``max_durable_name_bytes``."""
    if isinstance(name, str) and not name:
        raise Malformed("durable subscription name must not be empty")
    _text_bytes(name, "durable subscription name", limits.max_name_bytes,
                "max_durable_name_bytes")


def durable_principal_quota_exceeded(owner: str, count: int,
                                     limits: DurableLimits) -> TooLarge:
    who = f"user {owner!r}" if owner != ANONYMOUS_OWNER else "the anonymous user"
    return TooLarge(
        f"{who} already created {count} durable subscriptions, the limit "
        f"(max_durable_subscriptions_per_principal = {limits.max_per_principal}); delete "
        "unused ones ('polyport subscriptions delete')"
    )


# The creator recorded for the anonymous principal (a user's name is never
# empty: core.users refuses it).
ANONYMOUS_OWNER = ""


def durable_owner(user: str | None) -> str:
    """The key a principal's durable subscriptions are counted under."""
    return user if user is not None else ANONYMOUS_OWNER


def durable_quota_exceeded(context: str, count: int, limits: DurableLimits) -> TooLarge:
    return TooLarge(
        f"context {context!r} already has {count} durable subscriptions, the limit "
        f"(max_durable_subscriptions = {limits.max_per_context}); delete unused ones "
        "('polyport subscriptions delete')"
    )


def _text_bytes(value: str, what: str, limit: int, setting: str) -> int:
    """Check ``value`` as text and against ``limit`` UTF-8 bytes; return its
    length (in characters: close enough for a memory budget, and free)."""
    check_text(value, what)
    n = len(value)
    # At most 4 bytes per character: only long strings need encoding to measure.
    if n * 4 > limit:
        size = len(value.encode("utf-8"))
        if size > limit:
            shown = value[:40] + "…"
            raise TooLarge(
                f"{what} of {size} bytes (UTF-8) exceeds the limit of {limit} bytes "
                f"({setting}): {shown!r}"
            )
    return n


# Names already found valid.  Contexts, streams, types and content types
# repeat from append to append, so most checks are one set lookup.  Bounded:
# cleared when full.
_VALID_TEXT: set[str] = set()
_VALID_TEXT_MAX = 4096


def check_text(value: str, what: str) -> None:
    """PostgreSQL text cannot hold NUL or unpaired surrogates; refuse them up
    front so they fail their own append rather than the whole group commit."""
    if type(value) is str and value in _VALID_TEXT:
        return
    if not isinstance(value, str):
        raise Malformed(f"{what} must be text")
    if "\x00" in value:
        raise Malformed(f"{what} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Malformed(f"{what} is not valid Unicode (unpaired surrogate)") from None
    if len(_VALID_TEXT) >= _VALID_TEXT_MAX:
        _VALID_TEXT.clear()
    _VALID_TEXT.add(value)
