"""How bytes reach a protocol session: the asyncio TCP and TLS transports, the
WebSocket endpoint, the ZeroMQ ROUTER with its CURVE and ZAP security, and the
ReactiveSocket listeners built on them."""
