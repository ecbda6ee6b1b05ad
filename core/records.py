"""Turning database rows into :class:`~core.events.RecordedEvent`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from polyport.core.events import RecordedEvent


def record_from_row(row: Mapping[str, Any]) -> RecordedEvent:
    headers = row["headers"]
    if isinstance(headers, str):
        headers = json.loads(headers)
    return RecordedEvent(
        position=row["position"],
        event_id=row["event_id"],
        context=row["context"],
        stream=row["stream"],
        version=row["version"],
        type=row["type"],
        headers=headers,
        body=bytes(row["body"]),
        content_type=row["content_type"],
        client_time=row["client_time"],
        recorded_at=row["recorded_at"],
        origin=row["origin"],
        segment_offset=row["segment_offset"],
    )
