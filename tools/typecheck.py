"""Run mypy --strict over the shadowgrad namespace as it is installed.

The Python folders are mapped into one namespace with [tool.setuptools.package-dir]; mypy cannot
follow an editable install's import hook, so this builds a tree of symlinks under
build/typecheck/ that has the installed shape (shadowgrad/controller -> ../../controller, ...)
and checks that. Exit status is mypy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = cfg["tool"]["setuptools"]["package-dir"]
    tree = ROOT / "build" / "typecheck"
    shutil.rmtree(tree, ignore_errors=True)
    core = tree / "shadowgrad"
    core.mkdir(parents=True)
    for entry in (ROOT / mapping["shadowgrad"]).iterdir():
        # core's modules and its own subpackages (shadowgrad/testing/)
        if entry.suffix in (".py", ".typed") or (entry / "__init__.py").is_file():
            (core / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package != "shadowgrad":
            (tree / package.replace(".", os.sep)).symlink_to(ROOT / folder)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "-p",
        "shadowgrad",
    ]
    env = {**os.environ, "MYPYPATH": str(tree)}
    return subprocess.call(cmd, cwd=tree, env=env, timeout=900)


if __name__ == "__main__":
    sys.exit(main())
