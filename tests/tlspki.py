"""Test certificates (trustme): a CA, the gateway's certificate for
127.0.0.1/localhost, client certificates, and contexts for the clients."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Pki:
    root: Path
    ca: trustme.CA
    cert: Path  # server chain
    key: Path  # server key, mode 0600
    ca_file: Path  # client CA bundle (the same CA signs client certificates)

    def server_files(self, name: str) -> tuple[Path, Path]:
        """A fresh server certificate and key (SIGHUP tests)."""
        cert = self.ca.issue_cert("127.0.0.1", "localhost", common_name=name)
        return write_pair(self.root, name, cert)

    def client(self, user: str | None = None, *, ca: trustme.CA | None = None) -> ssl.SSLContext:
        """A client context trusting the gateway's CA; with ``user``, it
        presents a certificate whose CN is that user, signed by ``ca``
        (default: the gateway's client CA)."""
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        if user is not None:
            (ca or self.ca).issue_cert(f"{user}@clients.test", common_name=user).configure_cert(ctx)
        return ctx


def write_pair(root: Path, name: str, cert: trustme.LeafCert) -> tuple[Path, Path]:
    cert_path, key_path = root / f"{name}.pem", root / f"{name}.key"
    cert_path.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    key_path.write_bytes(cert.private_key_pem.bytes())
    key_path.chmod(0o600)
    return cert_path, key_path


def make_pki(root: Path) -> Pki:
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert, key = write_pair(root, "server", ca.issue_cert("127.0.0.1", "localhost"))
    return Pki(root, ca, cert, key, ca_file)
