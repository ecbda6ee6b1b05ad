"""The import structure: the layers as import-linter contracts (in
pyproject.toml: core below protocols below the gateway; each protocol package
on the shared protocol layer only; sans-IO modules free of asyncio, zmq and
aiohttp; inside the gateway, the CLI on top and the transports at the bottom)
and no import cycle among polyport's modules."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("polyport.core", "polyport.protocols", "polyport.gateway", "polyport.pipeline",
         "polyport.migrations")
SANS_IO = ("frames", "wire", "state", "connection")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # Imports under TYPE_CHECKING never run: they make no cycle.
    return grimp.build_graph(*ROOTS, exclude_type_checking_imports=True)


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], check=False, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_sans_io_contract_names_every_role_module(graph: grimp.ImportGraph) -> None:
    # The contract's wildcards must keep matching files (a rename would make
    # it hold vacuously).
    for role in SANS_IO:
        matched = fnmatch.filter(graph.modules, f"polyport.protocols.*.{role}")
        assert len(matched) >= 4, (role, matched)


def cycles(edges: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_cycles() -> None:
    edges = {"a": ["b"], "b": ["c", "d"], "c": ["a"], "d": ["e"], "e": ["d"], "f": ["a"]}
    assert cycles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    # Imports inside functions count: a lazy import only hides a cycle.
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    found = cycles(edges)
    details = [
        f"{a} -> {b} (line {graph.get_import_details(importer=a, imported=b)[0]['line_number']})"
        for component in found for a in component for b in edges[a] if b in component
    ]
    assert found == [], "\n".join(details)


def loaded(modules: str, of: set[str]) -> list[str]:
    """Which of the top-level packages ``of`` importing ``modules`` loads, in
    a fresh interpreter."""
    probe = (f"import json, sys, {modules}\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "
             f"set({sorted(of)!r}))))")
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


def test_serving_and_the_cli_load_no_alembic() -> None:
    # Alembic and SQLAlchemy are for migrating: loading them cost every
    # gateway process, worker and CLI command about half a second of CPU at
    # start (docs/performance.md, session 32).  What a worker and the CLI
    # import must not pull them in again.
    serving = ("polyport.gateway.app, polyport.gateway.cli.main, "
               "polyport.gateway.process.worker, polyport.gateway.process.chain")
    assert loaded(serving, {"alembic", "sqlalchemy"}) == []


def test_the_cli_loads_no_http_client_until_a_command_needs_one() -> None:
    # aiohttp was 0.2 s of every CLI command's start; only `status` and
    # `connections` talk to a running gateway.
    assert loaded("polyport.gateway.cli.main", {"aiohttp"}) == []
