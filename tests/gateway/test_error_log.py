"""Issue 29 item 8: the log line for a protocol error says what the client
was told, not only the canonical code."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from polyport.protocols.bson.client import BsonClient


async def test_the_error_line_carries_the_reason_the_client_got(
    gateway_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await gateway_factory(max_event_bytes=64)
    caplog.set_level(logging.INFO, logger="polyport.errors")
    async with await BsonClient.connect(*gw.listeners["bson"].address) as client:
        with pytest.raises(Exception) as refused:
            await client.emit("orders", "Big", {"blob": "x" * 500})
    told = str(refused.value)
    [line] = [r for r in caplog.records if r.name == "polyport.errors"]
    text = line.getMessage()
    assert text.startswith("bson: protocol error from 127.0.0.1"), text
    assert "64" in told and "(" in text
    reason = text[text.index("(") + 1:text.rindex(")")]
    assert reason and reason in told, (reason, told)
    assert line.reason == reason  # type: ignore[attr-defined]
