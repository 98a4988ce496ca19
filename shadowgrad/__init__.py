"""shadowgrad: in-network, per-iteration checkpointing for data-parallel training.

A P4 program on the top-of-rack switch copies the fully reduced gradient chunks of all-reduce to
CPU shadow nodes; the shadows replay the optimizer step, so together they hold model + optimizer
state at every iteration. See README.md and docs/.

Importing ``shadowgrad`` (or ``shadowgrad.wire``, ``shadowgrad.layout``, ``shadowgrad.config``,
``shadowgrad.trainer_hooks``) never imports grpc, protobuf, scapy or mininet.
"""

from __future__ import annotations

from shadowgrad.errors import ShadowgradError

__all__ = ["__version__", "ShadowgradError"]

__version__ = "0.1.0"
