"""Shared contracts live in core (issue 15, item 2).

* One dtype table: every module that needs dtype names, torch dtypes, wire codes or itemsizes
  uses the objects of :mod:`shadowgrad.dtypes` / :mod:`shadowgrad.torch_dtypes` (identity, not
  equal copies), and the table agrees with torch and with the wire enum.
* The trainer side imports only core: no module under ``trainer_hooks/`` imports a peer package
  (``shadowgrad.shadow``, ``shadowgrad.controller``, ``shadowgrad.p4target``,
  ``shadowgrad.bmv2_testbed``), save the listed exceptions.
* The shadow, the controller and the P4 software target import core, never each other, the
  trainer side or the testbed (issue 25): the testbed may import the target, the target never
  imports the testbed.
"""

from __future__ import annotations

import ast
import enum
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest
import torch

from shadowgrad import dtypes, torch_dtypes
from shadowgrad.dtypes import DTYPES, DType, DTypeInfo, UnknownDTypeError

ROOT = Path(__file__).resolve().parents[1]

#: the core tables: every dtype mapping of the project is one of these objects
CORE_TABLES: dict[str, object] = {
    "dtypes.DTYPES": dtypes.DTYPES,
    "dtypes.LAYOUT_ITEMSIZE": dtypes.LAYOUT_ITEMSIZE,
    "dtypes.WIRE_ITEMSIZE": dtypes.WIRE_ITEMSIZE,
    "dtypes.BY_CODE": dtypes.BY_CODE,
    "torch_dtypes.TORCH_DTYPES": torch_dtypes.TORCH_DTYPES,
    "torch_dtypes.LAYOUT_TORCH_DTYPES": torch_dtypes.LAYOUT_TORCH_DTYPES,
    "torch_dtypes.DTYPE_NAMES": torch_dtypes.DTYPE_NAMES,
    "torch_dtypes.GRAD_WIRE_DTYPES": torch_dtypes.GRAD_WIRE_DTYPES,
}

#: modules that need dtype codes: (module, attribute, the core table it must be)
ALIASES = [
    ("shadowgrad.wire", "DType", dtypes.DType),
    ("shadowgrad.wire", "_ITEMSIZE", dtypes.WIRE_ITEMSIZE),
    ("shadowgrad.layout", "DTYPE_ITEMSIZE", dtypes.LAYOUT_ITEMSIZE),
    ("shadowgrad.tensorstream", "_DTYPES", torch_dtypes.TORCH_DTYPES),
    ("shadowgrad.shadow.replay", "TORCH_DTYPES", torch_dtypes.LAYOUT_TORCH_DTYPES),
    ("shadowgrad.shadow.assembly", "_TORCH_DTYPES", torch_dtypes.LAYOUT_TORCH_DTYPES),
    ("shadowgrad.shadow.snapshot", "_DTYPES", torch_dtypes.TORCH_DTYPES),
    ("shadowgrad.trainer_hooks._plan", "_TORCH_DTYPES", torch_dtypes.LAYOUT_TORCH_DTYPES),
    ("shadowgrad.trainer_hooks.ring", "_WIRE_DTYPE", torch_dtypes.GRAD_WIRE_DTYPES),
]

#: every module that handles dtypes (scanned for private copies of a table)
DTYPE_MODULES = sorted(
    {m for m, _, _ in ALIASES}
    | {
        "shadowgrad.control_client",
        "shadowgrad.boxes",
        "shadowgrad.shadow.control",
        "shadowgrad.shadow.node",
        "shadowgrad.trainer_hooks._mirror",
        "shadowgrad.trainer_hooks._session",
    }
)


@pytest.mark.parametrize(
    ("module", "attr", "table"), ALIASES, ids=[f"{m}.{a}" for m, a, _ in ALIASES]
)
def test_modules_alias_the_core_tables(module: str, attr: str, table: object) -> None:
    got = getattr(importlib.import_module(module), attr)
    assert got is table, f"{module}.{attr} is a copy, not the core table"


def _is_dtype_key(k: object) -> bool:
    return isinstance(k, torch.dtype | DType) or (isinstance(k, str) and k in DTYPES)


def _is_dtype_value(v: object) -> bool:
    return isinstance(v, torch.dtype | DType | DTypeInfo)


def _dtype_tables(mod: ModuleType) -> Iterator[tuple[str, Mapping[object, object]]]:
    """Module-level mappings keyed by dtypes / dtype names, or holding dtypes."""
    for name, value in vars(mod).items():
        if name.startswith("__") or isinstance(value, type | enum.EnumMeta):
            continue
        if not isinstance(value, Mapping) or not value:
            continue
        if any(_is_dtype_key(k) or _is_dtype_value(v) for k, v in value.items()):
            yield name, value


@pytest.mark.parametrize("module", DTYPE_MODULES)
def test_no_private_dtype_tables(module: str) -> None:
    mod = importlib.import_module(module)
    core = {id(t) for t in CORE_TABLES.values()}
    copies = [name for name, table in _dtype_tables(mod) if id(table) not in core]
    assert not copies, f"{module} keeps its own dtype table(s) {copies}: alias the core ones"


def test_shadow_control_reexports_core() -> None:
    from shadowgrad import boxes, control_client, tensorstream
    from shadowgrad.shadow import control, replay

    for name in (
        "CHUNK_BYTES",
        "ControlError",
        "encode_states",
        "decode_states",
        "commit_to_json",
        "commit_from_json",
    ):
        assert getattr(control, name) is getattr(tensorstream, name), name
    for name in ("ShadowClient", "FetchResult", "FetchReply"):
        assert getattr(control, name) is getattr(control_client, name), name
    for name in (
        "box_states_from_full",
        "assemble_full",
        "ReplayError",
        "ReplayInputError",
        "BoxState",
    ):
        assert getattr(replay, name) is getattr(boxes, name), name
    assert issubclass(replay.ReplayOrderError, boxes.ReplayError)
    assert issubclass(replay.ReplayDivergedError, boxes.ReplayError)


# -- the table itself ---------------------------------------------------------------------------


def test_table_agrees_with_torch_and_the_wire_enum() -> None:
    for name, info in DTYPES.items():
        assert info.name == name
        t = torch_dtypes.TORCH_DTYPES[name]
        assert t is getattr(torch, name)
        assert torch.empty((), dtype=t).element_size() == info.itemsize, name
        assert torch_dtypes.DTYPE_NAMES[t] == name
        if info.wire is not None:
            assert info.wire.torch_name == name
            assert info.wire.itemsize == info.itemsize
            assert DType.from_name(name) is info.wire
    codes = [info.wire for info in DTYPES.values() if info.wire is not None]
    assert sorted(codes) == sorted(set(DType) - {DType.NONE}), "each wire code: one dtype"
    assert dtypes.WIRE_ITEMSIZE[DType.NONE] == 1
    layout = [n for n, info in DTYPES.items() if info.layout]
    assert list(dtypes.LAYOUT_ITEMSIZE) == layout == ["float32", "float16", "bfloat16", "float64"]
    assert list(torch_dtypes.LAYOUT_TORCH_DTYPES) == layout
    assert {torch_dtypes.TORCH_DTYPES[n]: DTYPES[n].wire for n in layout} == dict(
        torch_dtypes.GRAD_WIRE_DTYPES
    )
    # the wire codes are part of the format (the P4 headers are tested against them)
    assert {d.name: int(d) for d in DType} == {
        "NONE": 0,
        "FLOAT32": 1,
        "FLOAT16": 2,
        "BFLOAT16": 3,
        "FLOAT64": 4,
        "UINT8": 5,
    }


def test_tables_are_read_only() -> None:
    for name, table in CORE_TABLES.items():
        with pytest.raises(TypeError):
            table["float32"] = 0  # type: ignore[index]
        assert isinstance(table, Mapping), name


def test_lookups_name_the_unknown_dtype() -> None:
    assert dtypes.dtype_info("bfloat16").itemsize == 2
    assert dtypes.layout_itemsize("float64") == 8
    assert dtypes.wire_code("float16") is DType.FLOAT16
    assert torch_dtypes.torch_dtype("int64") is torch.int64
    assert torch_dtypes.layout_torch_dtype("float32") is torch.float32
    assert torch_dtypes.dtype_name(torch.bool) == "bool"
    with pytest.raises(UnknownDTypeError, match=r"unknown dtype 'float8'.*supported: float32"):
        dtypes.dtype_info("float8")
    with pytest.raises(UnknownDTypeError, match=r"'int64' is not a layout dtype"):
        dtypes.layout_itemsize("int64")
    with pytest.raises(UnknownDTypeError, match=r"'int32' has no wire code"):
        dtypes.wire_code("int32")
    with pytest.raises(UnknownDTypeError, match=r"unknown dtype 'complex64'"):
        torch_dtypes.torch_dtype("complex64")
    with pytest.raises(UnknownDTypeError, match=r"'uint8' is not a layout dtype"):
        torch_dtypes.layout_torch_dtype("uint8")
    with pytest.raises(UnknownDTypeError, match=r"torch.complex64 is not one shadowgrad handles"):
        torch_dtypes.dtype_name(torch.complex64)
    assert issubclass(UnknownDTypeError, ValueError)


def test_core_dtype_side_is_torch_free() -> None:
    """layout and wire stay standard library only: the name -> itemsize side of the table does
    not pull torch in."""
    import subprocess
    import sys

    code = (
        "import sys; import shadowgrad.dtypes, shadowgrad.layout, shadowgrad.wire; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# -- the trainer side imports only core -----------------------------------------------------------

PEERS = (
    "shadowgrad.shadow",
    "shadowgrad.controller",
    "shadowgrad.p4target",
    "shadowgrad.bmv2_testbed",
)

#: (file under trainer_hooks/, module) pairs allowed anyway, with the reason (none: the helper
#: that runs real shadow nodes in-process is shadowgrad.testing.cluster)
ALLOWED: set[tuple[str, str]] = set()


def _imports(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports (anywhere in it), absolute; plus string arguments of
    ``importlib.import_module`` / ``__import__`` calls."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for alias in node.names:  # ``from shadowgrad import shadow``
                yield node.lineno, f"{mod}.{alias.name}"
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if (
                name in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield node.lineno, node.args[0].value


def test_trainer_hooks_import_no_peer_package() -> None:
    folder = ROOT / "trainer_hooks"
    files = sorted(folder.rglob("*.py"))
    assert files
    found: set[tuple[str, str]] = set()
    bad: list[str] = []
    for path in files:
        rel = path.relative_to(folder)
        package = ".".join(("shadowgrad", "trainer_hooks", *rel.parent.parts))
        for line, mod in _imports(path, package):
            if any(mod == p or mod.startswith(p + ".") for p in PEERS):
                ok = [
                    (f, m)
                    for f, m in ALLOWED
                    if f == rel.as_posix() and (mod == m or mod.startswith(m + "."))
                ]
                if ok:
                    found.update(ok)
                else:
                    bad.append(f"trainer_hooks/{rel}:{line}: {mod}")
    assert not bad, "the trainer side must import only core:\n" + "\n".join(bad)
    assert found == ALLOWED, f"stale exceptions, drop them from ALLOWED: {ALLOWED - found}"


def test_import_scan_sees_every_form(tmp_path: Path) -> None:
    """The scan above is not blind: each way of importing a peer package is caught."""
    src = tmp_path / "m.py"
    src.write_text(
        "import shadowgrad.shadow.control\n"
        "from shadowgrad.shadow.replay import assemble_full\n"
        "from shadowgrad import shadow\n"
        "from ... import controller\n"
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('shadowgrad.bmv2_testbed.runner')\n",
        encoding="utf-8",
    )
    mods = {m for _, m in _imports(src, "shadowgrad.trainer_hooks.sub")}
    assert {
        "shadowgrad.shadow.control",
        "shadowgrad.shadow.replay",
        "shadowgrad.shadow",
        "shadowgrad.controller",
        "shadowgrad.bmv2_testbed.runner",
    } <= mods


#: (file, module) imports of another package allowed anyway, with the reason
PEER_ALLOWED = {
    # `shadowgrad switch program` with switch.target = "p4target" compiles p4/ with the
    # software target's compiler (where a user of real bmv2 runs p4c), through the testbed's
    # cached compile of the product program, imported lazily there
    ("controller/_cmd.py", "shadowgrad.bmv2_testbed.inband"),
}


@pytest.mark.parametrize("peer", ["shadow", "controller", "p4target"])
def test_peer_packages_import_no_other_peer(peer: str) -> None:
    """DESIGN §1: core <- shadow, trainer_hooks, controller, p4target <- bmv2_testbed. The shadow,
    the controller and the P4 software target import core, never each other (nor the trainer
    side or the testbed, but for :data:`PEER_ALLOWED`): the testbed runs the target, the target
    knows nothing of the testbed, and a switch needs no controller code to serve P4Runtime."""
    others = ("shadowgrad.shadow", "shadowgrad.controller", "shadowgrad.trainer_hooks")
    others += ("shadowgrad.p4target", "shadowgrad.bmv2_testbed")
    own = f"shadowgrad.{peer}"
    folder = ROOT / peer
    bad: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        package = ".".join(("shadowgrad", peer, *rel.parent.parts))
        for line, mod in _imports(path, package):
            if any(mod == p or mod.startswith(p + ".") for p in others if p != own):
                where = f"{peer}/{rel.as_posix()}"
                if not any(
                    f == where and (mod == m or mod.startswith(m + ".")) for f, m in PEER_ALLOWED
                ):
                    bad.append(f"{where}:{line}: {mod}")
    assert not bad, f"{peer} must import only core:\n" + "\n".join(bad)


#: the library's folders (core and its peers); test support (shadowgrad/testing/) is not library
LIBRARY = {
    "shadowgrad": "shadowgrad",
    "shadow": "shadowgrad.shadow",
    "controller": "shadowgrad.controller",
    "trainer_hooks": "shadowgrad.trainer_hooks",
    "p4target": "shadowgrad.p4target",
    "bmv2_testbed": "shadowgrad.bmv2_testbed",
}


def test_no_library_module_imports_test_support() -> None:
    """Test support lives in shadowgrad.testing (issue 25): tests, benchmarks and tools import it,
    no library module does (a training job, a shadow or a controller never needs it)."""
    bad: list[str] = []
    seen = 0
    for folder, top in LIBRARY.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            if folder == "shadowgrad" and rel.parts[0] == "testing":
                continue
            seen += 1
            package = ".".join((top, *rel.parent.parts))
            for line, mod in _imports(path, package):
                if mod == "shadowgrad.testing" or mod.startswith("shadowgrad.testing."):
                    bad.append(f"{folder}/{rel.as_posix()}:{line}: {mod}")
    assert seen > 50
    assert not bad, "library code imports test support:\n" + "\n".join(bad)


def test_import_rules_cover_every_mapped_folder() -> None:
    """Every folder of the package mapping is scanned above: a new top-level package (the P4
    target split out of the testbed, issue 25) cannot slip past the import rules."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = cfg["tool"]["setuptools"]["package-dir"]
    assert {folder: pkg for pkg, folder in mapping.items()} == LIBRARY
    assert set(PEERS) == {pkg for pkg in mapping if pkg.count(".") == 1} - {
        "shadowgrad.trainer_hooks"
    }
