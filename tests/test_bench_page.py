"""The benchmark page is generated from the committed JSON, and the wire bench measures the real
codec (tiny inputs; no benchmark runs here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    path = ROOT / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_sg_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def test_page_is_generated_from_the_committed_json(tmp_path: Path) -> None:
    harness = _load("harness")
    page = tmp_path / "benchmarks.md"
    assert harness.main(["--page-only", "--page", str(page)]) == 0
    committed = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page.read_text(encoding="utf-8") == committed, (
        "docs/benchmarks.md differs from what `python bench/harness.py --page-only` makes of "
        "bench/results/; regenerate it (and commit the JSON it comes from)")


def test_page_without_any_json_says_not_run() -> None:
    harness = _load("harness")
    text = harness.render_page({"command": "python bench/harness.py --quick", "mode": "quick",
                                "started": "2000-01-01T00:00:00Z", "wall_s": 1.0,
                                "benches": [{"name": "wire_bench", "status": "failed",
                                             "reason": "exit status 1", "wall_s": 0.5,
                                             "json": "bench/results/quick/none.json",
                                             "output_tail": ["Traceback"]}]})
    assert "failed (exit status 1)" in text
    assert "| [auth_bench](#auth_bench) | not run |" in text
    assert "## Not measured yet" in text


def test_wire_bench_rates_and_round_trip() -> None:
    wb = _load("wire_bench")
    result = wb.bench_size(64, 64 * 16, rounds=2)
    assert result["roundtrip_ok"]
    assert set(result["items"]) == set(wb.ITEMS)
    for item in result["items"].values():
        assert item["mbps_median"] > 0 and item["mbps_min"] > 0
        assert item["ratio_to_memcpy"] > 0
    assert result["items"]["memcpy"]["ratio_to_memcpy"] == 1.0

    payload = wb.payload_bytes(1000)
    key = wb.wire.mac_key(wb.TOKEN, wb.JOB)
    for k in (None, key):
        datagrams = wb.encode_datagrams(payload, 64, k)
        assert len(datagrams) == 16  # 15 full chunks and one of 40 bytes
        assert wb.decode_datagrams(datagrams, k) == payload
