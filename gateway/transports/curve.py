"""ZeroMQ CURVE on the Res01 ROUTER socket.

- The server key pair: the Z85 secret key is read from ``res01_curve_key_file``,
  or from ``<data dir>/res01-curve.key``, which is generated (mode 0600) on
  first start.  The public key is derived from it and printed at start; clients
  need it.
- Client keys: the listener's ZAP handler (``gateway/transports/zap.py``, which also
  answers PLAIN) asks :meth:`CurveServer.user_for_key`, i.e. the store,
  which user a client's public key belongs to (``curve_keys``, created by
  ``polyport keys create``).  Unknown keys fail the handshake: the peer gets
  no reply at all.  The ZAP User-Id of an accepted peer is its user name (ZeroMQ
  puts it on every message as the ``User-Id`` property).
- One mechanism per socket: a CURVE socket speaks neither NULL (anonymous) nor
  PLAIN.  PLAIN inside CURVE does not exist in ZeroMQ; password logins and
  anonymous clients need another Res01 endpoint without CURVE (and PLAIN sends
  the password in the clear, so only on loopback or a trusted network).

Changing the server key needs a restart (libzmq copies it when the socket
binds); mapped client keys take effect at the next handshake.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio
from zmq.utils import z85

from polyport.gateway.config import ConfigError, GatewayConfig, check_private_file
from polyport.gateway.transports.zap import DOMAIN as ZAP_DOMAIN

if TYPE_CHECKING:
    from polyport.core.users import UserService

log = logging.getLogger("polyport.res01")

KEY_FILE = "res01-curve.key"
Z85_KEY_LENGTH = 40


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair, Z85 text."""

    public: str
    secret: str


def new_key_pair() -> CurveKeys:
    public, secret = zmq.curve_keypair()
    return CurveKeys(public.decode("ascii"), secret.decode("ascii"))


def keys_from_secret(secret: str) -> CurveKeys:
    secret = secret.strip()
    if len(secret) != Z85_KEY_LENGTH:
        raise ValueError(f"a CURVE secret key is {Z85_KEY_LENGTH} Z85 characters")
    public = zmq.curve_public(secret.encode("ascii"))
    return CurveKeys(public.decode("ascii"), secret)


def server_keys(config: GatewayConfig) -> CurveKeys:
    """The server's key pair from the configured file, or from the data
    directory (created there on first start)."""
    configured = config.res01_curve_key_file
    path = Path(configured) if configured else Path(config.data_dir) / KEY_FILE
    if not path.exists():
        if configured:
            raise ConfigError(f"res01: CURVE key file {path} does not exist")
        keys = new_key_pair()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 from the start: the secret is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(keys.secret + "\n")
        log.info("res01: generated a CURVE server key pair in %s", path)
        return keys
    check_private_file(path, "res01: CURVE key file")
    try:
        return keys_from_secret(path.read_text())
    except (ValueError, zmq.ZMQError) as exc:
        raise ConfigError(f"res01: {path} does not hold a Z85 CURVE secret key: {exc}") from None


class CurveServer:
    """CURVE for one ROUTER socket: :meth:`apply` before bind, :meth:`stop`
    at close."""

    def __init__(self, keys: CurveKeys, users: UserService) -> None:
        self.keys = keys
        self._users = users

    @property
    def public_key(self) -> str:
        return self.keys.public

    def apply(self, sock: Any) -> None:
        """Make ``sock`` a CURVE server (before it binds).  The context's one
        ZAP handler (gateway/transports/zap.py) asks :meth:`user_for_key` who a client is."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public.encode("ascii"))
        sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        log.info("res01: CURVE on; server public key %s", self.keys.public)

    async def user_for_key(self, key: bytes, address: str) -> str | None:
        """The user a client public key (32 bytes, from ZAP) belongs to, or
        None: an unknown key is refused, and so is any key while the database
        is away (never let in on doubt)."""
        text = z85.encode(key).decode("ascii")
        try:
            user = await self._users.curve_key_user(text)
        except Exception:
            log.exception("res01: CURVE key lookup failed")
            return None
        if user is None:
            log.info("res01: CURVE handshake from %s refused: unknown client key %s",
                     address, text)
        return user


def curve_server(config: GatewayConfig, users: UserService) -> CurveServer | None:
    if not config.res01_curve:
        return None
    return CurveServer(server_keys(config), users)
