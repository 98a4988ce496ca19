"""The console script's subcommands, end to end in-process."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowgrad import wire
from shadowgrad.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures the root logger on the (captured) stderr: undo it after each test, or
    later tests' background threads would log into a closed capture stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_spec_check_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "check", str(ROOT / "examples" / "job.toml")]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["spec", "show", str(ROOT / "examples" / "job-loopback.toml")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["job"]["mode"] == "mirror"


def test_spec_error_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (ROOT / "examples" / "job-loopback.toml")
        .read_text()
        .replace("replication = 1", "replication = 2")
    )
    assert "replication = 2" in bad.read_text()
    assert main(["spec", "check", str(bad)]) == 1
    assert "shadows.replication" in capsys.readouterr().err


def test_wire_decodes_and_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    good = wire.encode(
        wire.Kind.DATA,
        job=7,
        sender=1,
        iteration=3,
        seq=4,
        layout=5,
        dtype=wire.DType.FLOAT32,
        payload=bytes(8),
        flags=wire.Flag.FINAL,
    )
    assert main(["wire", "--json", good.hex()]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "DATA" and out["iteration"] == 3 and out["flags"] == "FINAL"
    corrupt = bytearray(good)
    corrupt[-1] ^= 1
    assert main(["wire", "--job", "7", good.hex(), corrupt.hex()]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("#0: ok") and "REJECTED (checksum)" in lines[1]
    assert main(["wire", "--job", "8", good.hex()]) == 1
    assert "foreign_job" in capsys.readouterr().out


def test_layout_from_params_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = tmp_path / "p.json"
    params.write_text(
        json.dumps(
            [
                ["emb.weight", [1000, 64], "float32"],
                ["fc.weight", [64, 64], "float32"],
                ["fc.bias", [64], "float32"],
            ]
        )
    )
    out = tmp_path / "layout.json"
    assert (
        main(
            [
                "layout",
                "--params",
                str(params),
                "--shadows",
                "4",
                "--replication",
                "2",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "4 shadows = 2 shards x 2" in text
    from shadowgrad.layout import Layout

    layout = Layout.from_json(out.read_text())
    assert layout.digest in text and layout.num_shards == 2


def test_layout_bad_model_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layout", "--model", "no_such_module:Model"]) == 1
    assert "no_such_module" in capsys.readouterr().err
