"""The embedded PostgreSQL: a private cluster under the polyport data directory.

Used when no database URL is configured, and by the test suite for its
throwaway cluster.  Binaries come from the system (``/usr/lib/postgresql/*/bin``
or ``PATH``) or, failing that, from the ``pgserver`` wheel.  PostgreSQL refuses
to run as root, so as root the cluster belongs to an unprivileged user.

The cluster listens on 127.0.0.1 (password auth, the password kept in the data
directory with mode 0600) and on a unix socket in the data directory.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from polyport.core import sql

log = logging.getLogger("polyport.embedded_pg")

DATABASE_NAME = "polyport"
SUPERUSER = "polyport"
UNPRIVILEGED_USERS = ("postgres", "polyport")

# Settings for throwaway clusters (tests): durability traded for speed.
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_connections": "200",
}
DEFAULT_SETTINGS = {"max_connections": "200"}


class EmbeddedPostgresError(RuntimeError):
    pass


def find_bin_dir(explicit: str | None = None) -> Path:
    """Directory holding initdb/pg_ctl/postgres."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    system = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(system)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    # Locate pgserver's binaries without importing it (its import has side effects).
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise EmbeddedPostgresError(
        "no PostgreSQL binaries found: install PostgreSQL (e.g. `apt-get install postgresql`), "
        "or `pip install pgserver`, or give --database-url for an existing server"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pick_user() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "polyport"],
        check=True,
    )
    return pwd.getpwnam("polyport")


def _make_traversable(path: Path) -> None:
    """Let the unprivileged cluster owner reach ``path`` (search bit only)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            log.info("adding o+x to %s so the PostgreSQL user can reach the data directory", parent)
            parent.chmod(mode | stat.S_IXOTH)


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 0
    fast: bool = False
    bin_dir: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    owned: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.run_dir = self.data_dir / "run"
        self.log_file = self.data_dir / "postgres.log"
        self.password_file = self.data_dir / "pg-password"
        self.user = _pick_user()

    # --- subprocess helpers ------------------------------------------------

    def _run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        bins = find_bin_dir(self.bin_dir)
        cmd = [str(bins / args[0]), *args[1:]]
        extra: dict[str, object] = {}
        if self.user is not None:
            extra = {"user": self.user.pw_uid, "group": self.user.pw_gid}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd="/", **extra, **kw  # type: ignore[call-overload]
        )
        return proc  # type: ignore[no-any-return]

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    # --- lifecycle ---------------------------------------------------------

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, port: int) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{port}/{DATABASE_NAME}"

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            _make_traversable(self.data_dir)
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.pgdata)
        self._chown(self.run_dir)
        password = secrets.token_urlsafe(24)
        self.password_file.write_text(password + "\n")
        self.password_file.chmod(0o600)
        pwfile = self.run_dir / "initdb-pw"
        pwfile.write_text(password + "\n")
        self._chown(pwfile)
        try:
            proc = self._run(
                [
                    "initdb",
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed:\n{proc.stdout}\n{proc.stderr}")

    def running_port(self) -> int | None:
        """Port of a live server on this data directory; clears a stale pid file."""
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return None
        lines = pid_file.read_text().splitlines()
        try:
            pid, port = int(lines[0]), int(lines[3])
        except (IndexError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"postgres" not in cmdline:
            log.warning("removing stale PostgreSQL pid file %s (pid %d is gone)", pid_file, pid)
            pid_file.unlink(missing_ok=True)
            return None
        return port

    def start(self) -> str:
        """Start the cluster (initialising it first if needed); return its URL.

        If a server already runs on this data directory (another polyport
        process), reuse it and leave it running at exit.
        """
        if not self.initialized():
            self.init()
        port = self.running_port()
        if port is not None:
            self.owned = False
            return self.url(port)
        port = self.port or _free_port()
        settings = {**(FAST_SETTINGS if self.fast else DEFAULT_SETTINGS), **self.settings}
        opts = [
            "-c listen_addresses=127.0.0.1",
            f"-p {port}",
            f"-c unix_socket_directories={self.run_dir}",
            *(f"-c {k}={v}" for k, v in settings.items()),
        ]
        if self.user is not None and not self.log_file.exists():
            self.log_file.touch()
            self._chown(self.log_file)
        proc = self._run(
            [
                "pg_ctl",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(opts),
                "start",
            ]
        )
        if proc.returncode != 0:
            tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start (see {self.log_file}):\n{proc.stderr}\n{tail}"
            )
        self.owned = True
        self._ensure_database(port)
        return self.url(port)

    def _ensure_database(self, port: int) -> None:
        psql = [
            "psql",
            "-h",
            str(self.run_dir),
            "-p",
            str(port),
            "-U",
            SUPERUSER,
            "-d",
            "postgres",
            "-tAc",
        ]
        check = self._run([*psql, sql.database_exists(DATABASE_NAME)])
        if check.returncode != 0:
            raise EmbeddedPostgresError(f"cannot reach embedded PostgreSQL: {check.stderr}")
        if check.stdout.strip() != "1":
            made = self._run([*psql, sql.create_database(DATABASE_NAME)])
            if made.returncode != 0:
                raise EmbeddedPostgresError(
                    f"creating database {DATABASE_NAME} failed: {made.stderr}"
                )

    def restart(self, mode: str = "fast") -> None:
        """Restart the server on the same port and settings (fault tests).
        ``-l``: without a log file the new postmaster would inherit, and hold
        open for good, the pipes this process reads pg_ctl's output from."""
        proc = self._run(["pg_ctl", "-D", str(self.pgdata), "-l", str(self.log_file),
                          "-m", mode, "-w", "-t", "60", "restart"])
        if proc.returncode != 0:
            raise EmbeddedPostgresError(f"PostgreSQL did not restart: {proc.stderr}")

    def stop(self) -> None:
        if not self.owned:
            return
        self._run(["pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "stop"])
        self.owned = False
