"""Whether an HTTP request carries the admin token: the admin API requires
it, ``/status`` and ``/metrics`` show more with it.  Its own module so that
those routes ask without importing the admin API (which imports the worker
aggregation, which builds ``/status``)."""

from __future__ import annotations

import hmac

from aiohttp import web


def bearer_matches(request: web.Request, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def is_admin(request: web.Request, token: str | None) -> bool:
    """Whether the request carries the admin token (never, when none is set)."""
    return bool(token) and bearer_matches(request, token or "")
