"""Test and demo helpers shared by the peer packages' test helpers: the test token, and the
loopback job specs of :mod:`shadowgrad.specs` re-exported (core: ``shadowgrad.trainer_hooks.
_testing`` and ``shadowgrad.shadow.testing`` both build on it; no training job needs this
module)."""

from __future__ import annotations

from shadowgrad.specs import loopback_spec, spec_toml, switch_spec

__all__ = ["TOKEN", "loopback_spec", "switch_spec", "spec_toml"]

TOKEN = "trainer-test-token"
