"""Drive a P4 switch *binary* the way the dataplane suite drives the in-process target.

:class:`RealBmv2Backend` compiles a program with a p4c command line, starts a switch binary with
``simple_switch_grpc``'s command line on veth pairs, programs it over P4Runtime with the project's
client (:class:`shadowgrad.controller.p4runtime.P4RuntimeClient`), sends frames with AF_PACKET
and collects what comes out of the other ports until the wire is quiet. The same code runs

* real ``p4c`` + ``simple_switch_grpc`` (``p4c`` writes ``DIR/x.json``), and
* this project's ``shadowgrad-p4c`` + ``sg-switch-grpc`` (``DIR/x.bin``).

Topology (root is needed)::

    switch binary (root netns)            netns sgbk<tag> (created here)
      -i N@sb<tag>sN  <-- veth pair -->   sb<tag>hN   <- AF_PACKET socket of this process

The switch side stays in the root namespace so that the gRPC server on ``127.0.0.1`` is
reachable; the host sides live in a namespace of their own, with IPv6 off on every end so the
kernel adds no traffic of its own. Host-side sockets are opened from a short-lived thread that
``setns()``-es into the namespace (a socket keeps the namespace it was created in).
Everything created is removed by :meth:`RealBmv2Backend.close` (also on a failed start, and
by a finalizer at interpreter exit).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import queue
import secrets
import select
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import text_format  # type: ignore[import-untyped]
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from shadowgrad.bmv2_testbed.topology import OFFLOADS_OFF, add_veth, disable_ipv6, ns_sh
from shadowgrad.controller.p4runtime import P4RuntimeClient
from shadowgrad.errors import P4RuntimeError
from shadowgrad.freeports import free_port
from shadowgrad.p4target.process import stop_switch

__all__ = ["RealBmv2Backend", "VethNamespace", "compile_program"]

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
U = p4runtime_pb2.Update
#: a table entry's match by field name, and an action's parameters by name
Match = dict[str, Any]
Params = dict[str, int] | None


def _sh(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


# ----------------------------------------------------------------------------- compile
def compile_program(p4c: str, source: Path, outdir: Path) -> tuple[p4info_pb2.P4Info, bytes]:
    """``p4c --target bmv2 --arch v1model -o DIR --p4runtime-files DIR/x.p4info.txtpb x.p4``;
    returns the P4Info and the device config (``DIR/x.json`` from real p4c, ``DIR/x.bin`` from
    ``shadowgrad-p4c``, whichever exists)."""
    outdir.mkdir(parents=True, exist_ok=True)
    stem = source.stem
    info_path = outdir / f"{stem}.p4info.txtpb"
    r = subprocess.run(
        [
            p4c,
            "--target",
            "bmv2",
            "--arch",
            "v1model",
            "-o",
            str(outdir),
            "--p4runtime-files",
            str(info_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{p4c} failed on {source} ({r.returncode}):\n{r.stderr[-4000:]}")
    for name in (f"{stem}.json", f"{stem}.bin"):
        if (outdir / name).exists():
            config = (outdir / name).read_bytes()
            break
    else:
        raise RuntimeError(f"{p4c} wrote neither {stem}.json nor {stem}.bin into {outdir}")
    info = p4info_pb2.P4Info()
    text_format.Merge(info_path.read_text(), info, allow_unknown_field=True)
    return info, config


# ----------------------------------------------------------------------------- netns + veths
_libc: Any = None


def _setns_thread(ns_path: str, fn: Any) -> Any:
    """Run ``fn()`` on a new thread that has joined the network namespace at ``ns_path``."""
    global _libc  # noqa: PLW0603
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(ns_path, os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns_path}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, name="setns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class VethNamespace:
    """``n`` veth pairs: switch sides in the root namespace, host sides in a fresh netns, with
    an AF_PACKET socket per host side. Unique names; :meth:`close` removes everything."""

    def __init__(
        self, ports: Sequence[int], *, tag: str | None = None, rcvbuf: int = 8 << 20
    ) -> None:
        self.tag = tag or secrets.token_hex(3)
        self.netns = f"sgbk{self.tag}"
        self.ports = list(ports)
        self.switch_if = {p: f"sb{self.tag}s{p}" for p in self.ports}
        self.host_if = {p: f"sb{self.tag}h{p}" for p in self.ports}
        self.socks: dict[int, socket.socket] = {}
        self._by_fd: dict[int, int] = {}
        self._created: list[str] = []
        self._closed = False
        try:
            self._create(rcvbuf)
        except BaseException:
            self.close()
            raise

    def _create(self, rcvbuf: int) -> None:
        ns = self.netns
        _sh("ip", "netns", "add", ns)
        self._created.append("netns")
        for conf in ("all", "default"):
            disable_ipv6(ns, conf)
        for p in self.ports:
            s, h = self.switch_if[p], self.host_if[p]
            self._created.append(s)  # close() removes only what exists
            add_veth(s, h, ns)
            disable_ipv6(ns, h)
            ns_sh(ns, "ethtool", "-K", h, *OFFLOADS_OFF)
            _sh("ip", "link", "set", s, "mtu", "9500", check=False)
            _sh("ip", "-n", ns, "link", "set", h, "mtu", "9500", check=False)
            _sh("ip", "link", "set", s, "up")
            _sh("ip", "-n", ns, "link", "set", h, "up")

        def open_socks() -> dict[int, socket.socket]:
            out: dict[int, socket.socket] = {}
            try:
                for p in self.ports:
                    sk = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                    out[p] = sk
                    sk.bind((self.host_if[p], 0))
                    with contextlib.suppress(OSError):
                        sk.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE
                    with contextlib.suppress(OSError):
                        sk.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)  # SO_SNDBUFFORCE
                    sk.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                    sk.setblocking(False)
            except BaseException:
                for sk in out.values():
                    sk.close()
                raise
            return out

        self.socks = _setns_thread(f"/run/netns/{ns}", open_socks)
        self._by_fd = {sk.fileno(): p for p, sk in self.socks.items()}

    def send(self, port: int, frame: bytes) -> None:
        sk = self.socks[port]
        while True:
            try:
                sk.send(frame)
                return
            except BlockingIOError:
                select.select([], [sk], [], 1.0)

    def drain(self) -> int:
        """Discard whatever is waiting on the host sockets; the number of frames dropped."""
        n = 0
        for sk in self.socks.values():
            while True:
                try:
                    sk.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                n += 1
        return n

    def collect(
        self, first_timeout: float, quiet: float, limit: float = 10.0
    ) -> list[tuple[int, bytes]]:
        """Frames that come out of the host sides: wait up to ``first_timeout`` for the first,
        then until none arrived for ``quiet`` seconds (at most ``limit`` in all)."""
        out: list[tuple[int, bytes]] = []
        socks = list(self.socks.values())
        start = time.monotonic()
        last = None
        while True:
            now = time.monotonic()
            deadline = (start + first_timeout) if last is None else (last + quiet)
            deadline = min(deadline, start + limit)
            if now >= deadline:
                return out
            ready, _, _ = select.select(socks, [], [], deadline - now)
            for sk in ready:
                while True:
                    try:
                        data = sk.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    out.append((self._by_fd[sk.fileno()], data))
                    last = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sk in self.socks.values():
            with contextlib.suppress(OSError):
                sk.close()
        self.socks = {}
        if "netns" in self._created:
            _sh("ip", "netns", "del", self.netns, check=False)
        for name in self._created:
            if name != "netns" and Path(f"/sys/class/net/{name}").exists():
                _sh("ip", "link", "del", name, check=False)


# ----------------------------------------------------------------------------- helpers
def _width_bytes(bits: int) -> int:
    return max(1, (bits + 7) // 8)


def _enc(value: int, bits: int) -> bytes:
    if value < 0 or value >> bits:
        raise ValueError(f"{value:#x} does not fit in {bits} bits")
    return value.to_bytes(_width_bytes(bits), "big")


def _cleanup(state: dict[str, Any]) -> None:
    """Finalizer body: stop the switch process and remove the veths (idempotent)."""
    stop_switch(state)
    veths: VethNamespace | None = state.pop("veths", None)
    if veths is not None:
        veths.close()
    tmp = state.pop("tmp", None)
    if tmp is not None:
        tmp.cleanup()


# ----------------------------------------------------------------------------- backend
class RealBmv2Backend:
    """The dataplane suite's ``Backend`` over a switch binary, P4Runtime and veths.

    ``p4c`` and ``switch`` are commands with p4c's and simple_switch_grpc's command lines (real
    bmv2, or ``shadowgrad-p4c`` and ``sg-switch-grpc``). Ports ``ports`` (default 0..9) are
    attached as ``-i N@veth``; ``cpu_port`` is given after ``--``. ``send`` waits up to
    ``first_timeout`` for the first output frame and then until the wire has been quiet for
    ``quiet`` seconds. ``load`` pushes a new pipeline, which resets all switch state, so one
    backend serves many test cases.
    """

    def __init__(
        self,
        p4c: str = "p4c",
        switch: str = "simple_switch_grpc",
        *,
        ports: Sequence[int] = tuple(range(10)),
        cpu_port: int = 255,
        prog_dir: str | Path | None = None,
        first_timeout: float = 0.5,
        quiet: float = 0.1,
        switch_args: Sequence[str] = (),
        start_timeout: float = 60.0,
    ) -> None:
        self.p4c = p4c
        self.switch = switch
        self.ports = list(ports)
        self.cpu_port = cpu_port
        self.prog_dir = Path(prog_dir) if prog_dir is not None else Path.cwd()
        self.first_timeout = first_timeout
        self.quiet = quiet
        self.packet_ins: list[tuple[bytes, dict[str, int]]] = []
        self.digests: list[tuple[str, list[bytes]]] = []
        self.stale_frames = 0
        self.info: p4info_pb2.P4Info | None = None
        self._compiled: dict[Path, tuple[p4info_pb2.P4Info, bytes]] = {}
        self._state: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _cleanup, self._state)
        try:
            self._start(list(switch_args), start_timeout)
        except BaseException:
            self.close()
            raise

    # ---- lifecycle ---------------------------------------------------------------------
    def _start(self, switch_args: list[str], start_timeout: float) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="sg-bmv2-")
        self._state["tmp"] = tmp
        self.workdir = Path(tmp.name)
        self.veths = VethNamespace(self.ports)
        self._state["veths"] = self.veths
        grpc_port = free_port()
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        cmd = [self.switch, "--device-id", "0"]
        for p in self.ports:
            cmd += ["-i", f"{p}@{self.veths.switch_if[p]}"]
        cmd += [
            "--no-p4",
            *switch_args,
            "--",
            "--grpc-server-addr",
            self.grpc_addr,
            "--cpu-port",
            str(self.cpu_port),
        ]
        self.log_path = self.workdir / "switch.log"
        with open(self.log_path, "wb") as logf:
            proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._state["proc"] = proc
        self.proc = proc
        client = P4RuntimeClient(self.grpc_addr)
        self._state["client"] = client
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.switch} exited with {proc.returncode}:\n{self.switch_log()[-3000:]}"
                )
            try:
                client.connect(wait_s=min(1.0, max(0.1, deadline - time.monotonic())))
                break
            except P4RuntimeError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.switch} did not serve P4Runtime on "
                        f"{self.grpc_addr}:\n{self.switch_log()[-3000:]}"
                    ) from None
        self.client = client

    def switch_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> RealBmv2Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- names -------------------------------------------------------------------------
    def _p4info(self) -> p4info_pb2.P4Info:
        if self.info is None:
            raise RuntimeError("no program loaded")
        return self.info

    def _obj(self, kind: str, name: str) -> Any:
        for o in getattr(self._p4info(), kind):
            if name in (o.preamble.name, o.preamble.alias):
                return o
        raise KeyError(f"{kind[:-1]} {name!r} not in the P4Info")

    def _table_entry(
        self, table: str, match: Match, action: str | None, params: Params, priority: int
    ) -> p4runtime_pb2.TableEntry:
        t = self._obj("tables", table)
        te = p4runtime_pb2.TableEntry(table_id=t.preamble.id, priority=priority)
        known = {mf.name for mf in t.match_fields}
        unknown = set(match) - known
        if unknown:
            raise KeyError(f"table {table!r} has no match field(s) {sorted(unknown)}")
        mt = p4info_pb2.MatchField
        for mf in t.match_fields:
            if mf.name not in match:
                continue
            v = match[mf.name]
            w = mf.bitwidth
            full = (1 << w) - 1
            fm = p4runtime_pb2.FieldMatch(field_id=mf.id)
            if mf.match_type == mt.EXACT:
                fm.exact.value = _enc(v[0] if isinstance(v, tuple) else v, w)
            elif mf.match_type == mt.LPM:
                value, plen = v if isinstance(v, tuple) else (v, w)
                if plen == 0:
                    continue  # don't-care: omitted (P4Runtime)
                fm.lpm.value, fm.lpm.prefix_len = _enc(value, w), plen
            elif mf.match_type == mt.TERNARY:
                value, mask = v if isinstance(v, tuple) else (v, full)
                if mask == 0:
                    continue
                fm.ternary.value, fm.ternary.mask = _enc(value & mask, w), _enc(mask, w)
            elif mf.match_type == mt.RANGE:
                lo, hi = v if isinstance(v, tuple) else (v, v)
                if lo == 0 and hi == full:
                    continue
                fm.range.low, fm.range.high = _enc(lo, w), _enc(hi, w)
            elif mf.match_type == mt.OPTIONAL:
                fm.optional.value = _enc(v[0] if isinstance(v, tuple) else v, w)
            else:
                raise ValueError(f"unsupported match type {mf.match_type} for {mf.name}")
            te.match.append(fm)
        if action is not None:
            te.action.action.CopyFrom(self._action(action, params))
        return te

    def _action(self, action: str, params: Params) -> p4runtime_pb2.Action:
        a = self._obj("actions", action)
        out = p4runtime_pb2.Action(action_id=a.preamble.id)
        by_name = {p.name: p for p in a.params}
        for k, v in (params or {}).items():
            p = by_name[k]
            out.params.add(param_id=p.id, value=_enc(v, p.bitwidth))
        return out

    # ---- Backend API -------------------------------------------------------------------
    def load(self, prog: str | Path) -> None:
        """Compile (cached per source), push the pipeline (which resets all state) and enable
        every digest, as a controller does with PI."""
        src = Path(prog)
        if not src.is_absolute():
            src = self.prog_dir / src
        if src not in self._compiled:
            out = self.workdir / f"build{len(self._compiled)}"
            self._compiled[src] = compile_program(self.p4c, src, out)
        info, config = self._compiled[src]
        self.client.set_pipeline(info, config)
        self.info = info
        self.packet_ins.clear()
        self.digests.clear()
        for q in (self.client.packet_ins, self.client.digests):
            while not q.empty():
                q.get_nowait()
        ups = []
        for d in info.digests:
            e = p4runtime_pb2.Entity()
            e.digest_entry.digest_id = d.preamble.id
            e.digest_entry.config.max_timeout_ns = 0
            e.digest_entry.config.max_list_size = 1
            e.digest_entry.config.ack_timeout_ns = 1_000_000_000
            ups.append(U(type=U.INSERT, entity=e))
        if ups:
            self.client.write(ups)
        self.stale_frames += self.veths.drain()

    def _write_te(self, kind: Any, te: p4runtime_pb2.TableEntry) -> None:
        e = p4runtime_pb2.Entity()
        e.table_entry.CopyFrom(te)
        self.client.write([U(type=kind, entity=e)])

    def insert(
        self, table: str, match: Match, action: str, params: Params = None, priority: int = 0
    ) -> None:
        self._write_te(U.INSERT, self._table_entry(table, match, action, params, priority))

    def delete(self, table: str, match: Match, priority: int = 0) -> None:
        self._write_te(U.DELETE, self._table_entry(table, match, None, None, priority))

    def set_default(self, table: str, action: str, params: Params = None) -> None:
        te = self._table_entry(table, {}, action, params, 0)
        te.is_default_action = True
        self._write_te(U.MODIFY, te)

    def _insert_pre(
        self, e: p4runtime_pb2.Entity, entry: Any, replicas: list[tuple[int, int]]
    ) -> None:
        """Insert ``e``, whose replication ``entry`` gets ``replicas`` (egress port, instance)."""
        for port, rid in replicas:
            entry.replicas.add(egress_port=port, instance=rid)
        self.client.write([U(type=U.INSERT, entity=e)])

    def mcast(self, gid: int, replicas: list[tuple[int, int]]) -> None:
        e = p4runtime_pb2.Entity()
        g = e.packet_replication_engine_entry.multicast_group_entry
        g.multicast_group_id = gid
        self._insert_pre(e, g, replicas)

    def clone_session(self, sid: int, replicas: list[tuple[int, int]]) -> None:
        e = p4runtime_pb2.Entity()
        c = e.packet_replication_engine_entry.clone_session_entry
        c.session_id = sid
        self._insert_pre(e, c, replicas)

    def _gather_async(self) -> None:
        names_in: dict[int, str] = {}
        for cpm in self._p4info().controller_packet_metadata:
            if cpm.preamble.name == "packet_in":
                names_in = {m.id: m.name for m in cpm.metadata}
        while True:
            try:
                pin = self.client.packet_ins.get_nowait()
            except queue.Empty:
                break
            md = {
                names_in.get(m.metadata_id, str(m.metadata_id)): int.from_bytes(m.value, "big")
                for m in pin.metadata
            }
            for name in names_in.values():
                md.setdefault(name, 0)
            self.packet_ins.append((pin.payload, md))
        while True:
            try:
                dl = self.client.digests.get_nowait()
            except queue.Empty:
                break
            d = next(x for x in self._p4info().digests if x.preamble.id == dl.digest_id)
            widths = self._digest_widths(d)
            for data in dl.data:
                if data.WhichOneof("data") == "struct":
                    members = [m.bitstring for m in data.struct.members]
                else:
                    members = [data.bitstring]
                # canonical bitstrings (P4Runtime 1.3+) padded back to the member widths
                members = [
                    b.rjust(_width_bytes(widths[i]), b"\0") if i < len(widths) else b
                    for i, b in enumerate(members)
                ]
                self.digests.append((d.preamble.name, members))

    def _digest_widths(self, d: Any) -> list[int]:
        spec = d.type_spec
        if spec.WhichOneof("type_spec") == "struct":
            st = self._p4info().type_info.structs[spec.struct.name]
            return [
                m.type_spec.bitstring.bit.bitwidth or m.type_spec.bitstring.int.bitwidth
                for m in st.members
            ]
        if spec.WhichOneof("type_spec") == "bitstring":
            return [spec.bitstring.bit.bitwidth]
        return []

    def _collect(self) -> list[tuple[int, bytes]]:
        out = self.veths.collect(self.first_timeout, self.quiet)
        self._gather_async()
        return out

    def send(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        self.stale_frames += self.veths.drain()
        self.veths.send(port, bytes(data))
        return self._collect()

    def packet_out(self, payload: bytes, **metadata: int) -> list[tuple[int, bytes]]:
        cpm = next(
            c for c in self._p4info().controller_packet_metadata if c.preamble.name == "packet_out"
        )
        by_name = {m.name: m for m in cpm.metadata}
        md = [(by_name[k].id, _enc(v, by_name[k].bitwidth)) for k, v in metadata.items()]
        for m in cpm.metadata:  # bmv2 wants every field of the header
            if m.name not in metadata:
                md.append((m.id, _enc(0, m.bitwidth)))
        self.stale_frames += self.veths.drain()
        self.client.packet_out(bytes(payload), md)
        return self._collect()

    def counter(self, name: str, index: int) -> tuple[int, int]:
        e = p4runtime_pb2.Entity()
        e.counter_entry.counter_id = self._obj("counters", name).preamble.id
        e.counter_entry.index.index = index
        (r,) = self.client.read([e])
        d = r.counter_entry.data
        return d.byte_count, d.packet_count

    def direct_counter(self, table: str, match: Match, priority: int = 0) -> tuple[int, int]:
        e = p4runtime_pb2.Entity()
        e.direct_counter_entry.table_entry.CopyFrom(
            self._table_entry(table, match, None, None, priority)
        )
        (r,) = self.client.read([e])
        d = r.direct_counter_entry.data
        return d.byte_count, d.packet_count
