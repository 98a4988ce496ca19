"""The typed control replies, under their former home: every name here is the one in
:mod:`shadowgrad.messages`, the control protocol's schema (one request and one reply class
per op). Kept so that existing imports (``from shadowgrad.replies import ShadowStatus``) go on
working; new code imports :mod:`shadowgrad.messages`."""

from __future__ import annotations

from shadowgrad.messages import (
    ControllerStatus,
    PeerStatus,
    RankStatus,
    RestorePointReply,
    ShadowConfig,
    ShadowStatus,
    StatusLike,
    shadow_status,
    shadow_statuses,
)

__all__ = [
    "ShadowStatus",
    "RankStatus",
    "PeerStatus",
    "ShadowConfig",
    "ControllerStatus",
    "RestorePointReply",
    "StatusLike",
    "shadow_status",
    "shadow_statuses",
]
