"""The shadow's control protocol (pyzmq) and :class:`ShadowClient`.

Every request is one multipart message: a JSON header frame ``{"op": ..., "token": ..., ...}``
followed by binary frames (``load`` only). Every reply is a JSON header frame
``{"ok": true, ...}`` or ``{"ok": false, "code": ..., "error": ...}`` followed by binary frames
(``fetch`` only). Tensors travel as *entries* in the header, each naming its box (index in
``Layout.shard_boxes(shard)`` order, plus the box's tensor name and offsets as a check), its key
(``"param"`` or an optimizer state key), dtype and shape, and the CRC-32C (``wire.crc``) of each
of its chunk frames (at most :data:`CHUNK_BYTES` each). Receivers verify every chunk before use.

Ops: ``status``, ``hold``, ``release``, ``fetch``, ``load``, ``snapshot``, ``config``,
``finished`` (see docs/shadow.md); the client reads ``status`` and ``config`` into
:class:`ShadowStatus` and :class:`ShadowConfig` (:mod:`shadowgrad.messages`).
``fetch`` replies and ``load`` requests also carry the COMMIT record of the iteration
(``"commit"``, see :func:`commit_to_json`).

The contracts shared with the trainer hooks and the controller live in core and are re-exported
here under their old names: the tensor stream and COMMIT JSON (:mod:`shadowgrad.tensorstream`)
and the client (:mod:`shadowgrad.control_client`). The server is :mod:`shadowgrad.shadow.node`.
"""

from __future__ import annotations

from shadowgrad.control_client import FetchReply, FetchResult, ShadowClient
from shadowgrad.messages import ShadowConfig, ShadowStatus
from shadowgrad.tensorstream import (
    CHUNK_BYTES,
    ControlError,
    commit_from_json,
    commit_to_json,
    decode_states,
    encode_states,
)

__all__ = [
    "CHUNK_BYTES",
    "ControlError",
    "ShadowClient",
    "FetchResult",
    "FetchReply",
    "ShadowStatus",
    "ShadowConfig",
    "encode_states",
    "decode_states",
    "commit_to_json",
    "commit_from_json",
]
