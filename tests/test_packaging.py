"""Packaging: one namespace, a lean trainer-side import, the console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("grpc", "google.protobuf", "scapy", "mininet", "p4runtime_sh", "p4")
LEAN = (
    "shadowgrad",
    "shadowgrad.wire",
    "shadowgrad.layout",
    "shadowgrad.config",
    "shadowgrad.errors",
    "shadowgrad.trainer_hooks",
)

CHECK = textwrap.dedent(
    """
    import importlib, sys
    HEAVY = {heavy!r}
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {{h.split(".")[0] for h in HEAVY}} and name != "google":
                raise ImportError("blocked heavy import: " + name)
            return None
    if {block!r}:
        sys.meta_path.insert(0, Block())
    for m in {lean!r}:
        importlib.import_module(m)
    bad = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not bad, bad
    print("lean ok")
    """
)


def _run(code: str, python: str = sys.executable, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=120, cwd="/", **kw
    )  # type: ignore[call-overload]


@pytest.mark.parametrize("block", [False, True], ids=["installed", "heavy-blocked"])
def test_trainer_side_imports_are_lean(block: bool) -> None:
    """Core and trainer hooks import without grpc/protobuf/scapy/mininet, even if present."""
    out = _run(CHECK.format(heavy=HEAVY, lean=LEAN, block=block))
    assert out.returncode == 0, out.stderr
    assert "lean ok" in out.stdout


def test_subpackages_map_into_one_namespace() -> None:
    import shadowgrad.bmv2_testbed
    import shadowgrad.controller
    import shadowgrad.p4target
    import shadowgrad.shadow
    import shadowgrad.trainer_hooks

    for mod, folder in [
        (shadowgrad.controller, "controller"),
        (shadowgrad.shadow, "shadow"),
        (shadowgrad.trainer_hooks, "trainer_hooks"),
        (shadowgrad.p4target, "p4target"),
        (shadowgrad.bmv2_testbed, "bmv2_testbed"),
    ]:
        assert Path(mod.__file__ or "").resolve().parent == ROOT / folder
        assert isinstance(mod.__all__, list)


def test_console_script_lists_subcommands() -> None:
    exe = shutil.which("shadowgrad", path=str(Path(sys.executable).parent))
    assert exe, "console script 'shadowgrad' not installed next to the interpreter"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from shadowgrad.cli import COMMANDS

    for name in COMMANDS:
        assert name in out.stdout
    # --help must stay lean as well
    heavy = ("grpc", "scapy", "torch")
    probe = _run(
        "import sys; from shadowgrad.cli import build_parser; build_parser(); "
        f"bad=[m for m in sys.modules if m.split('.')[0] in {heavy!r}]; "
        "assert not bad, bad"
    )
    assert probe.returncode == 0, probe.stderr


@pytest.mark.slow
def test_base_install_in_a_fresh_venv(tmp_path: Path) -> None:
    """`pip install .` (no extras) in a new venv: imports work and pull in nothing heavy."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # torch pinned first, as the Makefile does: the CPU wheel on local disk
    for args in (["torch==2.13.0"], [str(ROOT)]):
        r = subprocess.run(
            [py, "-m", "pip", "install", "-q", *args],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    frozen = subprocess.run(
        [py, "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120
    ).stdout.lower()
    for pkg in ("grpcio", "protobuf", "scapy", "p4runtime", "mininet"):
        assert pkg not in frozen, f"base install pulled {pkg}"
    out = _run(CHECK.format(heavy=HEAVY, lean=LEAN, block=False), python=py)
    assert out.returncode == 0, out.stderr
    cli = subprocess.run(
        [str(venv / "bin" / "shadowgrad"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert cli.returncode == 0, cli.stderr
    assert "spec" in cli.stdout and "layout" in cli.stdout
    # the P4 target's include files came with the wheel (package data, not the checkout)
    inc = subprocess.run(
        [
            py,
            "-c",
            "from shadowgrad.p4target.frontend.lexer import BUILTIN_INCLUDE as b;"
            "print(b.parent.parent.parent, sorted(p.name for p in b.glob('*.p4')))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert inc.returncode == 0, inc.stderr
    assert "site-packages" in inc.stdout and "['core.p4', 'v1model.p4']" in inc.stdout, inc.stdout


def test_every_python_folder_is_a_listed_package() -> None:
    """A wheel (not only the editable install) must carry every subpackage."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    for package, folder in cfg["package-dir"].items():
        for init_dir in {p.parent for p in (ROOT / folder).rglob("*.py")}:
            rel = init_dir.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts])
            assert (init_dir / "__init__.py").exists(), f"{init_dir} has no __init__.py"
            assert name in listed, f"{name} missing from [tool.setuptools] packages"


def test_p4_include_files_are_package_data() -> None:
    """The P4 target's own core.p4/v1model.p4 (what ``#include <v1model.p4>`` finds) travel in
    the wheel as package data of ``shadowgrad.p4target.p4include``, a data-only package listed
    in ``packages`` (unlisted, setuptools warns on every install that it would be ignored)."""
    import tomllib

    from shadowgrad.p4target.frontend.lexer import BUILTIN_INCLUDE

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "shadowgrad.p4target.p4include" in cfg["packages"]
    folder = Path(cfg["package-dir"]["shadowgrad.p4target"]) / "p4include"
    patterns = cfg["package-data"]["shadowgrad.p4target.p4include"]
    shipped = {f for pat in patterns for f in (ROOT / folder).glob(pat)}
    assert ROOT / folder == BUILTIN_INCLUDE
    assert {f.name for f in shipped} >= {"core.p4", "v1model.p4"}
    assert shipped == set(BUILTIN_INCLUDE.glob("*.p4"))
