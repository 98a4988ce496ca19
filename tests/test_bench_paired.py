"""trainer_bench's ``paired`` variant runs both jobs in the same ranks and reports every pair
(a tiny run: 1M parameters, two pairs of two-iteration blocks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_paired_variant_times_both_jobs_in_alternating_blocks(tmp_path: Path) -> None:
    out = tmp_path / "paired.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "trainer_bench.py"),
        "--sizes", "1M", "--variants", "paired", "--rounds", "1", "--iters", "2",
        "--warmup", "1", "--pairs", "2", "--block", "3", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (r,) = json.loads(out.read_text())["results"]
    assert r["variant"] == "paired" and r["shadows"] == "sink" and r["block"] == 3
    # the first iteration of every block is not timed: 2 of 3, in 2 blocks of each job
    assert len(r["times"]) == 4 and len(r["pair_ratios"]) == 2
    assert r["ratio"] > 0 and r["base_median_s"] > 0 and r["sink_bytes"] > 0
    assert r["extra"]["mirror"]["data_chunks"] > 0
    # rank 0's training thread's own CPU per timed iteration, both jobs
    assert r["base_main_cpu_s"] > 0 and r["main_cpu_s"] > 0
    # the floor: a bare sendmsg loop of one capture's worth of what rank 0's sender sent, in
    # datagrams of its size, once per pair, beside the sender's own CPU per capture
    m, floor = r["extra"]["mirror"], r["extra"]["bare_send"]
    assert floor["bytes_per_capture"] == m["data_bytes"] // m["captures"]
    assert floor["datagram_payload"] == m["data_bytes"] // m["data_chunks"]
    assert len(floor["cpu_s"]) == 2 and all(c > 0 for c in floor["cpu_s"])
    assert r["bare_send_cpu_s"] == floor["cpu_median_s"] > 0
    assert r["sender_cpu_per_capture_s"] == m["thread_cpu_s"] / m["captures"] > 0
