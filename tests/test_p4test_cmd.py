"""``shadowgrad p4test`` (p4target/_p4test_cmd.py): one program and its STF file, a corpus
folder; and p4c's corpus with its tokens deleted or swapped never gets anything but a located
diagnostic or a working pipeline out of the target (issue 26)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("p4")

from shadowgrad.p4target.dataplane import Dataplane
from shadowgrad.p4target.pipeline import P4CompileError, Pipeline
from shadowgrad.testing.v1model import v1switch

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / ".." / "shared" / "p4c-stf"
CLI = [sys.executable, "-m", "shadowgrad.cli"]

PROG = v1switch(
    """
header h_t { bit<8> a; bit<8> b; }
struct headers { h_t h; }
struct meta_t { }
""",
    ingress="""{
    action fwd(bit<9> port) { sm.egress_spec = port; hdr.h.b = 8w0x77; }
    action never() { hdr.h.b = 8w0x11; }
    table route {
        key = { hdr.h.a: exact; } actions = { fwd; NoAction; } default_action = NoAction();
    }
    table ghost { key = { hdr.h.b: exact; } actions = { never; } }
    table ghost2 { key = { hdr.h.b: exact; } actions = { never; } }
    apply {
        sm.egress_spec = 9w1;
        route.apply();
        if (false) { ghost.apply(); never(); }
        hdr.h.a = true ? hdr.h.a : (ghost2.apply().hit ? 8w1 : 8w2);
    }
}""",
)

STF = """
add route h.a:0x05 fwd(port:2)
packet 0 05 00 AABB
expect 2 05 77 AABB
packet 0 06 00
expect 1 06 00
"""


def _p4test(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "p4test", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


def test_a_program_and_its_stf_pass(tmp_path: Path) -> None:
    (tmp_path / "prog.p4").write_text(PROG)
    (tmp_path / "prog.stf").write_text(STF)
    r = _p4test(tmp_path / "prog.p4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "2 packet(s), 2 expect(s)" in r.stdout, r.stdout


def test_a_mismatch_is_reported_per_port_and_packet(tmp_path: Path) -> None:
    (tmp_path / "prog.p4").write_text(PROG)
    (tmp_path / "other.stf").write_text(STF.replace("expect 2 05 77", "expect 2 05 78"))
    r = _p4test(tmp_path / "prog.p4", tmp_path / "other.stf")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "port 2 packet 0" in r.stdout and "expected 0578AABB" in r.stdout, r.stdout
    assert "received 0577AABB" in r.stdout and "FAIL" in r.stdout, r.stdout


def test_a_rejected_program_names_its_construct(tmp_path: Path) -> None:
    bad = PROG.replace("state start {", "state start { for (bit<8> i = 0; i < 2; i = i + 1) {}")
    (tmp_path / "prog.p4").write_text(bad)
    (tmp_path / "prog.stf").write_text(STF)
    r = _p4test(tmp_path / "prog.p4")
    assert r.returncode == 1 and "REJECTED" in r.stdout, r.stdout + r.stderr
    assert re.search(r"prog\.p4:\d+:\d+: ", r.stdout), r.stdout
    missing = _p4test(tmp_path / "nothing.p4")
    assert missing.returncode == 1 and "no such program" in missing.stderr, missing.stderr


def test_tables_and_actions_under_a_constant_false_condition_leave_the_p4info() -> None:
    """p4c's front end removes a table applied only in code a constant condition leaves out,
    and an action only called there; the P4Info does so too, the program still runs."""
    pipe = Pipeline.compile(PROG, filename="prog.p4")
    assert [t.preamble.name for t in pipe.p4info.tables] == ["I.route"]
    assert sorted(a.preamble.name for a in pipe.p4info.actions) == ["I.fwd", "NoAction"]
    out = Dataplane(pipe).process(0, bytes.fromhex("0600"))
    assert out == [(1, bytes.fromhex("0600"))]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/p4c-stf is absent")
def test_the_corpus_through_the_command() -> None:
    r = _p4test(CORPUS)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"(\d+) programs: (\d+) compile, (\d+) pass", r.stdout)
    assert m is not None, r.stdout
    total, compiled, passed = map(int, m.groups())
    assert total == 191 and compiled == passed and passed >= 181, r.stdout
    m = re.search(r"P4Info identical for (\d+) of (\d+)", r.stdout)
    assert m is not None and m.group(1) == m.group(2), r.stdout
    assert "internal" not in r.stdout and "  fail:" not in r.stdout, r.stdout


def _tokens(text: str) -> list[str]:
    return re.findall(r"\s+|//[^\n]*|/\*.*?\*/|\w+|\S", text, flags=re.S)


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/p4c-stf is absent")
def test_mutated_corpus_programs_get_a_diagnostic_or_a_working_pipeline(tmp_path: Path) -> None:
    """Every corpus program with tokens deleted or two swapped (seeded): compiled, it is
    either rejected with a located diagnostic or runs random frames without an internal
    error; nothing else escapes the target."""
    samples = CORPUS / "p4_16_samples"
    for inc in samples.glob("*.p4"):  # local includes (arith-*-skeleton.p4 and the like)
        if "skeleton" in inc.name or not inc.with_suffix(".stf").exists():
            (tmp_path / inc.name).write_bytes(inc.read_bytes())
    programs = sorted(p for p in samples.glob("*.p4") if p.with_suffix(".stf").exists())
    rng = random.Random(26)
    outcomes = {"rejected": 0, "compiled": 0}
    for prog in programs:
        toks = _tokens(prog.read_text())
        code = [i for i, t in enumerate(toks) if t.strip() and not t.startswith(("//", "/*"))]
        for _ in range(3):
            mutated = list(toks)
            i = rng.choice(code)
            if rng.random() < 0.5:
                mutated[i] = ""
            else:
                j = code[min(len(code) - 1, code.index(i) + 1)]
                mutated[i], mutated[j] = mutated[j], mutated[i]
            src = tmp_path / f"m_{prog.name}"
            src.write_text("".join(mutated))
            try:
                pipe = Pipeline.compile(src)
            except P4CompileError as e:
                assert e.diagnostics and re.match(r".+:\d+:\d+: ", e.diagnostics[0]), (
                    prog.name,
                    e.diagnostics,
                )
                outcomes["rejected"] += 1
                continue
            outcomes["compiled"] += 1
            dp = Dataplane(pipe, cpu_port=255)
            dp.on_packet_in = lambda payload, md: None
            dp.on_digest = lambda did, members: None
            errors: list[str] = []
            dp.on_log = lambda line, errors=errors: (  # type: ignore[misc]
                errors.append(line) if "internal" in line else None
            )
            for _ in range(20):
                frame = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
                dp.process(rng.choice([0, 1, 2]), frame)
            assert errors == [], (prog.name, errors[:3])
    print(outcomes)
    assert outcomes["rejected"] > 100 and outcomes["compiled"] > 5, outcomes
