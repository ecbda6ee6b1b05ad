"""Users and tenants: scrypt-hashed passwords, the contexts each user may use,
anonymous access on or off by configuration."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from polyport.core import sql
from polyport.core.commands import Principal
from polyport.core.errors import Malformed, NotFound, Unauthenticated
from polyport.core.events import DEFAULT_CONTEXT

# Interactive-login strength (about 50 ms); parameters are stored with each hash.
SCRYPT_N = 1 << 14
SCRYPT_R = 8
SCRYPT_P = 1

ANONYMOUS = Principal(user=None, default_context=DEFAULT_CONTEXT, contexts=None)


def hash_password(password: str, *, n: int = SCRYPT_N) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${n}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


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


class UserService:
    def __init__(self, pool: asyncpg.Pool, *, allow_anonymous: bool) -> None:
        self._pool = pool
        self.allow_anonymous = allow_anonymous

    async def authenticate(self, user: str | None, password: str | None) -> Principal:
        if not user:
            if self.allow_anonymous:
                return ANONYMOUS
            raise Unauthenticated("anonymous access is disabled: give a user name and password")
        row = await self._pool.fetchrow(sql.GET_USER, user)
        # Hash even for unknown users so timing does not reveal which exist.
        stored = row["password_hash"] if row else hash_password("x", n=1 << 10)
        ok = await asyncio.get_running_loop().run_in_executor(
            None, verify_password, password or "", stored
        )
        if row is None or not ok:
            raise Unauthenticated(f"wrong user name or password for {user!r}")
        contexts = row["contexts"]
        return Principal(
            user=row["name"],
            default_context=row["default_context"],
            contexts=frozenset(contexts) if contexts is not None else None,
        )

    async def add(
        self,
        name: str,
        password: str,
        *,
        default_context: str = DEFAULT_CONTEXT,
        contexts: list[str] | None = None,
    ) -> None:
        if not name:
            raise Malformed("user name must not be empty")
        hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
        await self._pool.execute(sql.UPSERT_USER, name, hashed, default_context, contexts)

    async def set_password(self, name: str, password: str) -> None:
        hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
        if await self._pool.fetchval(sql.SET_USER_PASSWORD, name, hashed) is None:
            raise NotFound(f"no user {name!r}")

    async def set_contexts(
        self, name: str, contexts: list[str] | None, default_context: str | None = None
    ) -> None:
        changed = await self._pool.fetchval(sql.SET_USER_CONTEXTS, name, contexts, default_context)
        if changed is None:
            raise NotFound(f"no user {name!r}")

    async def list(self) -> list[UserInfo]:
        rows = await self._pool.fetch(sql.LIST_USERS)
        return [
            UserInfo(
                r["name"],
                r["default_context"],
                tuple(r["contexts"]) if r["contexts"] is not None else None,
                r["created_at"],
            )
            for r in rows
        ]

    async def remove(self, name: str) -> None:
        if await self._pool.fetchval(sql.DELETE_USER, name) is None:
            raise NotFound(f"no user {name!r}")
