"""``shadowgrad switch plan|program|counters|remove``: the user's way to program the job's switch
(here the P4 target in-process, over real P4Runtime): program writes the plan, programming again
writes nothing, counters read back, remove leaves an empty switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("p4")

from shadowgrad.cli import main
from shadowgrad.layout import Layout, from_module
from shadowgrad.p4target.ports import InProcessPort
from shadowgrad.p4target.switch import Switch
from shadowgrad.specs import spec_toml

ROOT = Path(__file__).resolve().parents[1]


def test_switch_cli_programs_idempotently_and_removes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sw = Switch(device_id=0, cpu_port=510, grpc_addr="127.0.0.1:0")
    for p in range(1, 5):
        sw.add_port(InProcessPort(p))
    sw.start()
    try:
        assert sw.server is not None
        doc = {
            "job": {"id": 9, "name": "cli", "mode": "in-band"},
            "trainers": {"world_size": 2, "addresses": ["10.0.0.1", "10.0.0.2"]},
            "shadows": {"count": 2, "addresses": ["10.0.1.1", "10.0.1.2"]},
            "switch": {
                "target": "p4target",
                "grpc_addr": f"127.0.0.1:{sw.server.port}",
                "p4_program": str(ROOT / "p4" / "shadowgrad.p4"),
                "trainer_ports": [1, 2],
                "shadow_ports": [3, 4],
            },
            "security": {"token_env": "X"},
        }
        spec = tmp_path / "job.toml"
        spec.write_text(spec_toml(doc))
        params, buckets = from_module(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        )
        layout = tmp_path / "layout.json"
        layout.write_text(Layout.build(params, buckets, 2, 1).to_json())
        args = ["--spec", str(spec), "--layout", str(layout)]
        assert main(["switch", "plan", *args]) == 0
        plan = capsys.readouterr().out
        n_entries = int(plan.strip().splitlines()[-1].split()[0])
        assert "SgIngress.tap.tap:" in plan and n_entries > 10
        assert main(["switch", "program", *args, "--json"]) == 0
        first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert first["pipeline_pushed"] and first["inserted"] == n_entries
        assert main(["switch", "program", *args, "--json"]) == 0
        again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert again["writes"] == 0 and not again["pipeline_pushed"]
        assert main(["switch", "counters", *args, "--json"]) == 0
        c = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert c["tagged"] == [[0, 0], [0, 0]] and set(c["drops"]) >= {"spoofed", "no_route"}
        assert main(["switch", "remove", *args, "--json"]) == 0
        gone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert gone["deleted"] == n_entries
        dpl = sw.dataplane
        assert dpl is not None and dpl.read_entries() == [] and dpl.read_multicast_groups() == {}
    finally:
        sw.stop()
