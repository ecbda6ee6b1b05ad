"""Users and tenants: scrypt-hashed passwords, the contexts each user may use,
anonymous access on or off by configuration."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from polyport.core import sql
from polyport.core.commands import Principal
from polyport.core.db import Db
from polyport.core.errors import Busy, Malformed, NotFound, Unauthenticated, Unprocessable
from polyport.core.events import DEFAULT_CONTEXT

# Interactive-login strength (about 50 ms); parameters are stored with each hash.
SCRYPT_N = 1 << 14
SCRYPT_R = 8
SCRYPT_P = 1

DEFAULT_ANONYMOUS_CONTEXTS: tuple[str, ...] = (DEFAULT_CONTEXT,)


def anonymous_principal(contexts: tuple[str, ...] = DEFAULT_ANONYMOUS_CONTEXTS) -> Principal:
    """Anonymous is a limited principal: only the configured contexts, the
    first of them its default."""
    if not contexts:
        raise ValueError("anonymous access needs at least one context")
    return Principal(user=None, default_context=contexts[0], contexts=frozenset(contexts))


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${n}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def hash_parameters(stored: str) -> tuple[int, int, int] | None:
    """(n, r, p) of a stored scrypt hash, or None if it is not one."""
    try:
        scheme, n, r, p, _salt, _digest = stored.split("$")
        return (int(n), int(r), int(p)) if scheme == "scrypt" else None
    except ValueError:
        return None


@functools.cache
def dummy_hash() -> str:
    """A hash with the same cost as a real user's, to verify against when the
    user does not exist: a failure costs the same time either way, so timing
    does not tell which names exist.  Made once, on first use."""
    return hash_password(base64.b64encode(os.urandom(18)).decode())


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=32,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, base64.b64decode(digest))


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    default_context: str
    contexts: tuple[str, ...] | None
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "default_context": self.default_context,
            "contexts": list(self.contexts) if self.contexts is not None else None,
            "created_at": self.created_at.isoformat(),
        }


def _check_default_context(default: str, contexts: list[str] | None) -> None:
    """A user whose default context is not one of theirs could not make a
    single call that names no context: refuse it when it is set."""
    if contexts is not None and default not in contexts:
        raise Unprocessable(f"default context {default!r} is not one of the user's contexts "
                        f"({', '.join(contexts) or 'none'}); add it with --context {default}")


def _principal(row: asyncpg.Record) -> Principal:
    contexts = row["contexts"]
    return Principal(
        user=row["name"],
        default_context=row["default_context"],
        contexts=frozenset(contexts) if contexts is not None else None,
    )


@dataclass
class _AddressSlots:
    semaphore: asyncio.Semaphore
    users: int = 0  # logins holding or awaiting a slot
    checking: int = 0  # of those, holding one


class LoginThrottle:
    """Failed logins per source address, and the delay they earn.

    The first ``free_failures`` failures within ``window`` seconds cost
    nothing extra; each further attempt from that address waits
    ``base_delay`` × 2^(excess − 1), at most ``max_delay``, before it is even
    checked.  A success clears the address.  At most ``max_addresses`` are
    remembered (the oldest forgotten first), so a flood of sources costs
    bounded memory.  The address is the source host, never host and port:
    a client that opens a new connection per guess is the same address.

    Logins being checked (waiting out their delay or hashing) are capped
    too, at ``max_in_progress_per_address`` per address and
    ``max_in_progress`` in all; more wait their turn: a password check is a
    deliberately slow scrypt in the thread pool, and without a cap one
    address could keep that pool busy for everyone.  A client that opens a
    pool of connections at once is only queued; past
    ``max_waiting_per_address`` waiting from one address, a login is
    refused at once with ``busy``.
    """

    def __init__(
        self,
        *,
        free_failures: int = 10,
        window: float = 60.0,
        base_delay: float = 0.5,
        max_delay: float = 10.0,
        max_addresses: int = 10_000,
        max_in_progress_per_address: int = 4,
        max_in_progress: int = 32,
        max_waiting_per_address: int = 256,
    ) -> None:
        self.free_failures = free_failures
        self.max_in_progress_per_address = max_in_progress_per_address
        self.max_waiting_per_address = max_waiting_per_address
        self._all = asyncio.Semaphore(max_in_progress)
        self._slots: dict[str, _AddressSlots] = {}
        self.refused_total = 0
        self.window = window
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_addresses = max_addresses
        self._failures: dict[str, tuple[int, float]] = {}  # address -> (count, last)
        self.failures_total = 0
        self.delayed_total = 0

    def delay_for(self, address: str | None, now: float | None = None) -> float:
        if not address:
            return 0.0
        now = time.monotonic() if now is None else now
        entry = self._failures.get(address)
        if entry is None:
            return 0.0
        count, last = entry
        if now - last > self.window:
            del self._failures[address]
            return 0.0
        excess = count - self.free_failures
        if excess < 0:
            return 0.0
        return float(min(self.max_delay, self.base_delay * (2 ** excess)))

    def failed(self, address: str | None, now: float | None = None) -> None:
        self.failures_total += 1
        if not address:
            return
        now = time.monotonic() if now is None else now
        count, last = self._failures.pop(address, (0, now))
        if now - last > self.window:
            count = 0
        self._failures[address] = (count + 1, now)  # re-inserted: newest last
        while len(self._failures) > self.max_addresses:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, address: str | None) -> None:
        if address:
            self._failures.pop(address, None)

    def in_progress(self, address: str) -> int:
        """Logins from ``address`` being checked now (holding a slot)."""
        slots = self._slots.get(address)
        return 0 if slots is None else slots.checking

    @contextlib.asynccontextmanager
    async def attempt(self, address: str | None) -> AsyncIterator[None]:
        """One login from ``address`` being checked: waits for a slot of the
        address and one of all; :class:`Busy` when too many already wait."""
        key = address or ""
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _AddressSlots(
                asyncio.Semaphore(self.max_in_progress_per_address))
        if slots.users - slots.checking >= self.max_waiting_per_address:
            self.refused_total += 1
            raise Busy(f"{slots.users - slots.checking} logins from {address} are waiting to "
                       "be checked; retry when they are done")
        slots.users += 1
        try:
            async with slots.semaphore, self._all:
                slots.checking += 1
                try:
                    yield
                finally:
                    slots.checking -= 1
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._slots[key]

    async def wait_turn(self, address: str | None) -> None:
        """Sleep the delay ``address`` has earned (counted in delayed_total)."""
        delay = self.delay_for(address)
        if delay > 0:
            self.delayed_total += 1
            await asyncio.sleep(delay)


class UserService:
    def __init__(
        self,
        db: Db,
        *,
        allow_anonymous: bool,
        anonymous_contexts: tuple[str, ...] = DEFAULT_ANONYMOUS_CONTEXTS,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._db = db
        self.allow_anonymous = allow_anonymous
        self.anonymous = anonymous_principal(anonymous_contexts)
        self.throttle = throttle or LoginThrottle()

    async def authenticate(
        self, user: str | None, password: str | None, *, peer: str | None = None
    ) -> Principal:
        """The principal for a login; ``peer`` (the source address) feeds the
        failed-login throttle.  No user name = anonymous, when allowed."""
        if not user:
            if self.allow_anonymous:
                return self.anonymous
            raise Unauthenticated("anonymous access is disabled: give a user name and password")
        async with self.throttle.attempt(peer):
            await self.throttle.wait_turn(peer)
            row = await self._db.fetchrow(sql.GET_USER, user)
            # Unknown users are checked against a hash of the same cost.
            stored = row["password_hash"] if row else dummy_hash()
            ok = await asyncio.get_running_loop().run_in_executor(
                None, verify_password, password or "", stored
            )
        if row is None or not ok:
            self.throttle.failed(peer)
            raise Unauthenticated(f"wrong user name or password for {user!r}")
        self.throttle.succeeded(peer)
        return _principal(row)

    async def principal_for(self, user: str) -> Principal:
        """The principal of a user who proved who they are another way (a
        client certificate, a CURVE key): no password is checked here."""
        row = await self._db.fetchrow(sql.GET_USER, user)
        if row is None:
            self.throttle.failed(None)
            raise Unauthenticated(f"no user {user!r} for this credential")
        return _principal(row)

    async def add(
        self,
        name: str,
        password: str,
        *,
        default_context: str | None = None,
        contexts: list[str] | None = None,
    ) -> None:
        """``default_context`` None: the first of ``contexts``, else ``default``."""
        if not name:
            raise Malformed("user name must not be empty")
        if default_context is None:
            default_context = contexts[0] if contexts else DEFAULT_CONTEXT
        _check_default_context(default_context, contexts)
        hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
        await self._db.execute(sql.UPSERT_USER, name, hashed, default_context, contexts)
        # Adding an existing name replaces its contexts.
        await self._changed(name)

    async def set_password(self, name: str, password: str) -> None:
        hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
        if await self._db.fetchval(sql.SET_USER_PASSWORD, name, hashed) is None:
            raise NotFound(f"no user {name!r}")
        await self._changed(name)

    async def set_contexts(
        self, name: str, contexts: list[str] | None, default_context: str | None = None
    ) -> None:
        if default_context is not None:
            _check_default_context(default_context, contexts)
        changed = await self._db.fetchval(sql.SET_USER_CONTEXTS, name, contexts, default_context)
        if changed is None:
            raise NotFound(f"no user {name!r}")
        await self._changed(name)

    async def list(self) -> list[UserInfo]:
        rows = await self._db.fetch(sql.LIST_USERS)
        return [
            UserInfo(
                r["name"],
                r["default_context"],
                tuple(r["contexts"]) if r["contexts"] is not None else None,
                r["created_at"],
            )
            for r in rows
        ]

    # --- Res01 CURVE client keys ---------------------------------------------

    async def add_curve_key(self, name: str, public_key: str) -> None:
        """Map a client's CURVE public key (Z85) to user ``name``."""
        if await self._db.fetchval(sql.ADD_CURVE_KEY, public_key, name) is None:
            raise NotFound(f"no user {name!r}")

    async def curve_key_user(self, public_key: str) -> str | None:
        """The user a CURVE public key (Z85) belongs to, or None."""
        user: str | None = await self._db.fetchval(sql.CURVE_KEY_USER, public_key)
        return user

    async def curve_keys(self) -> tuple[dict[str, Any], ...]:
        rows = await self._db.fetch(sql.LIST_CURVE_KEYS)
        return tuple(dict(r) for r in rows)

    async def remove_curve_key(self, public_key: str) -> None:
        if await self._db.fetchval(sql.DELETE_CURVE_KEY, public_key) is None:
            raise NotFound(f"no CURVE key {public_key!r}")

    async def remove(self, name: str) -> None:
        if await self._db.fetchval(sql.DELETE_USER, name) is None:
            raise NotFound(f"no user {name!r}")
        await self._changed(name)

    async def current(self, name: str) -> Principal | None:
        """The principal ``name`` has now, None once removed: what an open
        connection of that user is re-checked against."""
        row = await self._db.fetchrow(sql.GET_USER, name)
        return None if row is None else _principal(row)

    async def _changed(self, name: str) -> None:
        """Tell every gateway process (this one, others, across hosts) that
        ``name``'s rights changed, after the change committed; the caller
        may be the CLI in another process than any gateway."""
        # NOTIFY payloads stop short of 8000 bytes: a longer name asks every
        # process to re-check every user instead.
        payload = name if len(name.encode("utf-8")) < 7000 else ""
        await self._db.execute(sql.NOTIFY_USERS, payload)


# How long the watcher waits before it connects again after losing its
# LISTEN connection.
RECONNECT_DELAY = 2.0
# Distinct user names waiting to be re-checked; past this the batch becomes
# "every user" (bounded however many changes arrive at once).
MAX_PENDING_CHANGES = 1000


class UserChanges:
    """``LISTEN polyport_users`` on a connection of its own: calls
    ``on_change(name)`` for each user whose rights changed (``None``: every
    user, after the connection was lost and notifications may have been
    missed).  One call at a time; changes that arrive meanwhile are merged.

    Open sessions keep the principal they logged in with; this is how they
    learn that it changed without polling the users table."""

    def __init__(
        self, dsn: str, on_change: Callable[[str | None], Awaitable[None]],
        log: logging.Logger,
    ) -> None:
        self._dsn = dsn
        self._on_change = on_change
        self._log = log
        self._pending: set[str | None] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Set once LISTEN is in place (tests and start-up wait for it).
        self.listening = asyncio.Event()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="polyport-user-changes"),
            asyncio.create_task(self._apply(), name="polyport-user-changes-apply"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _changed(self, name: str | None) -> None:
        if len(self._pending) >= MAX_PENDING_CHANGES:
            self._pending = {None}
        self._pending.add(name or None)
        self._wake.set()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._changed(payload)

    async def _listen(self) -> None:
        first = True
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=10)
                await conn.add_listener(sql.USERS_CHANNEL, self._on_notify)
                if not first:
                    # Changes made while the connection was down went unheard.
                    self._changed(None)
                first = False
                self.listening.set()
                while True:
                    # A lost connection shows on its next statement.
                    await asyncio.sleep(RECONNECT_DELAY * 5)
                    await conn.execute("SELECT 1")
            except asyncio.CancelledError:
                if conn is not None:
                    conn.terminate()
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: connect again
                # Once per outage, not every retry.
                level = logging.WARNING if self.listening.is_set() or first else logging.DEBUG
                self._log.log(level, "listening for user changes failed (%s); retrying "
                              "(changes made meanwhile are re-checked on reconnect)", exc)
            self.listening.clear()
            if conn is not None:
                conn.terminate()
            await asyncio.sleep(RECONNECT_DELAY)

    async def _apply(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            names, self._pending = self._pending, set()
            for name in (None,) if None in names else sorted(n for n in names if n):
                try:
                    await self._on_change(name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the database, most likely: retry
                    self._log.warning("re-checking the connections of user %r failed (%s); "
                                      "retrying", name, exc)
                    self._changed(name)
                    await asyncio.sleep(RECONNECT_DELAY)
