"""The shadowgrad exception hierarchy.

Every error the library raises on purpose derives from :class:`ShadowgradError`, so a caller can
catch the family with one clause; the leaves say precisely what went wrong and carry the
offending key or value as attributes as well as in the message. Library code never calls
``sys.exit``; only ``shadowgrad.cli.main`` turns errors into exit codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

__all__ = [
    "ShadowgradError",
    "KeyedValueError",
    "ConfigError",
    "LayoutError",
    "WireError",
    "TruncatedError",
    "OversizeError",
    "LengthMismatchError",
    "BadMagicError",
    "VersionError",
    "UnknownKindError",
    "BadFieldError",
    "ChecksumError",
    "ForeignJobError",
    "LayoutMismatchError",
    "ShadowgradTimeout",
    "ControlError",
    "P4RuntimeError",
]


class ShadowgradError(Exception):
    """Base class of every error shadowgrad raises on purpose."""


class KeyedValueError(ShadowgradError, ValueError):
    """A document (job spec, optimizer spec) holds a bad value: ``key`` is the path of the
    offending key, ``value`` the bad value as found (``None`` when the key is missing),
    ``reason`` what is wrong with it."""

    def __init__(self, key: str, value: Any, reason: str) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        shown = "<missing>" if value is None else repr(value)
        super().__init__(f"{key} = {shown}: {reason}")


class ConfigError(KeyedValueError):
    """A job spec (or an environment override) is invalid.

    ``key`` is the dotted path of the offending key (``"shadows.replication"``), ``value`` the
    bad value as found (``None`` when the key is missing).
    """


class LayoutError(ShadowgradError, ValueError):
    """A shard layout cannot be built from the given parameters, buckets or options."""


class WireError(ShadowgradError, ValueError):
    """A datagram failed to decode; the subclass says why. Nothing was applied from it."""

    #: short machine-readable reason, used as a counter label by receivers
    reason = "malformed"


class TruncatedError(WireError):
    """Fewer bytes than the fixed header, or than the header's ``length`` field announces."""

    reason = "truncated"


class OversizeError(WireError):
    """A payload longer than the protocol maximum, or a datagram with bytes past its payload."""

    reason = "oversize"


class LengthMismatchError(WireError):
    """The payload length disagrees with the message kind's own structure (e.g. a COMMIT body)."""

    reason = "length"


class BadMagicError(WireError):
    """The first two bytes are not the shadowgrad magic: not our datagram at all."""

    reason = "magic"


class VersionError(WireError):
    """A protocol version this build does not speak."""

    reason = "version"


class UnknownKindError(WireError):
    """A message kind this protocol version does not define."""

    reason = "kind"


class BadFieldError(WireError):
    """A header field holds a value its kind forbids (dtype, flags, alignment, ...)."""

    reason = "field"


class ChecksumError(WireError):
    """The CRC over header and payload does not match: the datagram was corrupted."""

    reason = "checksum"


class ForeignJobError(WireError):
    """A well-formed datagram that belongs to another job."""

    reason = "foreign_job"


class LayoutMismatchError(WireError):
    """A well-formed datagram made under a different shard layout (digest mismatch)."""

    reason = "layout"


class UnauthenticatedError(WireError):
    """A record that must carry a MAC (COMMIT, NACK, READY, ACK; DATA when configured) has none."""

    reason = "unauthenticated"


class BadMacError(WireError):
    """A datagram's MAC does not verify under the job's key (forged, or another key)."""

    reason = "bad_mac"


class ShadowgradTimeout(ShadowgradError, TimeoutError):  # noqa: N818 (reads as TimeoutError)
    """A blocking call gave up after its timeout."""


class ControlError(ShadowgradError):
    """A control request failed: bad token, bad request, unavailable state, corrupt stream.

    ``code`` is a short machine-readable label (``bad_token``, ``bad_request``, ``unavailable``,
    ``not_loaded``, ``checksum``, ``internal``; ``bad_reply`` on the client side: a reply it
    cannot read). Defined here, torch-free, so that the typed replies
    (:mod:`shadowgrad.messages`) can raise it; :mod:`shadowgrad.tensorstream` re-exports it.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


class P4RuntimeError(ShadowgradError, RuntimeError):
    """A failed P4Runtime operation, on either side of the connection: the controller's client
    (``shadowgrad.controller.p4runtime``) raises it for a failed RPC, the software switch's
    server (``shadowgrad.p4target.p4runtime_server``) for one update or a whole RPC that it
    refuses. ``code`` is the ``grpc.StatusCode`` (None where there was none, e.g. a client that
    is closed); ``message`` is the text without the code. Defined here, in the core, so that
    both peer packages share one class without importing each other (and without grpc here)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
