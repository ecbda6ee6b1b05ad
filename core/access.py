"""The trust boundary: what one principal may do with the event store.

Protocol adapters never hold the :class:`~polyport.core.store.EventStore`;
they hold a :class:`Tenant`, made by the gateway's
:class:`~polyport.protocols.session.SessionContext` (``login``, ``anonymous``,
``tenant_for_user``) for the connection's principal.  Every method that touches
tenant data checks the principal here, in core, before any storage is
touched, so no adapter can forget the check.  The operator's own tools (CLI,
admin API, pipeline) use the store directly: they act for the operator.

Durable subscription and consumer-group names are scoped by context: the key
is (context, name), however a protocol spells it, so two tenants may use the
same name and never meet.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from polyport.core.commands import (
    Append,
    AppendBatch,
    AppendResult,
    Principal,
    ReadSegment,
    ReadStream,
    SegmentChunk,
    Selector,
    Start,
    Subscribe,
)
from polyport.core.errors import Forbidden
from polyport.core.events import RecordedEvent
from polyport.core.limits import durable_owner

if TYPE_CHECKING:
    from polyport.core.binders import BinderQuery
    from polyport.core.groups import GroupMember
    from polyport.core.store import EventStore, FetchSubscription
    from polyport.core.subscriptions import Subscription


def _who(principal: Principal) -> str:
    return f"user {principal.user!r}" if principal.user else "anonymous"


class Tenant:
    """The event store as one principal may use it."""

    # Weakly referenced by the connection that logged in (re-checked when the
    # user's rights change: see :meth:`narrow`).
    __slots__ = ("__weakref__", "_store", "principal")

    def __init__(self, store: EventStore, principal: Principal) -> None:
        self._store = store
        self.principal = principal

    # --- the check ----------------------------------------------------------

    def check(self, context: str) -> str:
        """``context`` if the principal may use it, else :class:`Forbidden`."""
        if not self.principal.may_use(context):
            raise Forbidden(f"{_who(self.principal)} may not use context {context!r}")
        return context

    def context(self, requested: str | None = None) -> str:
        """The context a request acts in: the one it names, else the
        principal's default; checked either way."""
        return self.check(requested or self.principal.default_context)

    def _check_all(self, contexts: Iterable[str]) -> None:
        for c in contexts:
            self.check(c)

    def _check_selector(self, selector: Selector) -> None:
        if selector.context is None:
            if self.principal.contexts is not None:
                raise Forbidden(
                    f"{_who(self.principal)} may not subscribe to every context; name one"
                )
            return
        self.check(selector.context)

    # --- rights that changed while the connection is open -------------------

    def narrow(self, principal: Principal, selectors: Iterable[Selector]) -> bool:
        """Serve every later request as ``principal`` (the same user, with
        the rights it has now), if the open subscriptions' ``selectors``
        stay within them; False (and nothing changed) when one does not:
        a live subscription cannot be narrowed, only ended with its
        connection."""
        if principal.user != self.principal.user:
            return False
        for selector in selectors:
            if selector.context is None:
                if principal.contexts is not None:
                    return False
            elif not principal.may_use(selector.context):
                return False
        self.principal = principal
        return True

    # --- appends and reads --------------------------------------------------

    async def append(self, command: Append) -> AppendResult:
        self.check(command.context)
        return await self._store.append(command)

    def start_append(self, command: Append) -> asyncio.Future[list[AppendResult]]:
        """:meth:`append` queued now, its outcome in the future (the
        writer's: one result per append).  Refusals raise here."""
        self.check(command.context)
        return self._store.start_append(command)

    async def append_batch(self, command: AppendBatch) -> list[AppendResult]:
        # All or nothing: one forbidden context refuses the whole transaction.
        self._check_all(a.context for a in command.appends)
        return await self._store.append_batch(command)

    async def read_stream(self, command: ReadStream) -> list[RecordedEvent]:
        self.check(command.context)
        return await self._store.read_stream(command)

    async def stream_state(self, context: str, stream: str) -> tuple[int, int] | None:
        self.check(context)
        return await self._store.stream_state(context, stream)

    async def read_segment(self, command: ReadSegment) -> SegmentChunk:
        self.check(command.context)
        return await self._store.read_segment(command)

    async def producer_ack_level(self, producer_id: uuid.UUID, context: str, stream: str) -> int:
        self.check(context)
        return await self._store.producer_ack_level(producer_id, context, stream)

    # --- subscriptions ------------------------------------------------------

    async def subscribe(
        self, command: Subscribe, *, credit: bool = False
    ) -> Subscription | GroupMember:
        self._check_selector(command.selector)
        return await self._store.subscribe(command, credit=credit,
                                           owner=durable_owner(self.principal.user))

    async def register_fetch_subscription(
        self, name: str, selector: Selector, start: Start
    ) -> FetchSubscription:
        self._check_selector(selector)
        return await self._store.register_fetch_subscription(
            name, selector, start, owner=durable_owner(self.principal.user))

    async def _own(self, sub_id: int) -> FetchSubscription:
        sub = await self._store.get_fetch_subscription(sub_id)
        self._check_owned(sub)
        return sub

    def _check_owned(self, sub: FetchSubscription) -> None:
        # A durable id is a small integer anyone can guess: it must belong to
        # a context this principal may use, and (for a row from before names
        # were scoped, whose selector names no context) select only there.
        selected = sub.selector.context
        if not self.principal.may_use(sub.context) or (
            selected is None and self.principal.contexts is not None
        ) or (selected is not None and not self.principal.may_use(selected)):
            raise Forbidden(f"{_who(self.principal)} may not use subscription {sub.id}")

    async def fetch_subscription(self, sub_id: int) -> FetchSubscription:
        """The fetch subscription ``sub_id``: NotFound when there is none,
        Forbidden when its context is not the principal's."""
        return await self._own(sub_id)

    async def fetch_subscription_id(self, context: str, name: str) -> int | None:
        """The id of the durable subscription ``name`` in ``context``, if the
        principal may use that context."""
        self.check(context)
        return await self._store.subscription_id(context, name)


    async def fetch(self, sub_id: int, suggested_count: int, **kw: Any) -> list[RecordedEvent]:
        # Checked on the row the fetch reads anyway, before it reads or
        # records anything: one round trip less per FE of an FE/PS loop.
        return await self._store.fetch(sub_id, suggested_count, allowed=self._check_owned, **kw)

    async def progress(self, sub_id: int, last_event_time: datetime) -> bool:
        # The ownership rule rides on the statement (only this principal's
        # contexts move); the row is read to tell why only when nothing
        # moved: NotFound, Forbidden, or a PS that names no batch (False).
        return await self._store.progress(sub_id, last_event_time,
                                          contexts=self.principal.contexts,
                                          allowed=self._check_owned)

    async def seek(self, sub_id: int, start: Start) -> int:
        await self._own(sub_id)
        return await self._store.seek(sub_id, start)

    # --- binders ------------------------------------------------------------

    async def query(self, binder: str, matcher: dict[str, Any]) -> BinderQuery:
        spec = await self._store.binders.get(binder)
        self.check(spec.context)
        return await self._store.query(binder, matcher)
