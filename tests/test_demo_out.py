"""``shadowgrad demo --out``: a run reads only what it wrote. ``prepare_out`` clears a previous
demo's artefacts from the folder (the cache kept) and refuses, deleting nothing, a non-empty
folder that is not a demo's output (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowgrad.bmv2_testbed.runner import OUT_MARKER, prepare_out
from shadowgrad.errors import ShadowgradError


def _demo_out(out: Path, *, marker: bool = True) -> None:
    """What a demo leaves in ``out``: reports, plots, run folders, a cache, a temporary file."""
    for d in ("reference", "plain", "run"):
        (out / d).mkdir(parents=True)
        (out / d / "rank0-0.log").write_text("step 0 loss 0x1p+0 dt 0.1 wall 1.0\n")
    for f in ("topology.json", "report.json", "loss.png", "lag.png", ".report.json.7.ab12.tmp"):
        (out / f).write_text("{}")
    (out / ".cache" / "shadowgrad" / "reference" / "k").mkdir(parents=True)
    (out / ".cache" / "shadowgrad" / "reference" / "k" / "final.pt").write_bytes(b"x")
    if marker:
        (out / OUT_MARKER).write_text("")


def test_a_new_or_empty_folder_is_marked(tmp_path: Path) -> None:
    assert prepare_out(tmp_path / "new" / "out") == []
    assert (tmp_path / "new" / "out" / OUT_MARKER).exists()
    (tmp_path / "empty").mkdir()
    assert prepare_out(tmp_path / "empty") == []
    assert [p.name for p in (tmp_path / "empty").iterdir()] == [OUT_MARKER]


def test_a_demo_folder_is_cleared_but_its_cache_and_foreign_files_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _demo_out(out)
    (out / "notes.txt").write_text("mine")  # put there by the user, in a marked folder
    removed = prepare_out(out, out / ".cache" / "shadowgrad")
    assert removed == [
        ".report.json.7.ab12.tmp",
        "lag.png",
        "loss.png",
        "plain",
        "reference",
        "report.json",
        "run",
        "topology.json",
    ]
    assert sorted(p.name for p in out.iterdir()) == [".cache", OUT_MARKER, "notes.txt"]
    assert (out / ".cache" / "shadowgrad" / "reference" / "k" / "final.pt").read_bytes() == b"x"
    assert prepare_out(out) == []  # nothing left to clear


def test_a_demo_folder_from_before_the_marker_is_recognised(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    _demo_out(out, marker=False)
    assert "run" in prepare_out(out)
    assert sorted(p.name for p in out.iterdir()) == [".cache", OUT_MARKER]


def test_a_cache_given_inside_the_folder_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _demo_out(out)
    (out / "my-cache" / "plain").mkdir(parents=True)
    prepare_out(out, out / "my-cache")
    assert (out / "my-cache" / "plain").is_dir()
    with pytest.raises(ShadowgradError, match="is the reference cache itself"):
        prepare_out(out, out)


def test_a_folder_that_is_not_a_demos_is_refused_and_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    (home / "run" / "script.sh").write_text("mine")
    (home / "report.json").write_text("mine")
    (home / "thesis.tex").write_text("mine")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    with pytest.raises(ShadowgradError) as e:
        prepare_out(home)
    assert str(e.value) == (
        f"--out {home}: the folder is not empty and is not a demo's output folder (no "
        f"{OUT_MARKER} file; it holds thesis.tex, which a demo does not write): nothing was "
        "deleted. Give --out a new or empty folder, or one a demo wrote"
    )
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    # only names a demo writes, but none of its reports: not recognisably a demo's either
    other = tmp_path / "other"
    (other / "run").mkdir(parents=True)
    with pytest.raises(ShadowgradError, match=r"no topology\.json or report\.json"):
        prepare_out(other)
    assert (other / "run").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ShadowgradError, match="is not a directory"):
        prepare_out(tmp_path / "file")


def test_a_symlinked_run_folder_is_unlinked_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    _demo_out(out)
    import shutil

    shutil.rmtree(out / "run")
    (out / "run").symlink_to(target, target_is_directory=True)
    prepare_out(out)
    assert not (out / "run").exists()
    assert (target / "keep.txt").read_text() == "mine"
