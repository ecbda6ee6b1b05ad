"""The distribution installs one top-level package, ``polyport``, and the code
is lint- and type-clean under that name."""

from __future__ import annotations

import os
import re
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
                          check=False, capture_output=True, text=True, timeout=120)
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
        check=False, cwd=REPO, env={**os.environ, "MYPYPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# The role files every protocol package has (docs/architecture.md) that are
# sans-IO: the modules mypy checks as --strict would, with core/.
SANS_IO_ROLES = ("frames", "wire", "state", "connection", "errors")


def _strict_override() -> dict:
    overrides = _pyproject()["tool"]["mypy"]["overrides"]
    # ``strict`` in an override turns strict on for every module, not these.
    assert not any("strict" in o for o in overrides)
    [strict] = [o for o in overrides if "polyport.core" in o["module"]]
    return strict


def _matches(pattern: str, module: str) -> bool:
    """mypy's module pattern: a ``*`` component stands for any number of them."""
    regex = re.escape(pattern).replace(r"\.\*", r"(\.[^.]+)*")
    return re.fullmatch(regex, module) is not None


def test_mypy_is_strict_for_core_and_the_sans_io_modules() -> None:
    from mypy.main import define_options
    from mypy.options import PER_MODULE_OPTIONS

    strict = _strict_override()
    _parser, _names, strict_flags = define_options()
    for flag, value in strict_flags:
        if flag in PER_MODULE_OPTIONS:
            assert strict.get(flag) == value, flag
        else:  # global only (warn_redundant_casts): set for every module
            assert _pyproject()["tool"]["mypy"].get(flag) == value, flag
    modules = ["polyport.core"] + [
        "polyport.core." + f.stem for f in (REPO / "core").glob("*.py") if f.stem != "__init__"
    ] + [
        f"polyport.protocols.{f.parent.name}.{f.stem}"
        for role in SANS_IO_ROLES
        for f in (REPO / "protocols").glob(f"*/{role}.py")
    ]
    assert len(modules) > 40
    for module in modules:
        assert any(_matches(p, module) for p in strict["module"]), module
    assert not _matches("polyport.core.*", "polyport.gateway.app")


@pytest.mark.parametrize("root", SOURCE_ROOTS)
def test_bare_folder_names_are_not_importable_by_accident(root: str) -> None:
    # Only the namespace name resolves from an unrelated directory.
    done = subprocess.run(
        [sys.executable, "-c", f"import polyport.{root}; import importlib.util as u; "
         f"print(u.find_spec('{root}') is None)"],
        check=False, cwd="/", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
