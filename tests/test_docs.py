"""The code blocks of README.md and docs/**/*.md run in the suite, so they stay
true (issue 29 item 9).

* ```python blocks run: imports as they are, client examples (top-level
  ``await``, default host and port) against a real gateway whose listener's
  port replaces the documented default.  A block that cannot run here is
  listed in PYTHON_NOT_RUN with the reason, and still compiled.
* ```sh blocks: every ``polyport`` line is parsed by the real argument
  parser, so a renamed or removed flag fails; the commands that touch nothing
  outside a test cluster run as subprocesses on a test database and must exit
  0.  Every other program, and every polyport command that is not run, is
  listed below with the reason: a new block is checked by default.
* ```toml blocks are configuration files load_config accepts; ```json blocks
  parse.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from polyport.gateway.cli.parser import build_parser
from polyport.gateway.config import DEFAULT_PORTS, load_config

if TYPE_CHECKING:
    from polyport.gateway.app import Gateway

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
POLYPORT = {"polyport", ".venv/bin/polyport"}
COMMAND_TIMEOUT = 60.0

# Python blocks that do not run in the suite: (file, first line) -> why.
PYTHON_NOT_RUN = {
    ("docs/pipeline.md", 'spark.read.option("basePath", "/data/events").parquet("/data/events")'):
        "reads an export in the user's own SparkSession (tests/pipeline check the "
        "export's layout)",
}

# Programs in shell blocks that the suite does not run -> why.
PROGRAMS_NOT_RUN = {
    "python3.11": "creates a virtual environment (the suite runs in one)",
    "pip": "installs packages",
    ".venv/bin/pip": "installs packages",
    ".venv/bin/python": "runs the whole suite or a bench (tests/bench run the benches)",
    "apt-get": "installs system packages",
    "mkdir": "part of the TLS walk-through, which writes keys in the operator's "
             "directory (tests/tlspki.py makes the suite's own CA)",
    "cd": "part of the TLS walk-through",
    "openssl": "part of the TLS walk-through",
    "printf": "part of the TLS walk-through",
    "chmod": "part of the TLS walk-through",
    "curl": "needs a gateway with an admin token (tests/gateway/test_admin.py)",
    "pg_dump": "backs up a production database with the server's own client tools",
    "pg_restore": "overwrites a database",
    "spark-submit": "needs a Spark cluster",
    "export": "sets a variable in the reader's shell",
}

# polyport commands that run on a test database, by (command, action, --sql).
RUN = {
    ("migrate", "upgrade", False),  # at head already: a no-op
    ("migrate", "upgrade", True),   # offline: prints the script
    ("migrate", "downgrade", True),
    ("migrate", "current", False),
    ("migrate", "history", False),
    ("migrate", "check", False),
    ("users", "list", False),
    ("keys", "list", False),
    ("binders", "list", False),
    ("subscriptions", "list", False),
    ("status", None, False),        # against a gateway from gateway_factory
}
# polyport commands that do not run here -> why.
NOT_RUN = {
    ("serve", None, False): "runs until stopped (tests/gateway start serve processes)",
    ("migrate", "downgrade", False): "REV is a placeholder, and it asks first",
    ("migrate", "stamp", False): "records a revision that was not applied",
    ("keys", "create", False): "names a user the docs invent",
    ("keys", "remove", False): "'PUBLIC-KEY' is a placeholder",
    ("pipeline", "export", False): "needs PySpark and Java (tests/pipeline)",
    ("pipeline", "stats", False): "needs PySpark and Java (tests/pipeline)",
    ("pipeline", "rebuild-binder", False): "needs PySpark and Java (tests/pipeline)",
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the block's first line of code
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0] if self.text.strip() else ""


_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2).lower()
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        assert end < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: fence never closed"
        body = "\n".join(line[indent:] for line in lines[i + 1:end])
        out.append(Block(path, i + 2, lang, body + "\n"))
        i = end + 1
    return out


BLOCKS = [b for path in DOCS for b in read_blocks(path)]


def blocks(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in langs]


# --- python ------------------------------------------------------------------------


def _not_run_key(block: Block) -> tuple[str, str]:
    return (str(block.path.relative_to(ROOT)), block.first_line)


def _ports_named(block: Block) -> dict[str, int]:
    """The listeners whose default port the block uses, by name."""
    return {name: port for name, port in DEFAULT_PORTS.items()
            if re.search(rf"\b{port}\b", block.text)}


async def _run_python(source: str, where: str) -> None:
    code = compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, {"__name__": "__docs__"})
    if asyncio.iscoroutine(result):  # top-level await: the block is an async body
        await asyncio.wait_for(result, COMMAND_TIMEOUT)


def test_python_not_run_names_blocks_that_exist() -> None:
    python = {_not_run_key(b): b for b in BLOCKS if b.lang == "python"}
    assert set(PYTHON_NOT_RUN) <= set(python), "PYTHON_NOT_RUN names a block that is gone"
    for key in PYTHON_NOT_RUN:  # not run, but still Python
        compile(python[key].text, python[key].where, "exec")


@pytest.mark.parametrize("block", [
    p for p in blocks("python")
    if _not_run_key(p.values[0]) not in PYTHON_NOT_RUN and not _ports_named(p.values[0])])
async def test_python_block_runs(block: Block) -> None:
    await _run_python(block.text, block.where)


@pytest.mark.parametrize("block", [
    p for p in blocks("python")
    if _not_run_key(p.values[0]) not in PYTHON_NOT_RUN and _ports_named(p.values[0])])
async def test_client_example_runs(
    block: Block, gateway_factory: Callable[..., Awaitable[Gateway]]
) -> None:
    assert "127.0.0.1" in block.text, f"{block.where}: examples use the default host"
    gw = await gateway_factory()
    source = block.text
    for name, port in _ports_named(block).items():
        source = re.sub(rf"\b{port}\b", str(gw.listeners[name].address[1]), source)
    # An example that logs in does so as a user the reader would have added.
    for user, password in re.findall(r'username="([^"]+)", password="([^"]+)"', source):
        await gw.store.users.add(user, password)
    await _run_python(source, block.where)


# --- sh ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]  # without leading VAR=value assignments


_OPERATORS = {"&&", "||", ";", "|", "&"}
_REDIRECT = re.compile(r"^\d?(>>?|<)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_commands(block: Block) -> list[Command]:
    """Each simple command of a shell block: continuation lines joined,
    comments, redirections and leading variable assignments left out."""
    text = block.text.replace("\\\n", " ")
    out: list[Command] = []
    for n, line in enumerate(text.splitlines()):
        words = shlex.split(line, comments=True)
        current: list[str] = []
        parts: list[list[str]] = []
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in _OPERATORS:
                parts.append(current)
                current = []
            elif _REDIRECT.match(word):
                skip = True  # the file name after it
            else:
                current.append(word)
        parts.append(current)
        for part in parts:
            words = part
            while words and _ASSIGNMENT.match(words[0]):
                words = words[1:]
            if words:
                out.append(Command(f"{block.where} (+{n})", tuple(words)))
    return out


SHELL_COMMANDS = [c for b in BLOCKS if b.lang in SHELL for c in shell_commands(b)]


def parse(cmd: Command) -> Any:
    """The namespace polyport's parser makes of the command; a usage error fails."""
    try:
        return build_parser().parse_args(list(cmd.argv[1:]))
    except SystemExit as exc:
        pytest.fail(f"{cmd.where}: polyport rejects {shlex.join(cmd.argv)} (exit {exc.code})")


def run_key(args: Any) -> tuple[str, str | None, bool]:
    return (args.command, getattr(args, "action", None), bool(getattr(args, "sql", False)))


def test_every_shell_line_is_checked() -> None:
    """Each command is polyport's (parsed here) or a program listed with why it
    does not run; each polyport command is run or listed with why not."""
    assert SHELL_COMMANDS, "no shell blocks found"
    unknown = [f"{c.where}: {c.argv[0]}" for c in SHELL_COMMANDS
               if c.argv[0] not in POLYPORT and c.argv[0] not in PROGRAMS_NOT_RUN]
    assert not unknown, "run these in the suite or add them to PROGRAMS_NOT_RUN: " + str(unknown)
    unlisted = []
    for c in SHELL_COMMANDS:
        if c.argv[0] in POLYPORT:
            key = run_key(parse(c))
            if key not in RUN and key not in NOT_RUN:
                unlisted.append(f"{c.where}: {shlex.join(c.argv)} {key}")
    assert not unlisted, "add these to RUN or NOT_RUN: " + str(unlisted)


def _key(cmd: Command) -> tuple[str, str | None, bool] | None:
    """run_key of a polyport command, None if it does not parse (the test above
    reports that)."""
    try:
        return run_key(build_parser().parse_args(list(cmd.argv[1:])))
    except SystemExit:
        return None


def runnable() -> list[Command]:
    return [c for c in SHELL_COMMANDS if c.argv[0] in POLYPORT and _key(c) in RUN]


async def run_polyport(argv: list[str], db_url: str, data_dir: Path) -> tuple[int, str]:
    """The installed console script as a subprocess on the test database, with
    a data directory of its own and no POLYPORT_* setting from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATA_DIR"] = str(data_dir)
    exe = Path(sys.executable).parent / "polyport"
    # The last --database-url wins: the docs' own URL is a placeholder.
    proc = await asyncio.create_subprocess_exec(
        str(exe), *argv, "--database-url", db_url, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode(errors="replace")


async def test_shell_commands_run(
    db_url: str, tmp_path: Path, gateway_factory: Callable[..., Awaitable[Gateway]]
) -> None:
    """Every command in RUN, in turn on one test database with a gateway
    serving it (``status`` asks that gateway); each must exit 0."""
    commands = runnable()
    assert {_key(c) for c in commands} >= {("migrate", "current", False),
                                           ("status", None, False)}
    gw = await gateway_factory()
    assert gw.http_address is not None
    host, port = gw.http_address[:2]
    failed = []
    for cmd in commands:
        argv = list(cmd.argv[1:])
        if _key(cmd) == ("status", None, False):
            argv += ["--host", host, "--http-port", str(port)]
        rc, output = await run_polyport(argv, db_url, tmp_path / "data")
        if rc != 0:
            failed.append(f"{cmd.where}: {shlex.join(cmd.argv)} exited {rc}:\n{output}")
    assert not failed, "\n".join(failed)


# --- configuration and data --------------------------------------------------------


@pytest.mark.parametrize("block", blocks("toml", "json"))
def test_data_block_parses(block: Block, tmp_path: Path) -> None:
    """A TOML block is a configuration file load_config accepts (every key a
    setting, every value valid); a JSON block parses."""
    if block.lang == "json":
        json.loads(block.text)
        return
    try:
        tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.where}: not TOML: {exc}")
    path = tmp_path / "polyport.toml"
    path.write_text(block.text)
    path.chmod(0o600)  # as the docs ask of a file that may hold admin_token
    load_config(str(path), env={})  # ConfigError names an unknown key or a bad value


# --- counts ------------------------------------------------------------------------

_COUNT = re.compile(r"\b(two|three|four|five|six|seven|eight|nine|ten) (?:native |wire )*"
                    r"(?:protocols|listeners)\b", re.IGNORECASE)
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
            "ten")


def test_protocol_counts_match_the_listeners() -> None:
    """`polyport --help` and the docs once said five protocols; there is a
    listener for each of DEFAULT_PORTS."""
    expected = _NUMBERS[len(DEFAULT_PORTS)]
    texts = {"polyport --help": build_parser().format_help()}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in DOCS})
    said = [(where, m.group(0)) for where, text in texts.items() for m in _COUNT.finditer(text)]
    assert "polyport --help" in {where for where, _ in said}
    wrong = [(where, words) for where, words in said
             if words.split()[0].lower() != expected]
    assert not wrong, f"there are {expected} listeners: {wrong}"


def test_changelog_has_the_version() -> None:
    """The upgrade steps send operators to CHANGELOG.md: it has an entry for
    the version pyproject.toml installs, and a section for what is not
    released yet."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[:1] == ["Unreleased"] and version in headings, headings
    assert "CHANGELOG.md" in (ROOT / "docs" / "operations.md").read_text()
