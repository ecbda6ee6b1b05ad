"""PeerTable: Res01 per-peer state forgotten when idle and bounded in number."""

from __future__ import annotations

import pytest

from polyport.protocols.res01.limits import Limits
from polyport.protocols.res01.peers import PeerTable


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_unseen_for_idle_timeout_is_forgotten() -> None:
    clock = _Clock()
    table: PeerTable[bytes, str] = PeerTable(max_peers=10, idle_timeout=5.0, clock=clock)
    table.set(b"a", "state of a")
    clock.now = 3.0
    table.seen(b"b")
    clock.now = 6.0
    table.seen(b"b")  # a was last seen 6 s ago: gone with its state
    assert b"a" not in table and table.get(b"a") is None
    assert len(table) == 1 and table.forgotten == 1
    # Seen again it starts afresh, without the old state.
    table.seen(b"a")
    assert b"a" in table and table.get(b"a") is None


def test_seeing_a_peer_keeps_it_and_its_state() -> None:
    clock = _Clock()
    table: PeerTable[bytes, str] = PeerTable(max_peers=10, idle_timeout=5.0, clock=clock)
    table.set(b"a", "kept")
    for t in range(1, 20):
        clock.now = float(t)
        table.seen(b"a")
    assert table.get(b"a") == "kept" and table.forgotten == 0


def test_max_peers_forgets_the_least_recently_seen() -> None:
    clock = _Clock()
    table: PeerTable[int, str] = PeerTable(max_peers=3, idle_timeout=None, clock=clock)
    for peer in range(3):
        table.set(peer, f"s{peer}")
    table.seen(0)  # 1 is now the least recently seen
    table.seen(3)
    assert sorted(k for k in range(4) if k in table) == [0, 2, 3]
    for peer in range(100, 10_000):
        table.seen(peer)
    assert len(table) == 3 and table.forgotten == 10_000 - 100 + 1


def test_limits_from_settings() -> None:
    limits = Limits.from_settings({"res01_max_peers": 7, "idle_timeout": 0})
    assert (limits.max_peers, limits.idle_timeout) == (7, None)
    assert Limits.from_settings({}).max_peers == 10_000
    with pytest.raises(ValueError):
        PeerTable(max_peers=0, idle_timeout=None)


def test_forgotten_peers_are_reported_and_pop_is_silent() -> None:
    clock = _Clock()
    gone: list[tuple[str, str | None]] = []
    table: PeerTable[str, str] = PeerTable(
        max_peers=2, idle_timeout=5.0, clock=clock, on_forget=lambda k, v: gone.append((k, v))
    )
    table.set("a", "A")
    table.seen("b")
    table.seen("c")  # room: a goes
    clock.now = 10.0
    table.seen("d")  # idle: b and c go
    assert gone == [("a", "A"), ("b", None), ("c", None)]
    table.set("e", "E")
    assert table.pop("e") == "E" and table.pop("e") is None
    assert list(table) == ["d"] and len(gone) == 3
