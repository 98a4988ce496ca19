"""Make Debian's Mininet importable from the project's venv, and nothing else of the system's.

Debian's ``mininet`` package installs its Python module for the system interpreter only
(``/usr/lib/python3/dist-packages/mininet``) together with the ``mnexec`` binary it drives. The
venv's interpreter (pyenv's, here) does not see ``dist-packages``, and exposing all of it
(``--system-site-packages``, or a ``.pth`` naming the folder) would put Debian's
``cryptography``, ``setuptools``, ``pip`` ... next to the venv's own. So this links the one
package into a folder of its own inside the venv and names that folder in a ``.pth`` file:

    .venv/system-mininet/mininet -> /usr/lib/python3/dist-packages/mininet
    .venv/lib/python3.11/site-packages/shadowgrad-system-mininet.pth  (that folder's path)

The ``.pth`` folder comes after site-packages on ``sys.path``, so a Mininet pip-installed into
the venv wins over it, and pip never writes through the link (nothing pip knows about points
there). Mininet's module is pure Python (standard library imports only); it is linked only where
its Python major version is the venv's and ``mnexec`` (from the same Debian package) is on
PATH. Idempotent; ``--remove`` undoes it. Run by ``make install`` with the venv's interpreter.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PTH = "shadowgrad-system-mininet.pth"
FOLDER = "system-mininet"
SYSTEM_PYTHON = "/usr/bin/python3"

_FIND = (
    "import os, sys, mininet.net as n; "
    "print(os.path.dirname(n.__file__)); print('%d.%d' % sys.version_info[:2]); print(n.VERSION)"
)


def system_mininet(python: str = SYSTEM_PYTHON) -> tuple[Path, str, str] | None:
    """(package folder, its interpreter's major.minor, Mininet's version) of the system
    interpreter's Mininet, or None where it has none."""
    if not Path(python).exists():
        return None
    try:
        r = subprocess.run(
            [python, "-I", "-c", _FIND], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.split()
    if r.returncode != 0 or len(lines) != 3:
        return None
    return Path(lines[0]), lines[1], lines[2]


def paths() -> tuple[Path, Path]:
    """(the .pth file, the folder it names) for the running interpreter's venv."""
    site = Path(sysconfig.get_paths()["purelib"])
    return site / PTH, Path(sys.prefix) / FOLDER


def link() -> str:
    pth, folder = paths()
    if sys.prefix == sys.base_prefix:
        return "not in a venv: nothing done (run it with the venv's python)"
    found = system_mininet()
    if found is None:
        remove()
        return (
            f"no Mininet for {SYSTEM_PYTHON} (Debian's 'mininet' package; 'sudo make deps'): "
            "the Mininet topology and its tests are unavailable"
        )
    pkg, pyver, version = found
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if pyver.split(".", 1)[0] != mine.split(".", 1)[0]:
        remove()
        return f"system Mininet is for Python {pyver}, the venv runs {mine}: not linked"
    if shutil.which("mnexec") is None:
        remove()
        return "system Mininet found but mnexec is not on PATH: not linked"
    folder.mkdir(exist_ok=True)
    target = folder / "mininet"
    if target.is_symlink() and target.readlink() != pkg:
        target.unlink()
    if not target.is_symlink():
        if target.exists():
            return f"{target} exists and is not a link: left alone"
        target.symlink_to(pkg, target_is_directory=True)
    want = f"{folder}\n"
    if not pth.exists() or pth.read_text() != want:
        pth.write_text(want)
    return f"Mininet {version} ({pkg}) importable from the venv via {pth.name}"


def remove() -> None:
    pth, folder = paths()
    pth.unlink(missing_ok=True)
    target = folder / "mininet"
    if target.is_symlink():
        target.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--remove", action="store_true", help="undo the link")
    args = p.parse_args(argv)
    if args.remove:
        remove()
        print("system-mininet: removed")
        return 0
    print(f"system-mininet: {link()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
