"""The embedded PostgreSQL: a private cluster under the polyport data directory.

Used when no database URL is configured, and by the test suite for its
throwaway cluster.  Binaries come from the system (``/usr/lib/postgresql/*/bin``
or ``PATH``) or, failing that, from the ``pgserver`` wheel.

The cluster listens on 127.0.0.1 and on a unix socket in the data directory,
both asking for the password (scram-sha-256), which is kept in the data
directory with mode 0600.  The data directory is 0700.

PostgreSQL refuses to run as root, so as root the cluster runs as a
dedicated system account, ``polyport`` (created if missing), with no
supplementary groups: not the distribution's ``postgres`` account, which
other clusters and their administrators share.  That account needs search
permission (x) on the data directory and on every directory above it; where
it has none (``/root`` is 0700, and so is the data directory), polyport adds
an ACL entry granting that one account search and nothing more, rather than
opening the directory to every user (o+x).
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
from polyport.gateway.process.data_dir import make_data_dir, write_private
from polyport.gateway.process.posix_acl import grant_search, may_search

log = logging.getLogger("polyport.embedded_pg")

DATABASE_NAME = "polyport"
SUPERUSER = "polyport"
# The system account the cluster runs as when polyport runs as root.
ACCOUNT = "polyport"
# Client authentication for socket and TCP connections alike.
AUTH_METHOD = "scram-sha-256"

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
    try:
        return pwd.getpwnam(ACCOUNT)
    except KeyError:
        pass
    made = subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--shell", "/usr/sbin/nologin", ACCOUNT],
        capture_output=True, text=True, check=False,  # the lookup below decides
    )
    try:  # another process may have created it first
        return pwd.getpwnam(ACCOUNT)
    except KeyError:
        raise EmbeddedPostgresError(
            f"cannot create the system account {ACCOUNT!r} to run PostgreSQL as "
            f"(useradd: {made.stderr.strip() or made.returncode}); create it, or run polyport "
            "as an unprivileged user"
        ) from None


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if not root.exists():
        return
    os.lchown(root, uid, gid)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(parent, name), uid, gid)


def _secure_hba(text: str) -> str:
    """pg_hba.conf with every ``trust`` method (older versions let local
    socket connections in without a password) replaced by AUTH_METHOD."""
    out = []
    for line in text.splitlines(keepends=True):
        body, hash_, comment = line.partition("#")
        fields = body.split()
        if fields and fields[-1] == "trust":
            head, _, tail = body.rpartition("trust")
            out.append(head + AUTH_METHOD + tail + hash_ + comment)
        else:
            out.append(line)
    return "".join(out)


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

    def _run(self, args: list[str], *, password: bool = False,
             **kw: object) -> subprocess.CompletedProcess[str]:
        """A PostgreSQL program as the cluster's account; ``password``: it
        connects, with the superuser's password (in its environment, which
        only that account and root can read)."""
        bins = find_bin_dir(self.bin_dir)
        cmd = [str(bins / args[0]), *args[1:]]
        extra: dict[str, object] = {}
        if self.user is not None:
            # No supplementary groups: root's would let the server read what
            # group root may read.
            extra = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if password:
            env["PGPASSWORD"] = self.password
        # Each caller reads the return code itself.
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd="/", check=False,
            **extra, **kw,  # type: ignore[call-overload]
        )
        return proc  # type: ignore[no-any-return]

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def _reach(self) -> None:
        """Let the cluster's account search the data directory and every
        directory above it, each through an ACL entry for that account alone
        where it has no such permission yet."""
        assert self.user is not None
        name = self.user.pw_name
        for directory in (self.data_dir, *self.data_dir.parents):
            if may_search(directory, self.user):
                continue
            try:
                grant_search(directory, self.user)
            except OSError as exc:
                raise EmbeddedPostgresError(
                    f"the account {name!r} that runs the embedded PostgreSQL cannot reach "
                    f"{self.data_dir}: {directory} gives it no search permission and an ACL "
                    f"entry could not be added ({exc.strerror}); run 'setfacl -m u:{name}:x "
                    f"{directory}', or choose a --data-dir it can reach (e.g. under "
                    "/var/lib/polyport)"
                ) from None
            log.info("granted the %s account search permission (x) on %s through an ACL "
                     "entry, so it can reach %s; nobody else gains access",
                     name, directory, self.data_dir)

    def _close_data_dir(self) -> None:
        """0700 for a data directory an older version made with the default
        mode (0755): it holds the cluster's password.  (An ACL mask shows as
        group x: that is :meth:`_reach`'s entry, not the group's.)"""
        st = self.data_dir.stat()
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == os.geteuid() and mode & 0o067:
            self.data_dir.chmod(mode & 0o700)
            log.info("%s: mode %04o -> %04o (it holds the database password)",
                     self.data_dir, mode, mode & 0o700)
        # pg_ctl made the log with the umask; it names users and statements.
        if self.log_file.is_file() and stat.S_IMODE(self.log_file.stat().st_mode) & 0o077:
            self.log_file.chmod(0o600)

    def _adopt(self) -> None:
        """A cluster an older version ran as another account (the shared
        ``postgres``): hand it to the dedicated one.  Only while no server
        runs on it."""
        assert self.user is not None
        owner = self.pgdata.stat().st_uid
        if owner == self.user.pw_uid:
            return
        try:
            was = pwd.getpwuid(owner).pw_name
        except KeyError:
            was = str(owner)
        log.info("moving the embedded PostgreSQL in %s from account %s to %s",
                 self.data_dir, was, self.user.pw_name)
        for tree in (self.pgdata, self.run_dir, self.log_file):
            _chown_tree(tree, self.user.pw_uid, self.user.pw_gid)

    def _secure_hba(self) -> None:
        """Older versions let local socket connections in without a password:
        ask for it there too.  Only while no server runs (it reads the file
        at start)."""
        hba = self.pgdata / "pg_hba.conf"
        text = hba.read_text()
        secured = _secure_hba(text)
        if secured != text:
            hba.write_text(secured)  # in place: its owner and mode 0600 stay
            log.info("%s: local connections now need the password (%s instead of trust)",
                     hba, AUTH_METHOD)

    # --- lifecycle ---------------------------------------------------------

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, port: int) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{port}/{DATABASE_NAME}"

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> None:
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.pgdata)
        self._chown(self.run_dir)
        password = secrets.token_urlsafe(24)
        write_private(self.password_file, password + "\n")
        pwfile = self.run_dir / "initdb-pw"
        write_private(pwfile, password + "\n")
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
                    f"--auth-local={AUTH_METHOD}",
                    f"--auth-host={AUTH_METHOD}",
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
        make_data_dir(self.data_dir)
        self._close_data_dir()
        if self.user is not None:
            self._reach()
        if not self.initialized():
            self.init()
        port = self.running_port()
        if port is not None:
            self.owned = False
            return self.url(port)
        if self.user is not None:
            self._adopt()
        self._secure_hba()
        port = self.port or _free_port()
        settings = {**(FAST_SETTINGS if self.fast else DEFAULT_SETTINGS), **self.settings}
        opts = [
            "-c listen_addresses=127.0.0.1",
            f"-p {port}",
            f"-c unix_socket_directories={self.run_dir}",
            *(f"-c {k}={v}" for k, v in settings.items()),
        ]
        if not self.log_file.exists():
            # The server's log: its account writes it, nobody else reads it.
            os.close(os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
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
        check = self._run([*psql, sql.database_exists(DATABASE_NAME)], password=True)
        if check.returncode != 0:
            raise EmbeddedPostgresError(f"cannot reach embedded PostgreSQL: {check.stderr}")
        if check.stdout.strip() != "1":
            made = self._run([*psql, sql.create_database(DATABASE_NAME)], password=True)
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
