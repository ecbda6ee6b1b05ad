"""The distribution installs one top-level package, ``polyport``, and the code
is lint- and type-clean under that name."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core", "protocols", "gateway", "pipeline", "migrations")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_source_package_is_listed() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    found = sorted(
        "polyport." + ".".join(init.parent.relative_to(REPO).parts)
        for root in SOURCE_ROOTS
        for init in (REPO / root).rglob("__init__.py")
    )
    assert sorted(setuptools["packages"]) == found
    assert setuptools["package-dir"] == {f"polyport.{r}": r for r in SOURCE_ROOTS}


def test_wheel_holds_only_polyport(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps",
         "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=240,
    )
    (wheel,) = tmp_path.glob("polyport-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"polyport"}
    assert "polyport/__init__.py" not in names  # an implicit namespace package
    for needed in ("polyport/gateway/http/static/index.html",
                   "polyport/migrations/script.py.mako",
                   "polyport/migrations/versions/0001_initial.py"):
        assert needed in names
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(top_level).decode().split() == ["polyport"]


def test_ruff_is_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    # The folders are mapped into the namespace at install time; mypy needs to
    # see the same layout on disk, so build it from symlinks.
    tree = tmp_path / "polyport"
    tree.mkdir()
    for root in SOURCE_ROOTS:
        (tree / root).symlink_to(REPO / root)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--namespace-packages",
         "--explicit-package-bases", "-p", "polyport", "-p", "bench"],
        cwd=REPO, env={**os.environ, "MYPYPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("root", SOURCE_ROOTS)
def test_bare_folder_names_are_not_importable_by_accident(root: str) -> None:
    # Only the namespace name resolves from an unrelated directory.
    done = subprocess.run(
        [sys.executable, "-c", f"import polyport.{root}; import importlib.util as u; "
         f"print(u.find_spec('{root}') is None)"],
        cwd="/", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
