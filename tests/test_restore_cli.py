"""``shadowgrad restore`` against real shadow nodes, with and without a controller: I* by the
core rule, held on its sources, released by --release or at the end of --exec; the controller's
I* when one is configured; a wrong token refused with a clear message and nothing held."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shadowgrad.cli import main
from shadowgrad.controller.service import Controller, ControllerOptions
from shadowgrad.testing.specs import TOKEN
from tests.test_status import Job, trained_job


def _holds(job: Job) -> dict[int, list[int]]:
    return {n.id: n.status(timeline=0)["holds"] for n in job.nodes}


def test_restore_shows_holds_and_releases_istar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trained_job(tmp_path, 5) as job:
        assert main(["restore", "--spec", str(job.spec_path), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["istar"] == 4 and doc["by"] == "shadows" and len(doc["source"]) == 2
        holds = _holds(job)
        assert all(holds[k] == [4] for k in doc["source"]), holds
        # the text form names every shard's source
        assert main(["restore", "--spec", str(job.spec_path), "--no-hold"]) == 0
        out = capsys.readouterr().out
        assert "I* = 4" in out and "shard 0: shadow" in out and "shard 1: shadow" in out
        assert main(["restore", "--spec", str(job.spec_path), "--release"]) == 0
        capsys.readouterr()
        assert all(not h for h in _holds(job).values()), _holds(job)
        # --exec: the command runs with I* held, the holds go when it exits, its status returns
        probe = tmp_path / "probe.json"
        code = (
            "import json, sys; from shadowgrad.shadow.control import ShadowClient; "
            f"eps = {[n.control_endpoint for n in job.nodes]!r}; "
            f"holds = [ShadowClient(e, {TOKEN!r}).status(timeline=0).holds "
            "for e in eps]; "
            f"open({str(probe)!r}, 'w').write(json.dumps(holds)); sys.exit(7)"
        )
        rc = main(["restore", "--spec", str(job.spec_path), "--exec", sys.executable, "-c", code])
        capsys.readouterr()
        assert rc == 7
        during = json.loads(probe.read_text())
        assert sum(h == [4] for h in during) == 2, during
        assert all(not h for h in _holds(job).values())
        # a wrong token: refused by every shadow, so there is no restore point and nothing held
        bad = job.write_spec("bad.toml", "not-the-token")
        assert main(["restore", "--spec", str(bad)]) == 1
        err = capsys.readouterr().err
        assert "shadowgrad restore: error:" in err
        assert all(not h for h in _holds(job).values())


def test_restore_asks_the_controller_when_one_is_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shadowgrad.freeports import free_port

    job = Job(tmp_path, shadows=2)
    job.doc["controller"] = {"address": f"127.0.0.1:{free_port()}"}
    path = job.write_spec("ctl.toml", TOKEN)
    try:
        job.load()
        job.train(3)
        from shadowgrad.config import load_spec

        spec = load_spec(path)
        with Controller(spec, token=TOKEN, options=ControllerOptions(poll_s=0.05)) as ctl:
            assert main(["restore", "--spec", str(path), "--json"]) == 0
            doc = json.loads(capsys.readouterr().out)
            assert doc["by"] == "controller" and doc["istar"] == 2
            assert ctl.state == "restoring" and sorted(ctl.held) == sorted(doc["source"])
            assert all(_holds(job)[k] == [2] for k in doc["source"])
        # no controller answering: the shadows are asked, with the same rule
        assert main(["restore", "--spec", str(path), "--json", "--no-hold"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["by"] == "shadows"
        assert "does not answer" in captured.err
    finally:
        job.close()
