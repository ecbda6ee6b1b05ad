"""Open connections follow their user's rights as they change.

A connection keeps the principal it logged in with.  When an operator
removes a user or changes its contexts (CLI ``polyport users …``, in any
process, or the admin API), :class:`~polyport.core.users.UserService`
sends ``NOTIFY polyport_users``; every gateway process listens
(:class:`~polyport.core.users.UserChanges`) and re-checks that user's
open connections here:

- the user is gone: each connection ends in its protocol's error form
  (``unauthenticated``), or is closed where the protocol has none;
- its rights changed: each connection's tenants are narrowed in place
  (the next request is checked against the new contexts), unless an open
  subscription reads a context the user may no longer use: that connection
  ends with ``forbidden`` (a live subscription cannot be narrowed).

The decision itself (whether the new principal covers the open
subscriptions) is core's: :meth:`~polyport.core.access.Tenant.narrow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from polyport.core.commands import Principal
from polyport.core.users import UserService
from polyport.protocols.connections import RIGHTS_REVOKED, Connection, ConnectionTable

log = logging.getLogger("polyport.rights")

# How long a session may take to send its error form before the transport
# is closed under it.
REVOKE_TIMEOUT = 2.0


async def recheck(table: ConnectionTable, users: UserService, name: str | None) -> int:
    """Narrow or end the open connections of user ``name`` (None: of every
    user) to the rights the users table holds now; how many were ended."""
    affected = [
        c for c in table.list() if c.user is not None and (name is None or c.user == name)
    ]
    now: dict[str, Principal | None] = {}
    for user in {c.user for c in affected if c.user is not None}:
        now[user] = await users.current(user)
    ended = []
    for conn in affected:
        assert conn.user is not None
        why = _revoked(conn, now[conn.user])
        if why is not None:
            ended.append(_end(table, conn, *why))
    if ended:
        await asyncio.gather(*ended)
    return len(ended)


def _revoked(conn: Connection, principal: Principal | None) -> tuple[str, str] | None:
    """(code, message) when ``conn`` must end; None once it is narrowed."""
    if principal is None:
        return "unauthenticated", f"user {conn.user!r} was removed"
    tenants = list(conn.tenants)
    if not tenants:
        # Logged in without a tenant we could narrow: end it rather than
        # let it keep rights it may no longer have.
        return "forbidden", f"the rights of user {conn.user!r} changed; log in again"
    selectors = [s.selector for s in list(conn.subscriptions) if not s.closed]
    if all([t.narrow(principal, selectors) for t in tenants]):
        return None
    return "forbidden", (
        f"user {conn.user!r} may no longer use the context of an open subscription; "
        "log in again"
    )


async def _end(table: ConnectionTable, conn: Connection, code: str, message: str) -> None:
    reason = f"{RIGHTS_REVOKED}: {message}"
    log.info("%s: connection %d of user %s ends: %s", conn.protocol, conn.id, conn.user, message)
    if conn.revoker is not None:
        conn.close_reason = reason
        # wait_for, not asyncio.timeout: the revoker runs in a task of its own,
        # and the loop turns that takes let a session that only queues its
        # error form (BSON's reply writer) send it before the close below.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.revoker(code, message), REVOKE_TIMEOUT)
    # Whatever the session did: the transport closes (a no-op once closed).
    table.close(conn.id, reason)
