"""Shared test helpers for the shadow tests: reference CPU training loops, a gradient producer
that plays the trainers' side of the wire (DATA chunks per the layout, COMMIT records, NACK
answers with RETX, fault injection), and a cluster of real shadow nodes on loopback.
"""

from __future__ import annotations

import contextlib
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from shadowgrad import wire
from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.errors import WireError
from shadowgrad.layout import Box, Layout, from_module
from shadowgrad.optspec import OptimizerSpec, state_by_name
from shadowgrad.shadow.control import ShadowClient
from shadowgrad.shadow.node import NodeOptions, ShadowNode

TOKEN = "test-token-123"
#: the records' key the shadows derive from TOKEN (the producer seals as a trainer does)
JOB_ID = 77
KEY = wire.mac_key(TOKEN, JOB_ID)

# --------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self, d_in: int = 24, hidden: int = 96, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = self.norm(torch.relu(self.fc2(h)))
        out: torch.Tensor = self.out(h)
        return out


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32, layers: int = 2, seq: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.enc(self.emb(x) + self.pos))
        return out


def _warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    return f


@dataclass
class Case:
    """One reference training configuration."""

    name: str
    model: str  # "mlp" | "transformer"
    optimizer: str  # "adamw" | "sgd"
    scaler: bool = False
    skip_at: tuple[int, ...] = ()  # iterations whose loss is made non-finite (scaler skips)
    clip: float | None = 1.0
    iterations: int = 100
    foreach: bool = False
    fused: bool = False


class RefTrainer:
    """A CPU training loop that reports, per iteration, the gradient right after backward and
    the COMMIT record of its step decision."""

    def __init__(self, case: Case, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.case = case
        self.gen = torch.Generator().manual_seed(seed + 1)
        if case.model == "mlp":
            self.model: nn.Module = MLP()
        else:
            self.model = TinyTransformer()
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        if case.optimizer == "adamw":
            self.opt: torch.optim.Optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                lr=3e-3,
                betas=(0.9, 0.95),
                eps=1e-8,
                foreach=case.foreach,
                fused=case.fused,
            )
        else:
            self.opt = torch.optim.SGD(
                [
                    {"params": decay, "weight_decay": 1e-4},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=0.05,
                momentum=0.9,
                nesterov=True,
                foreach=case.foreach,
            )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, _warmup_cosine(10, case.iterations)
        )
        self.scaler = (
            torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
            if case.scaler
            else None
        )
        self.named = dict(self.model.named_parameters())

    def optimizer_spec(self) -> OptimizerSpec:
        return OptimizerSpec.from_optimizer(self.opt, self.model.named_parameters())

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.case.model == "mlp":
            x = torch.randn(16, 24, generator=self.gen)
            y = torch.randint(0, 10, (16,), generator=self.gen)
        else:
            x = torch.randint(0, 50, (4, 12), generator=self.gen)
            y = torch.randint(0, 50, (4, 12), generator=self.gen)
        return x, y

    def step(self, it: int) -> tuple[dict[str, torch.Tensor], wire.CommitRecord]:
        x, y = self._batch()
        self.opt.zero_grad(set_to_none=False)
        out = self.model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        if it in self.case.skip_at:
            loss = loss * float("inf")
        lrs = tuple(float(g["lr"]) for g in self.opt.param_groups)
        scale: float | None = None
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.detach().clone() for n, p in self.named.items() if p.grad is not None}
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        skipped = self.scaler is not None and not all(
            bool(torch.isfinite(p.grad).all()) for p in self.named.values() if p.grad is not None
        )
        clip_coef: float | None = None
        if self.case.clip is not None:
            total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.case.clip)
            clip_coef = float(torch.clamp(self.case.clip / (total + 1e-6), max=1.0))
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.sched.step()
        return grads, wire.CommitRecord(lrs, clip_coef=clip_coef, loss_scale=scale, skipped=skipped)

    def layout(self, num_shadows: int, replication: int = 1, max_piece_bytes: int = 4096) -> Layout:
        params, buckets = from_module(self.model, bucket_cap_mb=0.004)
        return Layout.build(
            params, buckets, num_shadows, replication, max_piece_bytes=max_piece_bytes
        )


def bucket_bytes(layout: Layout, grads: Mapping[str, torch.Tensor]) -> list[bytes]:
    """Each DDP bucket's flat buffer (bucket order, no padding) from per-name gradients."""
    out = []
    for names in layout.buckets:
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        out.append(flat.view(torch.uint8).numpy().tobytes())
    return out


def box_slice(t: torch.Tensor, box: Box) -> torch.Tensor:
    if not box.lengths or t.dim() == 0:
        return t
    return t[box.offsets[0] : box.offsets[0] + box.lengths[0]]


def initial_states(
    layout: Layout, shard: int, named: Mapping[str, torch.Tensor]
) -> list[dict[str, torch.Tensor]]:
    """Per box of ``shard``: ``{"param": rows of the parameter}`` (iteration -1)."""
    return [
        {"param": box_slice(named[b.name].detach(), b).clone()} for b in layout.shard_boxes(shard)
    ]


def compare_shard(
    layout: Layout,
    shard: int,
    fetched: Mapping[int, Mapping[str, torch.Tensor]],
    named: Mapping[str, torch.Tensor],
    opt_state: Mapping[str, Mapping[str, torch.Tensor]],
) -> list[str]:
    """Mismatches (empty list = bit-exact) between a shard's fetched boxes and the trainer."""
    bad: list[str] = []
    boxes = layout.shard_boxes(shard)
    if sorted(fetched) != list(range(len(boxes))):
        return [f"shard {shard}: boxes {sorted(fetched)}"]
    for k, box in enumerate(boxes):
        got = fetched[k]
        want: dict[str, torch.Tensor] = {"param": box_slice(named[box.name].detach(), box)}
        for key, t in opt_state.get(box.name, {}).items():
            want[key] = box_slice(t, box) if t.dim() > 0 else t
        if set(got) != set(want):
            bad.append(f"{box.name}{box.offsets}: keys {sorted(got)} != {sorted(want)}")
            continue
        for key, t in want.items():
            g = got[key]
            if g.dtype != t.dtype or tuple(g.shape) != tuple(t.shape) or not torch.equal(g, t):
                diff = (g.double() - t.double()).abs().max().item() if g.shape == t.shape else None
                bad.append(f"{box.name}{box.offsets}[{key}]: differs (max abs {diff})")
    return bad


# --------------------------------------------------------------------------- producer


@dataclass
class Faults:
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    seed: int = 0
    #: (iteration, bucket, offset, shadow id) -> never deliver this chunk to that shadow
    withhold: Callable[[int, int, int, int], bool] | None = None
    #: apply drop/dup/reorder to COMMIT records too
    commits: bool = True
    #: (iteration, shadow id, is a retransmission) -> drop this COMMIT
    drop_commit: Callable[[int, int, bool], bool] | None = None


@dataclass
class ProducerStats:
    sent: Counter[str] = field(default_factory=Counter)


class Producer:
    """Trainer rank 0 as the shadows see it: DATA chunks (FINAL) routed per the layout's bucket
    routes to the replicas of the owning shards, COMMIT records to every shadow, and NACKs
    answered with RETX chunks (or the COMMIT for a zero-range NACK). Faults are injected per
    (datagram, destination)."""

    def __init__(
        self,
        layout: Layout,
        *,
        chunk_bytes: int = 1408,
        faults: Faults | None = None,
        keep: int = 16,
    ) -> None:
        self.layout = layout
        self.chunk = chunk_bytes
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
        self.sock.settimeout(0.01)
        self.address = self.sock.getsockname()
        self.dests: list[tuple[str, int]] = []
        self.store: dict[int, tuple[list[bytes], wire.CommitRecord]] = {}
        self.keep = keep
        self.stats = ProducerStats()
        self._held: dict[int, bytes | None] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # chunk -> destination shadows, per bucket
        self._routes: list[list[tuple[int, int, tuple[int, ...]]]] = []
        for b, nbytes in enumerate(layout.bucket_nbytes):
            chunks = []
            for off in range(0, nbytes, chunk_bytes):
                n = min(chunk_bytes, nbytes - off)
                chunks.append((off, n, self._dests_of(b, off, n)))
            self._routes.append(chunks)

    def _dests_of(self, bucket: int, off: int, n: int) -> tuple[int, ...]:
        shards = {
            r.shard for r in self.layout.bucket_routes[bucket] if r.start < off + n and off < r.end
        }
        return tuple(sorted(s for sh in shards for s in self.layout.shadows_of_shard(sh)))

    def start(self, dests: Sequence[tuple[str, int]]) -> None:
        self.dests = list(dests)
        self._thread = threading.Thread(target=self._nack_loop, name="producer-nack", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            assert not self._thread.is_alive()
        self.sock.close()

    # -- sending ---------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _header_fields(self, it: int) -> dict[str, Any]:
        """Rank 0's header fields for its next record of iteration ``it``, sealed with the
        job's key (takes the next sequence number)."""
        return {
            "job": JOB_ID,
            "sender": 0,
            "iteration": it,
            "seq": self._next_seq(),
            "layout": self.layout.digest64,
            "key": KEY,
        }

    def _emit(self, sid: int, parts: Sequence[bytes | memoryview], *, faulty: bool = True) -> None:
        """Send one datagram to shadow ``sid`` through the fault injector (lock held)."""
        f = self.faults
        dest = self.dests[sid]
        if faulty and f.drop and self.rng.random() < f.drop:
            self.stats.sent["dropped"] += 1
            return
        data = b"".join(parts)
        copies = 2 if faulty and f.dup and self.rng.random() < f.dup else 1
        if copies == 2:
            self.stats.sent["duplicated"] += 1
        for _ in range(copies):
            if (
                faulty
                and f.reorder
                and self.rng.random() < f.reorder
                and self._held.get(sid) is None
            ):
                self._held[sid] = data  # sent after the next datagram to this shadow
                self.stats.sent["reordered"] += 1
                continue
            self._send(data, dest)
            held = self._held.get(sid)
            if held is not None:
                self._held[sid] = None
                self._send(held, dest)

    def _send(self, data: bytes, dest: tuple[str, int]) -> None:
        for _ in range(200):
            try:
                self.sock.sendto(data, dest)
                self.stats.sent["datagrams"] += 1
                return
            except BlockingIOError:  # pragma: no cover - loopback send buffer full
                time.sleep(0.001)

    def flush(self) -> None:
        with self._lock:
            for sid, held in list(self._held.items()):
                if held is not None:
                    self._held[sid] = None
                    self._send(held, self.dests[sid])

    def _data(
        self, it: int, bucket: int, off: int, payload: memoryview, retx: bool
    ) -> tuple[bytes, bytes]:
        """(header, MAC tag) of a DATA chunk, sealed with the job's key as a trainer does."""
        dtype = self._dtype(bucket)
        flags = wire.Flag.FINAL | (wire.Flag.RETX if retx else 0)
        return wire.seal(
            wire.Kind.DATA,
            payload=payload,
            flags=flags,
            dtype=dtype,
            bucket=bucket,
            offset=off,
            **self._header_fields(it),
        )

    def _dtype(self, bucket: int) -> wire.DType:
        name = self.layout.buckets[bucket][0]
        return wire.DType.from_name(self.layout.placement(name).spec.dtype)

    def send_iteration(
        self,
        it: int,
        buckets: list[bytes],
        commit: wire.CommitRecord,
        *,
        commit_first: bool = False,
    ) -> None:
        with self._lock:
            self.store[it] = (buckets, commit)
            for old in [k for k in self.store if k <= it - self.keep]:
                del self.store[old]
            if commit_first:
                self._send_commit(it, commit, retx=False)
            for b, chunks in enumerate(self._routes):
                mv = memoryview(buckets[b])
                for off, n, dests in chunks:
                    payload = mv[off : off + n]
                    header, tag = self._data(it, b, off, payload, retx=False)
                    for sid in dests:
                        w = self.faults.withhold
                        if w is not None and w(it, b, off, sid):
                            self.stats.sent["withheld"] += 1
                            continue
                        self._emit(sid, (header, payload, tag))
            if not commit_first:
                self._send_commit(it, commit, retx=False)
        self.flush()

    def _send_commit(
        self, it: int, commit: wire.CommitRecord, *, retx: bool, only: int | None = None
    ) -> None:
        data = commit.encode(retx=retx, **self._header_fields(it))
        for sid in range(len(self.dests)) if only is None else (only,):
            dc = self.faults.drop_commit
            if dc is not None and dc(it, sid, retx):
                self.stats.sent["commit_dropped"] += 1
                continue
            if retx:
                self.stats.sent["commit_retx"] += 1
            self._emit(sid, (data,), faulty=self.faults.commits)

    # -- NACK service ----------------------------------------------------------------------

    def _nack_loop(self) -> None:
        buf = bytearray(wire.MAX_DATAGRAM + 1)
        while not self._stop.is_set():
            try:
                n, _addr = self.sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                msg = wire.decode(
                    memoryview(buf)[:n], job=JOB_ID, layout=self.layout.digest64, key=KEY
                )
            except WireError:
                self.stats.sent["bad_nack"] += 1
                continue
            if msg.header.kind is not wire.Kind.NACK:
                continue
            sid = msg.header.sender
            rec = wire.NackRecord.from_message(msg)
            self.stats.sent["nacks"] += 1
            with self._lock:
                stored = self.store.get(msg.header.iteration)
                if stored is None or sid >= len(self.dests):
                    self.stats.sent["nack_unknown"] += 1
                    continue
                buckets, commit = stored
                it = msg.header.iteration
                if not rec.ranges:
                    self._send_commit(it, commit, retx=True, only=sid)
                for r in rec.ranges:
                    mv = memoryview(buckets[r.bucket])
                    for off in range(r.offset, r.offset + r.length, self.chunk):
                        n2 = min(self.chunk, r.offset + r.length - off)
                        w = self.faults.withhold
                        if w is not None and w(it, r.bucket, off - off % self.chunk, sid):
                            self.stats.sent["withheld"] += 1
                            continue
                        payload = mv[off : off + n2]
                        header, tag = self._data(it, r.bucket, off, payload, True)
                        self._emit(sid, (header, payload, tag))
                        self.stats.sent["retx"] += 1
            self.flush()


# --------------------------------------------------------------------------- cluster


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def make_spec(
    shadow_addrs: Sequence[tuple[str, int]],
    trainer_addrs: Sequence[tuple[str, int]],
    replication: int,
    *,
    gap_repair: str = "40ms",
    snapshot_every: int = 0,
    snapshot_dir: str | None = None,
) -> JobSpec:
    shadows: dict[str, Any] = {
        "count": len(shadow_addrs),
        "replication": replication,
        "addresses": [f"{h}:{p}" for h, p in shadow_addrs],
        "control_port": 40000,
        "snapshot_every": snapshot_every,
    }
    if snapshot_dir is not None:
        shadows["snapshot_dir"] = snapshot_dir
    return parse_spec(
        {
            "job": {"id": JOB_ID, "name": "shadow-test", "mode": "mirror"},
            "trainers": {
                "world_size": len(trainer_addrs),
                "addresses": [f"{h}:{p}" for h, p in trainer_addrs],
            },
            "shadows": shadows,
            "switch": {"target": "none"},
            "timeouts": {
                "gap_repair": gap_repair,
                "heartbeat": "20ms",
                "failure_detect": "1s",
                "rpc": "2s",
            },
        },
        env={},
    )


def start_all(
    nodes: Sequence[ShadowNode], producer: Producer, addrs: Sequence[tuple[str, int]]
) -> None:
    """Start every shadow node, then the producer toward their data addresses ``addrs``."""
    for n in nodes:
        n.start()
    producer.start(addrs)


class Cluster:
    """``num_shadows`` real ShadowNodes (threads in this process) + a Producer, on loopback."""

    def __init__(
        self,
        layout: Layout,
        *,
        faults: Faults | None = None,
        options: NodeOptions | None = None,
        chunk_bytes: int = 1408,
        gap_repair: str = "40ms",
        snapshot_every: int = 0,
        snapshot_dir: str | None = None,
    ) -> None:
        self.layout = layout
        self.producer = Producer(layout, chunk_bytes=chunk_bytes, faults=faults)
        socks = [_udp() for _ in range(layout.num_shadows)]
        addrs = [s.getsockname() for s in socks]
        self.spec = make_spec(
            addrs,
            [self.producer.address],
            layout.replication,
            gap_repair=gap_repair,
            snapshot_every=snapshot_every,
            snapshot_dir=snapshot_dir,
        )
        self.nodes: list[ShadowNode] = []
        self.clients: list[ShadowClient] = []
        try:
            for k, s in enumerate(socks):
                self.nodes.append(
                    ShadowNode(
                        self.spec,
                        k,
                        token=TOKEN,
                        sock=s,
                        control_bind="tcp://127.0.0.1:*",
                        options=options,
                    )
                )
            for a in self.nodes:
                for b in self.nodes:
                    if a is not b:
                        a.set_peer_control(b.id, b.control_endpoint)
            start_all(self.nodes, self.producer, addrs)
        except BaseException:
            self.close()
            raise
        self.clients = [ShadowClient(n.control_endpoint, TOKEN, timeout_s=10.0) for n in self.nodes]

    def close(self) -> None:
        for c in self.clients:
            c.close()
        errors = []
        for n in self.nodes:
            try:
                n.stop()
            except Exception as e:  # keep stopping the others
                errors.append(e)
        self.producer.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_steps(
        self, trainer: RefTrainer, iterations: Iterable[int]
    ) -> Iterator[tuple[int, wire.CommitRecord]]:
        """For each iteration, ``trainer``'s step sent by the producer (DATA, then COMMIT);
        yields (iteration, its COMMIT) once it is sent."""
        for it in iterations:
            grads, commit = trainer.step(it)
            self.producer.send_iteration(it, bucket_bytes(self.layout, grads), commit)
            yield it, commit

    def send_all(self, trainer: RefTrainer, iterations: Iterable[int]) -> wire.CommitRecord | None:
        """:meth:`send_steps` without a pause; the last COMMIT sent (None: no iteration)."""
        last = None
        for step in self.send_steps(trainer, iterations):
            last = step[1]
        return last

    def load(self, named: Mapping[str, torch.Tensor], opt: OptimizerSpec) -> None:
        for n, c in zip(self.nodes, self.clients, strict=True):
            shard, _ = self.layout.shard_of_shadow(n.id)
            c.load(
                -1, initial_states(self.layout, shard, named), opt.to_json(), self.layout.to_json()
            )

    def wait(
        self,
        pred: Callable[[ShadowNode, dict[str, Any]], bool],
        timeout_s: float,
        nodes: Sequence[int] | None = None,
    ) -> bool:
        deadline = time.monotonic() + timeout_s
        ids = range(len(self.nodes)) if nodes is None else nodes
        while time.monotonic() < deadline:
            for n in self.nodes:
                if n.failed is not None:
                    raise AssertionError(f"shadow {n.id} died: {n.failed!r}")
            if all(pred(self.nodes[k], self.nodes[k].status(timeline=0)) for k in ids):
                return True
            time.sleep(0.002)
        return False

    def wait_applied(
        self, it: int, timeout_s: float = 20.0, nodes: Sequence[int] | None = None
    ) -> None:
        ok = self.wait(
            lambda _n, st: st["last_applied"] is not None and st["last_applied"] >= it,
            timeout_s,
            nodes,
        )
        if not ok:
            raise AssertionError(
                f"iteration {it} not applied in {timeout_s}s: "
                f"{[self._brief(n) for n in self.nodes]}"
            )

    def wait_istar(self, it: int, timeout_s: float = 10.0) -> None:
        """Until every shadow's I* is ``it``: a shadow learns that its peers applied an
        iteration from their READY records (soft state, resent every <= 50 ms), so right after
        the last apply its own view may still be one behind."""
        if not self.wait(lambda _n, st: st["istar"] == it, timeout_s):
            raise AssertionError(
                f"I* did not reach {it} in {timeout_s}s: {[self._brief(n) for n in self.nodes]}"
            )

    @staticmethod
    def _brief(n: ShadowNode) -> dict[str, Any]:
        st = n.status(timeline=0)
        return {
            k: st[k]
            for k in (
                "shadow",
                "last_ready",
                "last_applied",
                "istar",
                "diverged_at",
                "counters",
                "peers",
            )
        }

    def check(
        self, it: int, trainer: RefTrainer, replicas: Sequence[int] | None = None
    ) -> list[str]:
        """Fetch every shard's state of ``it`` (from each listed replica index) and compare."""
        named = trainer.named
        opt_state = state_by_name(trainer.opt, trainer.model.named_parameters())
        bad: list[str] = []
        for shard in range(self.layout.num_shards):
            for r, sid in enumerate(self.layout.shadows_of_shard(shard)):
                if replicas is not None and r not in replicas:
                    continue
                res = self.clients[sid].fetch(it)
                assert res.iteration == it
                bad += [
                    f"shadow {sid}: {m}"
                    for m in compare_shard(self.layout, shard, res.states, named, opt_state)
                ]
        return bad


@contextlib.contextmanager
def cluster(layout: Layout, **kw: Any) -> Iterator[Cluster]:
    c = Cluster(layout, **kw)
    try:
        yield c
    finally:
        c.close()
