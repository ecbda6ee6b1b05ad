"""How bytes reach a protocol session: the asyncio TCP and TLS transports, the
WebSocket endpoint, ZeroMQ's CURVE and ZAP security, and the ReactiveSocket
listeners built on them."""
