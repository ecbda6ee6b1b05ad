"""What the ReactiveSocket draft (``protocols/reactivesocket``) and RSocket 1.0
(``protocols/rsocket``) share below the store-facing adapters
(``protocols/reactive/eventservice.py``): the per-stream lifecycle tables
(:mod:`.streams`), the sans-IO connection core (:mod:`.connection`) and the
asyncio client core (:mod:`.client`).

Frame layouts, flags, frame types and version-specific rules stay in each
protocol's package; the modules here take them as parameters.
"""
