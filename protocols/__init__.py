"""Protocol front-ends: each sub-package holds a sans-IO codec, an adapter to
the canonical core and a thin asyncio client over the same codec."""
