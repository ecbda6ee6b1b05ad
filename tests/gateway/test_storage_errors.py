"""A statement PostgreSQL refuses reaches every protocol as the same
canonical error (issue 28): core.db translates the driver's exception once,
so Res01 answers EVENT_STORAGE and BSON ``storage_unavailable`` (it used to
be ``internal`` there), each message naming an error id, never the server's
words."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from polyport.core.migrate import asyncpg_dsn
from polyport.protocols.bson.client import BsonClient, BsonError
from polyport.protocols.res01 import ErrorCode
from polyport.protocols.res01.client import Res01Client, Res01ServerError

pytestmark = pytest.mark.timeout(60)

GatewayFactory = Callable[..., Awaitable[Any]]


async def test_a_refused_statement_is_storage_unavailable_on_every_protocol(
    gateway_factory: GatewayFactory, db_url: str
) -> None:
    gw = await gateway_factory()
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    # Durable subscriptions live in this table: registering one is refused
    # (undefined_table) on a healthy connection.
    await conn.execute("ALTER TABLE subscriptions RENAME TO subscriptions_away")
    try:
        res01 = await Res01Client.connect(gw.listeners["res01"].address, timeout=10)
        try:
            with pytest.raises(Res01ServerError) as er:
                await res01.subscribe("sub-A", [("default", "*", datetime.now(UTC))])
        finally:
            await res01.close()
        assert er.value.code == ErrorCode.EVENT_STORAGE
        assert "error id" in er.value.message and "subscriptions" not in er.value.message

        bson = await BsonClient.connect(*gw.listeners["bson"].address)
        try:
            with pytest.raises(BsonError) as refused:
                await bson.subscribe("s", durable_id="d1")
        finally:
            await bson.close()
        assert refused.value.err_code == "storage_unavailable"
        assert "error id" in refused.value.err_msg
        assert "subscriptions" not in refused.value.err_msg
    finally:
        await conn.execute("ALTER TABLE subscriptions_away RENAME TO subscriptions")
        await conn.close()
