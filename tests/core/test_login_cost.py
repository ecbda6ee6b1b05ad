"""Failed logins cost the same key derivation for unknown and known users, so
timing does not tell which names exist; the throttle delays an address that
keeps failing.  The cost is checked through the scrypt parameters actually
used, not by timing (``python -m bench logins`` prints timings)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from polyport.core import users as users_module
from polyport.core.errors import Unauthenticated
from polyport.core.store import EventStore
from polyport.core.users import SCRYPT_N, SCRYPT_P, SCRYPT_R, LoginThrottle, hash_parameters


@pytest.fixture
def scrypt_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int, int]]:
    """(n, r, p, dklen) of every scrypt derivation core.users runs."""
    calls: list[tuple[int, int, int, int]] = []
    real = hashlib.scrypt

    def recording(password: bytes, **kw: Any) -> bytes:
        calls.append((kw["n"], kw["r"], kw["p"], kw["dklen"]))
        return real(password, **kw)

    monkeypatch.setattr(users_module.hashlib, "scrypt", recording)
    return calls


async def test_unknown_and_known_users_cost_the_same_derivation(
    store: EventStore, scrypt_calls: list[tuple[int, int, int, int]]
) -> None:
    users = store.users
    await users.add("known", "right")
    users_module.dummy_hash()  # made once per process; not part of a login's cost
    scrypt_calls.clear()
    with pytest.raises(Unauthenticated) as known_fail:
        await users.authenticate("known", "wrong", peer="198.51.100.1")
    known = list(scrypt_calls)
    scrypt_calls.clear()
    with pytest.raises(Unauthenticated) as unknown_fail:
        await users.authenticate("no-such-user", "wrong", peer="198.51.100.2")
    unknown = list(scrypt_calls)
    assert known == unknown == [(SCRYPT_N, SCRYPT_R, SCRYPT_P, 32)]
    # The refusals do not tell the two apart by their shape either.
    assert type(known_fail.value) is type(unknown_fail.value)
    # A success costs the same one derivation.
    scrypt_calls.clear()
    await users.authenticate("known", "right")
    assert scrypt_calls == [(SCRYPT_N, SCRYPT_R, SCRYPT_P, 32)]
    # The stand-in hash has the stored hashes' parameters.
    assert hash_parameters(users_module.dummy_hash()) == (SCRYPT_N, SCRYPT_R, SCRYPT_P)


async def test_the_eleventh_rapid_failure_from_one_address_is_delayed(store: EventStore) -> None:
    users = store.users
    users.throttle = LoginThrottle(base_delay=0.2)
    await users.add("known", "right")
    loop_time = asyncio.get_running_loop().time
    timings: list[float] = []
    for _ in range(11):
        started = loop_time()
        with pytest.raises(Unauthenticated):
            await users.authenticate("known", "wrong", peer="203.0.113.9")
        timings.append(loop_time() - started)
    assert users.throttle.failures_total == 11 and users.throttle.delayed_total == 1
    assert timings[-1] >= 0.2
    # Another address is not held up by the first one's failures.
    await users.authenticate("known", "right", peer="203.0.113.10")
    assert users.throttle.delayed_total == 1
