"""Shadows that hold a reference trainer's state: :func:`loaded_cluster`, a
:func:`~shadowgrad.testing.cluster.producer_cluster` loaded with a
:class:`~shadowgrad.testing.training.RefTrainer`'s initial state, and :func:`trainer_state`, a
copy of the trainer's state as it stands, which a shard's fetched state is compared with
(:func:`~shadowgrad.testing.training.compare_shard`)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from shadowgrad.layout import Layout
from shadowgrad.optspec import state_by_name
from shadowgrad.testing.cluster import ShadowCluster, producer_cluster
from shadowgrad.testing.training import RefTrainer, bucket_bytes

__all__ = ["loaded_cluster", "run_applied", "trainer_state"]


@contextmanager
def loaded_cluster(trainer: RefTrainer, layout: Layout, **cluster: Any) -> Iterator[ShadowCluster]:
    """``producer_cluster(layout, **cluster)``, every shadow loaded with ``trainer``'s
    parameters and optimizer (the state before its first iteration)."""
    with producer_cluster(layout, **cluster) as c:
        c.load(trainer.named, trainer.optimizer_spec())
        yield c


def trainer_state(
    trainer: RefTrainer,
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """A copy of ``trainer``'s parameters and optimizer state (by parameter name) as they are
    now: ``compare_shard``'s ``named`` and ``opt_state``."""
    named = {k: v.detach().clone() for k, v in trainer.named.items()}
    st = copy.deepcopy(state_by_name(trainer.opt, trainer.model.named_parameters()))
    return named, st


def run_applied(c: ShadowCluster, trainer: RefTrainer, layout: Layout, its: Iterable[int]) -> None:
    """Step ``trainer`` through iterations ``its``, stream each to the shadows (gradients and
    COMMIT) and wait until they applied it."""
    assert c.producer is not None, "a producer_cluster streams through its producer"
    for it in its:
        grads, commit = trainer.step(it)
        c.producer.send_iteration(it, bucket_bytes(layout, grads), commit)
        c.expect_applied(it)
