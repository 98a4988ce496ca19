"""Trainer hooks in one process (world size 1, no DDP) against real shadow nodes: repair of lost
datagrams through NACK/RETX, and invariant 5 (training never waits for shadows)."""

from __future__ import annotations

import gc
import statistics
import time
import weakref
from typing import Any

import pytest
import torch
from torch import nn

from shadowgrad.config import JobSpec, parse_spec
from shadowgrad.optspec import state_by_name
from shadowgrad.specs import loopback_spec
from shadowgrad.testing.cluster import shadow_cluster
from shadowgrad.testing.specs import TOKEN
from shadowgrad.trainer_hooks import attach


def _spec(**job: Any) -> JobSpec:
    """The spec of a job on this host's loopback (:func:`loopback_spec`'s ``job`` options)."""
    return parse_spec(loopback_spec(**job), env={})


def _setup(spec: Any, *, scaler: bool = True, fused: bool = False) -> tuple[Any, ...]:
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(16, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 3)
    )
    opt = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if "weight" in n]},
            {
                "params": [p for n, p in model.named_parameters() if "bias" in n],
                "weight_decay": 0.0,
            },
        ],
        lr=1e-2,
        fused=fused,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    gs = torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=4) if scaler else None
    sg = attach(
        model, opt, spec, lr_scheduler=sched, grad_scaler=gs, max_grad_norm=0.3, token=TOKEN
    )
    return model, opt, sg


def _train(model: nn.Module, sg: Any, steps: int, start: int = 0) -> list[float]:
    times = []
    for it in range(start, start + steps):
        g = torch.Generator().manual_seed(it)
        x, y = torch.randn(64, 16, generator=g), torch.randint(0, 3, (64,), generator=g)
        t0 = time.perf_counter()
        sg.backward(nn.functional.cross_entropy(model(x), y))
        sg.step(user_state={"it": it})
        times.append(time.perf_counter() - t0)
    return times


def _assert_shadows_equal(cluster: Any, sg: Any, model: nn.Module, opt: Any) -> None:
    it, params, ostate = cluster.full_state(sg.layout)
    assert it == sg.iteration - 1
    for n, p in model.named_parameters():
        assert torch.equal(params[n], p.detach()), n
    for n, st in state_by_name(opt, model.named_parameters()).items():
        for k, v in st.items():
            assert torch.equal(ostate[n][k], v), (n, k)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_lost_datagrams_are_repaired_bit_exact(fused: bool) -> None:
    spec = _spec(world=1, shadows=3, gap_repair="20ms")
    with shadow_cluster(spec) as cluster:
        model, opt, sg = _setup(spec, fused=fused)
        with sg:
            assert sg.restore_or_start().iteration == 0
            assert sg._sender is not None
            sg._sender.drop_first_sends = 0.05  # 5% of first sends lost, DATA and COMMIT
            sg.chunk_bytes = 4096
            sg._sender.chunk_bytes = 4096
            _train(model, sg, 25)
            assert sg.flush(10)
            assert cluster.wait_applied(24, timeout_s=60), cluster.status()
            _assert_shadows_equal(cluster, sg, model, opt)
            stats = sg.stats()["mirror"]
            assert stats["injected_drops"] > 0
            assert stats["nacks"] > 0 and stats["retx_chunks"] > 0
            assert not sg.degraded


def test_no_shadow_running_never_stalls_training() -> None:
    spec = _spec(world=1, shadows=2, rpc="200ms")  # nothing listens on the shadows' addresses
    model, _opt, sg = _setup(spec)
    with sg:
        t0 = time.monotonic()
        start = sg.restore_or_start()
        assert start == (0, None, False)
        assert time.monotonic() - t0 < 5.0  # 2 status calls of 200 ms each, no retries
        assert sg.degraded
        times = _train(model, sg, 20)
    # a stall would be a shadow call on the training thread: at least its 200 ms rpc timeout
    # on every step. The median, not the max: one step of a loaded machine (1.34 s seen) is
    # no stall
    assert statistics.median(times) < 0.2, times
    assert sg.stats()["degraded_reason"] == "no_shadow_reachable"


def test_queued_work_wakes_the_idle_sender_at_once() -> None:
    # the idle sender thread waits in select(); a capture must wake it, not wait for the poll
    # period: with the period at 60 s every flush below would time out if it did (the bug: the
    # Condition's notify could not interrupt select, so a rank's sender lagged training by up
    # to its 20 ms poll, i.e. several iterations of a small model, and a SIGKILL lost them)
    spec = _spec(world=1, shadows=2)
    with shadow_cluster(spec) as cluster:
        model, _opt, sg = _setup(spec, scaler=False)
        with sg:
            sg.restore_or_start()
            sender = sg._sender
            assert sender is not None
            assert sg.flush(10)
            sender._idle_timeout = lambda: 60.0  # type: ignore[method-assign]
            time.sleep(0.1)  # let the thread enter the long select
            for it in range(5):
                _train(model, sg, 1, start=it)
                assert sender.flush(10), f"iteration {it} still queued after 10 s"
            assert cluster.wait_applied(4, timeout_s=30), cluster.status()
            assert not sg.degraded


def test_slow_network_drops_iterations_not_training() -> None:
    spec = _spec(world=1, shadows=2)
    with shadow_cluster(spec):
        model, _opt, sg = _setup(spec, scaler=False)
        with sg:
            sg.restore_or_start()
            sender = sg._sender
            assert sender is not None
            real = sender._sendto

            def slow(*a: Any, **kw: Any) -> bool:
                time.sleep(0.05)  # a congested path: 50 ms per datagram
                return real(*a, **kw)

            sender._sendto = slow  # type: ignore[method-assign]
            times = _train(model, sg, 40)
            st = sg.stats()
            sender._sendto = real  # type: ignore[method-assign]
    assert st["mirror"]["dropped_iterations"] > 0
    assert sg.degraded
    assert sorted(times)[len(times) // 2] < 0.05, times  # median step unaffected


def test_restart_in_process_restores_model_and_optimizer() -> None:
    """A second attach() against the same shadows restores the state of the last iteration."""
    spec = _spec(world=1, shadows=3)
    with shadow_cluster(spec) as cluster:
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with attach(model, opt, spec, max_grad_norm=0.3, token=TOKEN) as sg:
            assert sg.restore_or_start() == (0, None, False)
            _train(model, sg, 7)
            assert sg.flush(10)
        assert cluster.wait_applied(6, timeout_s=30)
        torch.manual_seed(99)  # a different initialisation: everything must come back
        model2 = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        with attach(model2, opt2, spec, max_grad_norm=0.3, token=TOKEN) as sg2:
            start = sg2.restore_or_start()
            assert (start.iteration, start.restored) == (7, True)
            for (n, p), p2 in zip(model.named_parameters(), model2.parameters(), strict=True):
                assert torch.equal(p, p2), n
            a = state_by_name(opt, model.named_parameters())
            b = state_by_name(opt2, model2.named_parameters())
            for n in a:
                for k in a[n]:
                    assert torch.equal(a[n][k], b[n][k]), (n, k)
            # both continue identically
            _train(model, _Plain(opt), 2, start=7)
            _train(model2, sg2, 2, start=7)
        for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
            assert torch.equal(p, p2)


def test_restore_writes_in_place_and_the_shadows_keep_their_own_state() -> None:
    """Issue 23: a restore fetches every shard at once and writes the parameters in place (the
    model's own tensors, no second copy of the state); the shadows that served I* keep their
    own state as the new session's start (a keep load: nothing travels back), and the restored
    session goes on bit-identically on the trainer and on every shadow."""
    spec = _spec(world=1, shadows=3)
    with shadow_cluster(spec) as cluster:
        model, opt, sg = _setup(spec)
        with sg:
            sg.restore_or_start()
            _train(model, sg, 6)
            assert sg.flush(10)
        assert cluster.wait_applied(5, timeout_s=30)
        torch.manual_seed(5)  # another initialisation: everything must come back
        model2, opt2, sg2 = _setup(spec)
        with torch.no_grad():
            for p in model2.parameters():
                p.add_(1.0)
        ptrs = {n: p.data_ptr() for n, p in model2.named_parameters()}
        kept0 = [n.ev["loads_kept"] for n in cluster.nodes]
        with sg2:
            start = sg2.restore_or_start()
            assert (start.iteration, start.restored) == (6, True)
            assert {n: p.data_ptr() for n, p in model2.named_parameters()} == ptrs
            for (n, p), p2 in zip(model.named_parameters(), model2.parameters(), strict=True):
                assert torch.equal(p, p2), n
            a = state_by_name(opt, model.named_parameters())
            b = state_by_name(opt2, model2.named_parameters())
            assert a.keys() == b.keys()
            for n in a:
                for k in a[n]:
                    assert torch.equal(a[n][k], b[n][k]), (n, k)
            assert [n.ev["loads_kept"] - k for n, k in zip(cluster.nodes, kept0, strict=True)] == [
                1,
                1,
                1,
            ]
            _train(model2, sg2, 4, start=6)
            assert sg2.flush(10)
            assert cluster.wait_applied(9, timeout_s=30)
            _assert_shadows_equal(cluster, sg2, model2, opt2)


class _Plain:
    """What sg.backward/sg.step do without a scaler or scheduler (clip 0.3), for comparison."""

    def __init__(self, opt: Any) -> None:
        self.opt = opt

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, user_state: Any = None) -> None:
        params = [p for g in self.opt.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, 0.3)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def test_a_clean_close_tells_every_shadow_that_training_finished() -> None:
    """Rank 0's close() after the last iteration: every shadow's status says ``finished``
    (the last iteration trained, this instance's generation) — no controller needed. A close
    by an exception says nothing."""
    spec = _spec(world=1, shadows=2)
    with shadow_cluster(spec) as cluster:
        model, _opt, sg = _setup(spec, scaler=False)
        with sg:
            sg.restore_or_start()
            _train(model, sg, 4)
            assert all(st["finished"] is None for st in cluster.status())
        for st in cluster.status():
            assert st["finished"] == {
                "iteration": 3,
                "generation": sg.generation,
                "requester": "rank 0",
            }, st
            assert st["last_applied"] == 3
        # a rerun (a newer generation loads the shadows) is no longer finished; leaving its
        # ``with`` block by an exception does not say it finished
        model, _opt, sg = _setup(spec, scaler=False)
        with pytest.raises(RuntimeError, match="user code"), sg:
            assert sg.restore_or_start().restored
            _train(model, sg, 1, start=4)
            raise RuntimeError("user code failed")
        assert all(st["finished"] is None for st in cluster.status()), cluster.status()


def test_a_closed_session_is_freed_with_its_last_reference() -> None:
    """The mirror sender, the health monitor and their callbacks refer back to the session
    weakly: a closed session, with its staging slots, goes when the last reference to it does,
    not at the cyclic collector's next pass (which lands in whatever runs then: the next
    session's training)."""
    spec = _spec(world=1, shadows=2)
    with shadow_cluster(spec) as cluster:

        def run() -> weakref.ref[Any]:
            model, _, sg = _setup(spec)
            with sg:
                sg.restore_or_start()
                _train(model, sg, 4)
                assert cluster.wait_applied(3, timeout_s=30)
            assert sg.stats()["mirror"]["data_chunks"] > 0  # readable after close
            return weakref.ref(sg)

        run()  # the process's one-time lazy imports (torch's hold their callers' frames a while)
        gc.collect()
        gc.disable()
        try:
            ref = run()
            assert ref() is None
        finally:
            gc.enable()
