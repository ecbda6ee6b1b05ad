"""What the ReactiveSocket draft (``protocols/reactivesocket``) and RSocket 1.0
(``protocols/rsocket``) share, written once; both packages stand on this one
and RSocket imports nothing from the draft's.

- :mod:`.streams`: the per-stream lifecycle tables, kinds and records;
- :mod:`.frames`, :mod:`.wire`: the frames both define alike (REQUEST_N,
  CANCEL, unknown frames, the stream id fields) and the encoder lookup and
  transport helpers;
- :mod:`.connection`: the sans-IO connection core, its limits and codec
  wiring, the send checks and the requester's conveniences;
- :mod:`.payloads`, :mod:`.errors`: the event service's MessagePack schema
  and the errors it raises;
- :mod:`.eventservice`: between a decoded request and the core's commands;
- :mod:`.session`, :mod:`.limits`: the server session and its limits, below
  each version's ``adapter.py``;
- :mod:`.client`: the asyncio client core.

Frame layouts, flags, frame types and version-specific rules stay in each
protocol's package; the modules here take them as parameters.
"""
