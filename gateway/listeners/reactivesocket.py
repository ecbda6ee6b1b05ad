"""ReactiveSocket listeners: TCP (default 7070) and WebSocket at
``/reactivesocket`` on the HTTP port (set up as RSocket 1.0's, in
``gateway/transports/reactive.py``)."""

from __future__ import annotations

from polyport.gateway.transports.reactive import reactive_listener
from polyport.protocols.reactivesocket.adapter import ReactiveSocketSession
from polyport.protocols.reactivesocket.frames import DEFAULT_PORT, PROTOCOL, WEBSOCKET_PATH
from polyport.protocols.reactivesocket.limits import Limits

LISTENER = reactive_listener(
    PROTOCOL, DEFAULT_PORT, WEBSOCKET_PATH, ReactiveSocketSession, Limits.from_settings
)
