"""Byte budgets that many connections draw on together.

A per-connection limit bounds one connection; a client that opens many
connections multiplies it.  A :class:`ByteBudget` is the bound over all of
them (the gateway's, per process) with a share per source address, so that
one client exhausts only its own share and the rest stays for others.  Each
connection holds a :class:`BudgetAccount` in it and reserves before it keeps
bytes; what it holds goes back when the bytes are let go (a message complete,
a stream ended) and all of it when the connection closes.

Plain accounting, no waiting and no I/O: the sans-IO codecs call it as they
buffer, the gateway builds one budget and hands each connection its account.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ByteBudget:
    """``limit`` bytes for every holder together and ``per_address`` for the
    holders of one source address (0: no such limit).  ``what`` names the
    bytes, ``setting`` and ``per_address_setting`` the settings, in refusals,
    so the message says what an operator would change."""

    limit: int
    per_address: int = 0
    what: str = "bytes held"
    setting: str = "budget"
    per_address_setting: str = "budget per address"
    used: int = 0
    by_address: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.limit < 0 or self.per_address < 0:
            raise ValueError(f"{self.setting} and {self.per_address_setting} must not be negative")

    def account(self, address: str) -> BudgetAccount:
        """A new holder from source ``address`` (the host, without a port:
        a new connection per attempt is still the same client)."""
        return BudgetAccount(self, address)

    def _reserve(self, address: str, n: int) -> str | None:
        if self.limit and self.used + n > self.limit:
            return f"{self.what} of all clients exceed {self.setting} {self.limit}"
        if self.per_address and self.by_address[address] + n > self.per_address:
            return (
                f"{self.what} from {address} exceed "
                f"{self.per_address_setting} {self.per_address}"
            )
        self.used += n
        self.by_address[address] += n
        return None

    def _release(self, address: str, n: int) -> None:
        self.used -= n
        left = self.by_address[address] - n
        if left > 0:
            self.by_address[address] = left
        else:
            del self.by_address[address]


class BudgetAccount:
    """What one connection holds of a :class:`ByteBudget`."""

    __slots__ = ("_budget", "address", "held")

    def __init__(self, budget: ByteBudget, address: str) -> None:
        self._budget = budget
        self.address = address
        self.held = 0

    def reserve(self, n: int) -> str | None:
        """Hold ``n`` more bytes; why not when the budget (the address's
        share or the whole) has no room, and then nothing is held."""
        if n <= 0:
            return None
        refused = self._budget._reserve(self.address, n)
        if refused is None:
            self.held += n
        return refused

    def hold(self, holding: int) -> str | None:
        """The holder keeps ``holding`` bytes now: reserve the growth or give
        back the rest; why not when the growth does not fit (then the
        account is as before)."""
        if holding > self.held:
            return self.reserve(holding - self.held)
        self.settle(holding)
        return None

    def settle(self, holding: int) -> None:
        """The holder keeps only ``holding`` bytes now (messages completed or
        dropped since): give back the rest.  Never takes more."""
        extra = self.held - max(holding, 0)
        if extra > 0:
            self._budget._release(self.address, extra)
            self.held -= extra

    def close(self) -> None:
        """The holder is gone: everything it held goes back."""
        self.settle(0)


def frame_refusal(size: int, refused: str) -> str:
    """What a peer is told when the ``size`` bytes it has sent of a frame not
    yet whole do not fit the budget (the connection ends: its byte stream
    cannot go on without them)."""
    return f"a frame of {size} bytes so far cannot be held: {refused}; retry later"
