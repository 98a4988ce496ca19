"""Real shadow nodes in-process: :class:`ShadowCluster`, every shadow of a job as a
:class:`~shadowgrad.shadow.node.ShadowNode` on a thread of this process, with a control client
per node. Two ways to get one:

* :func:`shadow_cluster` (spec): the shadows of a job spec, bound to the spec's addresses and
  control ports, for trainers (in-process or child processes) that send to them;
* :func:`producer_cluster` (layout): shadows on sockets bound here and ephemeral control ports,
  fed by a test :class:`~shadowgrad.testing.producer.Producer` that plays the trainers
  (:meth:`ShadowCluster.send_steps`, fault injection, :meth:`ShadowCluster.check` against a
  :class:`~shadowgrad.testing.training.RefTrainer`).

``wait_*`` methods answer whether the condition came true in time; ``expect_*`` methods raise
``AssertionError`` with every shadow's brief status when it did not. A shadow whose threads died
fails every wait at once.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from shadowgrad import wire
from shadowgrad.boxes import assemble_full
from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.control_client import ShadowClient
from shadowgrad.errors import ControlError
from shadowgrad.layout import Layout
from shadowgrad.messages import ShadowStatus
from shadowgrad.optspec import OptimizerSpec, state_by_name
from shadowgrad.shadow.node import NodeOptions, ShadowNode

from .producer import Faults, Producer
from .specs import TOKEN, bound_spec
from .training import RefTrainer, bucket_bytes, compare_shard, initial_states

__all__ = ["ShadowCluster", "fetch_from_shadows", "producer_cluster", "shadow_cluster"]

#: what :meth:`ShadowCluster.brief` keeps of a shadow's status
_BRIEF = ("shadow", "last_ready", "last_applied", "istar", "diverged_at", "counters", "peers")


class ShadowCluster:
    """Real :class:`~shadowgrad.shadow.node.ShadowNode` s for every shadow of ``spec``, as
    threads of this process, and a :class:`~shadowgrad.control_client.ShadowClient` per node
    (:attr:`clients`, ``client_timeout_s``).

    By default each node binds the spec's data address and control port. ``socks`` (one bound
    UDP socket per shadow) and ``control_bind`` (e.g. ``"tcp://127.0.0.1:*"``) bind elsewhere;
    with ``control_bind`` every node is told its peers' control endpoints. ``producer`` (given
    by :func:`producer_cluster`) is started toward the shadows' data addresses once they run,
    and closed with the cluster. ``poll_s``: how often the waits poll the nodes' status."""

    def __init__(
        self,
        spec: JobSpec,
        token: str = TOKEN,
        *,
        layout: Layout | None = None,
        socks: Sequence[socket.socket] | None = None,
        control_bind: str | None = None,
        options: NodeOptions | None = None,
        producer: Producer | None = None,
        client_timeout_s: float = 30.0,
        poll_s: float = 0.01,
    ) -> None:
        self.spec = spec
        self.layout = layout
        self.producer = producer
        self.poll_s = poll_s
        self.nodes: list[ShadowNode] = []
        self.clients: list[ShadowClient] = []
        try:
            for k in range(spec.shadows.count):
                self.nodes.append(
                    ShadowNode(
                        spec,
                        k,
                        token=token,
                        sock=None if socks is None else socks[k],
                        control_bind=control_bind,
                        options=options,
                    )
                )
            if control_bind is not None:
                for a in self.nodes:
                    for b in self.nodes:
                        if a is not b:
                            a.set_peer_control(b.id, b.control_endpoint)
            for n in self.nodes:
                n.start()
            if producer is not None:
                if socks is None:
                    raise ValueError("a producer needs the shadows' sockets (socks)")
                producer.start([s.getsockname() for s in socks])
        except BaseException:
            self.close()
            raise
        self.clients = [
            ShadowClient(n.control_endpoint, token, timeout_s=client_timeout_s) for n in self.nodes
        ]

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the clients, stop every node (all of them, then raise the first error) and
        the producer."""
        for c in self.clients:
            c.close()
        self.clients = []
        first: BaseException | None = None
        for n in self.nodes:
            try:
                n.stop()
            except Exception as exc:  # keep stopping the others
                first = first or exc
        self.nodes = []
        if self.producer is not None:
            self.producer.close()
            self.producer = None
        if first is not None:
            raise first

    def __enter__(self) -> ShadowCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _layout(self, layout: Layout | None) -> Layout:
        """``layout``, else the cluster's own, else the one its shadows were loaded with (the
        trainers' load: shadow 0's ``config``)."""
        got = layout if layout is not None else self.layout
        if got is None:
            try:
                got = Layout.from_json(self.clients[0].config().layout)
            except ControlError as e:
                raise ValueError(f"no layout: none given and shadow 0 has none ({e})") from None
        return got

    # -- status and waiting ------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Every node's status (no timeline)."""
        return [n.status(timeline=0) for n in self.nodes]

    def brief(self) -> list[dict[str, Any]]:
        """The part of every node's status that explains a wait that timed out."""
        return [{k: st[k] for k in _BRIEF} for st in self.status()]

    def wait(
        self,
        pred: Callable[[ShadowNode, dict[str, Any]], bool],
        timeout_s: float,
        nodes: Sequence[int] | None = None,
    ) -> bool:
        """Until ``pred(node, its status)`` holds for every node (or those in ``nodes``);
        whether it did within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        ids = range(len(self.nodes)) if nodes is None else nodes
        while time.monotonic() < deadline:
            for n in self.nodes:
                if n.failed is not None:
                    raise AssertionError(f"shadow {n.id} died: {n.failed!r}")
            if all(pred(self.nodes[k], self.nodes[k].status(timeline=0)) for k in ids):
                return True
            time.sleep(self.poll_s)
        return False

    def wait_applied(
        self, it: int, timeout_s: float = 60.0, nodes: Sequence[int] | None = None
    ) -> bool:
        """Whether every node (or those in ``nodes``) applied iteration ``it`` in time."""
        return self.wait(
            lambda _n, st: st["last_applied"] is not None and st["last_applied"] >= it,
            timeout_s,
            nodes,
        )

    def expect_applied(
        self, it: int, timeout_s: float = 20.0, nodes: Sequence[int] | None = None
    ) -> None:
        """:meth:`wait_applied`, failing the test when it times out."""
        if not self.wait_applied(it, timeout_s, nodes):
            raise AssertionError(f"iteration {it} not applied in {timeout_s}s: {self.brief()}")

    def expect_istar(self, it: int, timeout_s: float = 10.0) -> None:
        """Until every shadow's I* is ``it``: a shadow learns that its peers applied an
        iteration from their READY records (soft state, resent every <= 50 ms), so right after
        the last apply its own view may still be one behind."""
        if not self.wait(lambda _n, st: st["istar"] == it, timeout_s):
            raise AssertionError(f"I* did not reach {it} in {timeout_s}s: {self.brief()}")

    # -- state -------------------------------------------------------------------------------

    def load(
        self, named: Mapping[str, torch.Tensor], opt: OptimizerSpec, layout: Layout | None = None
    ) -> None:
        """Load every shadow with the trainer's initial state (iteration -1)."""
        lay = self._layout(layout)
        for n, c in zip(self.nodes, self.clients, strict=True):
            shard, _ = lay.shard_of_shadow(n.id)
            c.load(-1, initial_states(lay, shard, named), opt.to_json(), lay.to_json())

    def full_state(
        self, layout: Layout | None = None, iteration: int | None = None
    ) -> tuple[int, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """Every shard's state (replica 0) at ``iteration`` glued into full tensors."""
        lay = self._layout(layout)
        exports = []
        its = set()
        for shard in range(lay.num_shards):
            res = self.clients[lay.shadows_of_shard(shard)[0]].fetch(iteration)
            its.add(res.iteration)
            exports.append([res.states[b] for b in range(len(lay.shard_entries(shard)))])
        if len(its) != 1:
            raise AssertionError(f"shards answered different iterations {sorted(its)}")
        params, opt = assemble_full(lay, exports)
        return its.pop(), params, opt

    def check(
        self, it: int, trainer: RefTrainer, replicas: Sequence[int] | None = None
    ) -> list[str]:
        """Fetch every shard's state of ``it`` (from each listed replica index) and compare
        with ``trainer``'s; the mismatches (empty: bit-exact)."""
        lay = self._layout(None)
        named = trainer.named
        opt_state = state_by_name(trainer.opt, trainer.model.named_parameters())
        bad: list[str] = []
        for shard in range(lay.num_shards):
            for r, sid in enumerate(lay.shadows_of_shard(shard)):
                if replicas is not None and r not in replicas:
                    continue
                res = self.clients[sid].fetch(it)
                assert res.iteration == it
                bad += [
                    f"shadow {sid}: {m}"
                    for m in compare_shard(lay, shard, res.states, named, opt_state)
                ]
        return bad

    # -- the producer ------------------------------------------------------------------------

    def _producer(self) -> Producer:
        if self.producer is None:
            raise ValueError("no producer: this cluster was not built by producer_cluster")
        return self.producer

    def send_steps(
        self, trainer: RefTrainer, iterations: Iterable[int]
    ) -> Iterator[tuple[int, wire.CommitRecord]]:
        """For each iteration, ``trainer``'s step sent by the producer (DATA, then COMMIT);
        yields (iteration, its COMMIT) once it is sent."""
        producer, lay = self._producer(), self._layout(None)
        for it in iterations:
            grads, commit = trainer.step(it)
            producer.send_iteration(it, bucket_bytes(lay, grads), commit)
            yield it, commit

    def send_all(self, trainer: RefTrainer, iterations: Iterable[int]) -> wire.CommitRecord | None:
        """:meth:`send_steps` without a pause; the last COMMIT sent (None: no iteration)."""
        last = None
        for step in self.send_steps(trainer, iterations):
            last = step[1]
        return last


@contextlib.contextmanager
def shadow_cluster(spec: JobSpec, token: str = TOKEN, **kw: Any) -> Iterator[ShadowCluster]:
    """:class:`ShadowCluster` of ``spec``'s shadows at the spec's addresses, closed on exit
    (``kw``: the class's keyword arguments)."""
    with ShadowCluster(spec, token, **kw) as c:
        yield c


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


@contextlib.contextmanager
def producer_cluster(
    layout: Layout,
    *,
    faults: Faults | None = None,
    options: NodeOptions | None = None,
    chunk_bytes: int = 1408,
    gap_repair: str = "40ms",
    snapshot_every: int = 0,
    snapshot_dir: str | None = None,
) -> Iterator[ShadowCluster]:
    """``layout.num_shadows`` shadows on sockets of 127.0.0.1 bound here, on ephemeral control
    ports (peers told of each other), fed by a :class:`~shadowgrad.testing.producer.Producer`
    (``chunk_bytes``, ``faults``) that is their job's one trainer; closed on exit."""
    producer = Producer(layout, chunk_bytes=chunk_bytes, faults=faults)
    socks: list[socket.socket] = []
    try:
        socks = [_udp() for _ in range(layout.num_shadows)]
        doc = bound_spec(
            [s.getsockname() for s in socks],
            [producer.address],
            layout.replication,
            gap_repair=gap_repair,
            snapshot_every=snapshot_every,
            snapshot_dir=snapshot_dir,
        )
        c = ShadowCluster(
            parse_spec(doc, env={}),
            layout=layout,
            socks=socks,
            control_bind="tcp://127.0.0.1:*",
            options=options,
            producer=producer,
            client_timeout_s=10.0,
            poll_s=0.002,
        )
    except BaseException:
        producer.close()
        for s in socks:
            s.close()
        raise
    with c:
        yield c


def fetch_from_shadows(
    spec: JobSpec, token: str, iteration: int, *, timeout_s: float = 30.0
) -> tuple[Layout, dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], list[ShadowStatus]]:
    """What a job's running shadows hold of ``iteration``, over their control endpoints: the
    layout (from the first shadow's ``config``), the full parameters and optimizer state
    (every shadow fetched, the first replica of each shard assembled) and every shadow's
    status after its fetch."""
    layout: Layout | None = None
    exports: dict[int, list[dict[str, torch.Tensor]]] = {}
    statuses: list[ShadowStatus] = []
    for k in range(spec.shadows.count):
        with ShadowClient(
            f"tcp://{spec.shadows.control_endpoint(k)}", token, timeout_s=timeout_s
        ) as c:
            res = c.fetch(iteration)
            statuses.append(c.status(timeline=0))
            if layout is None:
                layout = Layout.from_json(c.config().layout)
            shard = layout.shard_of_shadow(k)[0]
            exports.setdefault(shard, [res.states[b] for b in range(len(res.states))])
    if layout is None:
        raise ValueError("the spec has no shadows")
    params, opt = assemble_full(layout, [exports[s] for s in range(layout.num_shards)])
    return layout, params, opt, statuses
