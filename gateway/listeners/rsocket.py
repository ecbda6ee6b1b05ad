"""RSocket 1.0 listeners: TCP (default 7878) and WebSocket at ``/rsocket`` on
the HTTP port (set up as the draft's, in ``gateway/transports/reactive.py``); the
ReactiveSocket draft keeps its own port and path (``reactivesocket.py``) over
the same store."""

from __future__ import annotations

from polyport.gateway.transports.reactive import reactive_listener
from polyport.protocols.rsocket.adapter import RSocketSession
from polyport.protocols.rsocket.frames import DEFAULT_PORT, PROTOCOL, WEBSOCKET_PATH
from polyport.protocols.rsocket.limits import Limits

LISTENER = reactive_listener(
    PROTOCOL, DEFAULT_PORT, WEBSOCKET_PATH, RSocketSession, Limits.from_settings
)
