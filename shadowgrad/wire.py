"""The shadowgrad wire protocol: one fixed 56-byte header, then a kind-specific payload.

This module is the single definition of the format (``docs/protocol.md`` documents it, the P4
parser in ``p4/include/headers.p4`` and the scapy layer in :mod:`shadowgrad.wire_scapy` are tested
against :data:`HEADER_FIELDS`). It imports only the standard library.

Fast path: :func:`encode_header` packs a header (checksum included) for a payload that stays
where it is — send with ``sock.sendmsg([header, payload])`` — and :func:`decode` verifies a
received datagram and returns its payload as a ``memoryview`` into the receive buffer. Neither
copies payload bytes. The checksum is CRC-32C (Castagnoli; the ``crc32c`` package, SSE4.2/ARMv8
hardware instructions in C, ~10 GB/s here against zlib's ~3.5 GB/s) over the header bytes before
the checksum field followed by the payload. :func:`crc` is the one checksum function of the
project: state streams and snapshots use it too.

Authentication (``Flag.MAC``): AES-256-GCM used as a MAC (GMAC: the datagram is associated data,
nothing is encrypted; ``cryptography``'s OpenSSL binding, AES-NI + carry-less multiply, ~20 GB/s
on 64 KiB here against keyed BLAKE2b's ~0.9). The 28-byte trailer after the payload is a 12-byte
nonce and the 16-byte tag. A nonce must never repeat under one key for different bytes (two
such datagrams would give away the GHASH key): it is not derived from the header, which does
not make a datagram unique (a retransmission repeats iteration, bucket and offset with new
flags; two ACKs share a cumulative seq with different bitmaps), but drawn by the sender: a
random 64-bit prefix per process (redrawn in a forked child and every 2^32 datagrams) and a
32-bit counter. docs/security.md has the argument. A sealed datagram's CRC covers its header
only: the tag covers every byte after it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import itertools
import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, NotRequired, TypedDict, TypeVar, Unpack

from crc32c import crc32c as _crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shadowgrad.dtypes import BY_CODE, WIRE_ITEMSIZE, DType
from shadowgrad.errors import (
    BadFieldError,
    BadMacError,
    BadMagicError,
    ChecksumError,
    ForeignJobError,
    LayoutMismatchError,
    LengthMismatchError,
    OversizeError,
    TruncatedError,
    UnauthenticatedError,
    UnknownKindError,
    VersionError,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "MAX_DATAGRAM",
    "MAX_PAYLOAD",
    "DEFAULT_UDP_PORT",
    "DEFAULT_CHUNK_BYTES",
    "chunk_for",
    "MAC_SIZE",
    "NONCE_SIZE",
    "TAG_SIZE",
    "checksum",
    "AUTHENTICATED_KINDS",
    "mac_key",
    "seal",
    "seal_in_place",
    "DataSealer",
    "SendFields",
    "Kind",
    "Flag",
    "DType",
    "Header",
    "Message",
    "CommitRecord",
    "ReadyState",
    "ReadyRecord",
    "AckRecord",
    "NackRange",
    "NackRecord",
    "encode_header",
    "encode_parts",
    "encode",
    "decode",
    "verify_parts",
    "verify_mac",
    "gmac_verifier",
    "HEADER_STRUCT",
    "CHECKSUM_AT",
    "ALLOWED_FLAGS",
    "peek_header",
    "crc",
    "session_digest",
]

#: ``b"SG"``: the first two bytes of every shadowgrad datagram.
MAGIC = 0x5347
#: Protocol version this build speaks. See docs/protocol.md for the version rule.
VERSION = 1
#: Default UDP port (source and destination) of shadowgrad traffic; the scapy layer binds to it.
DEFAULT_UDP_PORT = 47474
#: Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP).
MAX_DATAGRAM = 65507
#: Default DATA payload: fits one 1500-byte Ethernet MTU with IPv4 + UDP + header, and is a
#: multiple of 64 bytes so chunk edges stay vector-aligned for every dtype.
DEFAULT_CHUNK_BYTES = 1408

#: The header, in wire order: (field, width in bits). Big-endian, fixed widths; the fields the
#: switch matches on (magic, version, kind, flags, job, bucket) come first.
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("magic", 16),
    ("version", 8),
    ("kind", 8),
    ("flags", 8),
    ("dtype", 8),
    ("sender", 16),
    ("job", 32),
    ("bucket", 32),
    ("iteration", 64),
    ("seq", 64),
    ("offset", 64),
    ("layout", 64),
    ("length", 32),
    ("checksum", 32),
)

_CODES = {8: "B", 16: "H", 32: "I", 64: "Q"}
_STRUCT = struct.Struct("!" + "".join(_CODES[w] for _, w in HEADER_FIELDS))
HEADER_SIZE = _STRUCT.size
MAX_PAYLOAD = MAX_DATAGRAM - HEADER_SIZE
#: Byte offset of the checksum field; the CRC covers ``header[:_CSUM_AT] + payload`` (a sealed
#: datagram's: ``header[:_CSUM_AT]``).
_CSUM_AT = HEADER_SIZE - 4
_PREFIX = struct.Struct("!" + "".join(_CODES[w] for _, w in HEADER_FIELDS[:-1]))
_LIMITS = {name: (1 << width) - 1 for name, width in HEADER_FIELDS}
#: the header as a :class:`struct.Struct` (:data:`HEADER_FIELDS` in order), for a receiver that
#: checks a header it peeked at before receiving the payload (shadow/_receiver.py)
HEADER_STRUCT = _STRUCT
#: byte offset of the header's checksum field
CHECKSUM_AT = _CSUM_AT


class Kind(enum.IntEnum):
    """Message kinds (header field ``kind``)."""

    DATA = 1  #: a chunk of gradient bytes of one bucket
    COMMIT = 2  #: per-iteration commit/heartbeat record from trainer rank 0
    READY = 3  #: a shadow reports its shard's state for an iteration
    ACK = 4  #: transport acknowledgement (cumulative + selective)
    NACK = 5  #: request to resend byte ranges of an iteration


class Flag(enum.IntFlag):
    """Header ``flags`` bits. Bits a kind does not allow must be zero."""

    FINAL = 0x01  #: DATA: the bytes are the fully reduced values (the switch copies these)
    RETX = 0x02  #: any kind: a retransmission of a message sent before
    LAST = 0x04  #: DATA: the sender's last chunk of this bucket in this iteration
    SKIPPED = 0x08  #: COMMIT: the optimizer step was skipped (loss scaler found inf/nan)
    CLIP = 0x10  #: COMMIT: ``clip_coef`` is valid (gradients were clipped by it)
    SCALER = 0x20  #: COMMIT: ``loss_scale`` is valid (a loss scaler was in use)
    MAC = 0x40  #: any kind: the payload is followed by a MAC_SIZE-byte trailer (nonce, GMAC tag)


_ALLOWED_FLAGS = {
    Kind.DATA: Flag.FINAL | Flag.RETX | Flag.LAST | Flag.MAC,
    Kind.COMMIT: Flag.RETX | Flag.SKIPPED | Flag.CLIP | Flag.SCALER | Flag.MAC,
    Kind.READY: Flag.RETX | Flag.MAC,
    Kind.ACK: Flag.MAC,
    Kind.NACK: Flag.RETX | Flag.MAC,
}

#: bytes of the nonce at the start of the authentication trailer
NONCE_SIZE = 12
#: bytes of the GMAC tag that ends the trailer
TAG_SIZE = 16
#: bytes of the authentication trailer that follows the payload when ``Flag.MAC`` is set
MAC_SIZE = NONCE_SIZE + TAG_SIZE
#: kinds a receiver holding the job's key accepts only with a valid MAC
AUTHENTICATED_KINDS = frozenset({Kind.COMMIT, Kind.READY, Kind.ACK, Kind.NACK})
_MAC_PERSON = b"shadowgrad-gmac"


def chunk_for(room: int, *, mac: bool) -> int:
    """The largest DATA payload, in whole 64-byte granules, of a datagram whose UDP payload may
    be ``room`` bytes: what is left after the header and, with ``mac`` (DATA authenticated),
    the trailer (:data:`MAC_SIZE`: nonce + tag). For a path MTU ``m`` over IPv4, ``room`` is
    ``m - 28``; a larger chunk is IP-fragmented, and the switch's parser (and so its tap) sees
    only first fragments: the shadows then get no copy of it and must repair it by NACK."""
    n = (room - HEADER_SIZE - (MAC_SIZE if mac else 0)) // 64 * 64
    if n <= 0:
        raise ValueError(f"a datagram of {room} bytes has no room for DATA (mac={mac})")
    return n


def mac_key(token: str | bytes, job: int) -> bytes:
    """The job's record-authentication key (AES-256): BLAKE2b-256 of the job's secret token,
    salted with the job id and personalised for this use, so the token itself never travels and
    every job sharing a token still has its own key."""
    raw = token.encode() if isinstance(token, str) else bytes(token)
    return hashlib.blake2b(
        raw, digest_size=32, salt=int(job).to_bytes(8, "big"), person=_MAC_PERSON
    ).digest()


_T = TypeVar("_T")
_AEADS: dict[bytes, AESGCM] = {}
#: the key's AES for the incremental GCM of :func:`verify_parts`
_GCM_KEYS: dict[bytes, algorithms.AES] = {}


def _per_key(cache: dict[bytes, _T], key: bytes, make: Callable[[bytes], _T]) -> _T:
    """``make(key)`` once per key (the key schedule once per key, not per datagram)."""
    a = cache.get(key)
    if a is None:
        if len(key) != 32:
            raise BadFieldError(f"a MAC key is 32 bytes (wire.mac_key), got {len(key)}")
        if len(cache) >= 64:  # a process holds a handful of job keys; bound it anyway
            cache.clear()
        a = cache[key] = make(key)
    return a


def _aead(key: bytes) -> AESGCM:
    """The key's AES-GCM context."""
    return _per_key(_AEADS, key, AESGCM)


class _Nonces:
    """Unique 96-bit nonces for this process: random 64-bit prefix ‖ 32-bit counter.

    ``next()`` on :func:`itertools.count` is atomic under the GIL, so sender threads share one
    counter without a lock; every 2^32 values (a new *epoch*) get a fresh random prefix. A
    forked child redraws everything (it must not continue its parent's sequence)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._count = itertools.count()
        self._prefix: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def _new_prefix(self, epoch: int) -> bytes:
        with self._lock:
            p = self._prefix.get(epoch)
            if p is None:
                p = os.urandom(8)
                while p in self._prefix.values():  # never the same prefix twice in a process
                    p = os.urandom(8)
                self._prefix[epoch] = p
            return p

    def next(self) -> bytes:
        c = next(self._count)
        epoch = c >> 32
        p = self._prefix.get(epoch)
        if p is None:
            p = self._new_prefix(epoch)
        return p + (c & 0xFFFFFFFF).to_bytes(4, "big")


_NONCES = _Nonces()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_NONCES._reset)


def _trailer(key: bytes, aad: bytes | bytearray | memoryview) -> bytes:
    """``nonce ‖ tag``: the GMAC of ``aad`` (header with its checksum, then the payload)."""
    nonce = _NONCES.next()
    return nonce + _aead(key).encrypt(nonce, b"", aad)


def _verify(key: bytes, aad: memoryview, trailer: memoryview) -> bool:
    nonce = bytes(trailer[:NONCE_SIZE])
    tag = _aead(key).encrypt(nonce, b"", aad)
    return hmac.compare_digest(tag, trailer[NONCE_SIZE:])


def gmac_verifier(
    key: bytes, trailer: bytearray | memoryview
) -> Callable[[bytes | bytearray | memoryview], bool]:
    """:func:`verify_mac` bound to the key's AES-GCM context and to a trailer's place:
    ``verify(datagram)`` checks ``datagram`` against the :data:`MAC_SIZE` bytes that are in
    ``trailer`` at the time of the call, for a receiver that receives trailer after trailer
    into one buffer."""
    t = memoryview(trailer)
    if t.nbytes != MAC_SIZE:
        raise ValueError(f"a trailer is {MAC_SIZE} bytes, got {t.nbytes}")
    nonce, tag = t[:NONCE_SIZE], t[NONCE_SIZE:]
    enc = _aead(key).encrypt
    same = hmac.compare_digest

    def verify(datagram: bytes | bytearray | memoryview) -> bool:
        return same(enc(bytes(nonce), b"", datagram), tag)

    return verify


def verify_mac(
    key: bytes, datagram: bytes | bytearray | memoryview, trailer: bytes | bytearray | memoryview
) -> bool:
    """:func:`decode`'s MAC check: the tag in ``trailer`` (nonce, tag) must be the GMAC under
    ``key`` of ``datagram`` (header and payload, contiguous, without the trailer). The caller
    checked everything else :func:`decode` checks."""
    t = memoryview(trailer)
    if t.nbytes != MAC_SIZE:
        return False
    return _verify(key, memoryview(datagram), t)


def verify_parts(
    key: bytes,
    header: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    trailer: bytes | bytearray | memoryview,
) -> bool:
    """:func:`decode`'s MAC check of a sealed datagram received in parts: the tag in ``trailer``
    (nonce, tag) must be the GMAC under ``key`` of ``header`` (all :data:`HEADER_SIZE` bytes)
    followed by ``payload``, wherever each lies (fed to GHASH in two pieces: no copy). The
    caller checked everything else :func:`decode` checks."""
    alg = _per_key(_GCM_KEYS, key, algorithms.AES)
    t = memoryview(trailer)
    if t.nbytes != MAC_SIZE:
        return False
    d = Cipher(alg, modes.GCM(bytes(t[:NONCE_SIZE]), bytes(t[NONCE_SIZE:]))).decryptor()
    d.authenticate_additional_data(header)
    d.authenticate_additional_data(payload)
    try:
        d.finalize()  # compares the tag in constant time
    except InvalidTag:
        return False
    return True


#: itemsize of every wire dtype code. DType (re-exported here) and its itemsizes live in the one
#: dtype table, :mod:`shadowgrad.dtypes`
_ITEMSIZE = WIRE_ITEMSIZE


class Header(NamedTuple):
    """A decoded header without magic and checksum (which decoding has verified)."""

    kind: Kind
    flags: Flag
    dtype: DType
    sender: int
    job: int
    bucket: int
    iteration: int
    seq: int
    offset: int
    layout: int
    length: int
    version: int = VERSION


class Message(NamedTuple):
    """A verified datagram: its header and a zero-copy view of its payload."""

    header: Header
    payload: memoryview


def crc(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``value`` (chain calls for scatter-gather data)."""
    return _crc32c(data, value)


def session_digest(layout64: int, generation: int) -> int:
    """The value of the header's ``layout`` field for one *generation* of a job.

    Every (re)start of a job gets a new generation (fencing, docs/security.md). The header has
    no field of its own for it: its ``layout`` field carries the layout digest mixed with the
    generation, so a receiver that checks the field (every shadow and trainer does, in
    :func:`decode`) refuses the datagrams of a stale instance exactly as it refuses a foreign
    layout, at no cost per datagram. Generation 0 is the layout digest itself (a job that does
    not fence, and every test that builds datagrams by hand).
    """
    if generation == 0:
        return layout64
    h = hashlib.blake2b(
        layout64.to_bytes(8, "big") + generation.to_bytes(8, "big"),
        digest_size=8,
        person=b"sg-generation",
    )
    return int.from_bytes(h.digest(), "big")


_KINDS: dict[int, Kind] = {int(k): k for k in Kind}
_ALLOWED_INT: dict[Kind, int] = {k: int(v) for k, v in _ALLOWED_FLAGS.items()}
_FLAGS: dict[int, Flag] = {v: Flag(v) for v in range(256)}
_MAC_BIT = int(Flag.MAC)  # int & IntFlag runs IntFlag.__rand__ in Python
_DATA_CODE = int(Kind.DATA)
_DATA_ALLOWED = _ALLOWED_INT[Kind.DATA]
_CSUM = struct.Struct("!I")
_ITEMSIZE_INT: dict[int, int] = {int(k): v for k, v in WIRE_ITEMSIZE.items() if k}
#: the flag bits each kind allows, as ints (for a receiver checking a header itself)
ALLOWED_FLAGS: dict[Kind, int] = dict(_ALLOWED_INT)


def _check_range(name: str, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= _LIMITS[name]:
        raise BadFieldError(f"header field {name} = {value!r} out of range 0..{_LIMITS[name]}")


class SendFields(TypedDict):
    """The header fields a sender gives every encoder below, by keyword (the others are the
    kind, the payload, the MAC key and what the encoder computes)."""

    job: int
    sender: int
    iteration: int
    seq: int
    layout: int
    flags: NotRequired[Flag | int]
    dtype: NotRequired[DType]
    bucket: NotRequired[int]
    offset: NotRequired[int]


def encode_header(
    kind: Kind,
    *,
    payload: bytes | bytearray | memoryview = b"",
    version: int = VERSION,
    **fields: Unpack[SendFields],
) -> bytes:
    """Pack the 56-byte header for ``payload`` (checksum included). Does not copy ``payload``.

    Validates what the decoder would reject (ranges, flags, dtype alignment), so a sender never
    emits a datagram its peers will drop. For an authenticated datagram use :func:`seal`.
    """
    return _header(kind, payload, key=None, version=version, **fields)[0]


def seal(
    kind: Kind,
    *,
    key: bytes,
    payload: bytes | bytearray | memoryview = b"",
    **fields: Unpack[SendFields],
) -> tuple[bytes, bytes]:
    """``(header, trailer)`` of an authenticated datagram: send ``header + payload + trailer``.
    The header has ``Flag.MAC`` and a length counting the :data:`MAC_SIZE`-byte trailer (a fresh
    nonce, then the GMAC tag over header and payload under ``key``); its CRC covers the header
    only."""
    return _header(kind, payload, key=key, **fields)


def encode_parts(
    kind: Kind,
    *,
    key: bytes | None,
    payload: bytes | bytearray | memoryview = b"",
    **fields: Unpack[SendFields],
) -> tuple[bytes, bytes]:
    """``(header, tag)``: :func:`seal`'s with ``key``, else :func:`encode_header`'s and an empty
    tag. Send ``header + payload + tag`` (for a sender that authenticates when it has a key)."""
    return _header(kind, payload, key=key, **fields)


def _header(
    kind: Kind,
    payload: bytes | bytearray | memoryview,
    *,
    key: bytes | None,
    job: int,
    sender: int,
    iteration: int,
    seq: int,
    layout: int,
    flags: Flag | int = 0,
    dtype: DType = DType.NONE,
    bucket: int = 0,
    offset: int = 0,
    version: int = VERSION,
    room: tuple[memoryview, int] | None = None,
) -> tuple[bytes, bytes]:
    """The one encoder: with ``key`` the header is sealed (``Flag.MAC`` set here)."""
    flags = int(flags)
    if key is None:
        if flags & _MAC_BIT:
            raise BadFieldError("Flag.MAC is set by seal(), which computes the tag")
    else:
        flags |= _MAC_BIT
    kind_ = _KINDS.get(kind)
    if kind_ is None:
        kind_ = Kind(kind)  # raises ValueError naming the code
    length = memoryview(payload).nbytes
    if length > MAX_PAYLOAD:
        raise OversizeError(f"payload of {length} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    if flags & ~_ALLOWED_INT[kind_]:
        raise BadFieldError(f"flags 0x{flags:02x} not allowed for {kind_.name}")
    dtype_ = dtype if type(dtype) is DType else DType(dtype)
    _check_data_fields(kind_, dtype_, offset, length)
    # with a key the length field counts the MAC trailer that follows the payload
    wire_length = length if key is None else length + MAC_SIZE
    if wire_length > MAX_PAYLOAD:
        raise OversizeError(f"payload of {length} bytes + MAC exceeds MAX_PAYLOAD")
    try:  # struct checks every unsigned field's range; on failure name the field
        prefix = _PREFIX.pack(
            MAGIC,
            version,
            kind_,
            flags,
            dtype_,
            sender,
            job,
            bucket,
            iteration,
            seq,
            offset,
            layout,
            wire_length,
        )
    except struct.error:
        for name, value in (
            ("version", version),
            ("sender", sender),
            ("job", job),
            ("bucket", bucket),
            ("iteration", iteration),
            ("seq", seq),
            ("offset", offset),
            ("layout", layout),
        ):
            _check_range(name, value)
        raise
    if key is None:
        return prefix + _crc32c(payload, _crc32c(prefix)).to_bytes(4, "big"), b""
    # sealed: the CRC covers the header only, the GMAC covers header (with its CRC) + payload
    header = prefix + _crc32c(prefix).to_bytes(4, "big")
    if room is not None:  # the header goes in front of the payload: the GMAC reads one buffer
        buf, at = room
        buf[at - HEADER_SIZE : at] = header
        return header, _trailer(key, buf[at - HEADER_SIZE : at + length])
    aad = header + payload if length else header  # one copy (seal_in_place avoids it)
    return header, _trailer(key, aad)


def seal_in_place(
    kind: Kind,
    *,
    key: bytes,
    buf: memoryview,
    at: int,
    length: int,
    **fields: Unpack[SendFields],
) -> tuple[memoryview, bytes]:
    """:func:`seal` for a payload at ``buf[at : at + length]`` with writable room before it:
    the header is written to ``buf[at - HEADER_SIZE : at]`` (the caller keeps what was there if
    it needs it) and the GMAC runs over the contiguous datagram, so no byte of the payload is
    copied. Returns ``(datagram, trailer)``: send ``datagram`` (a view of ``buf``) + ``trailer``."""
    if at < HEADER_SIZE or at + length > buf.nbytes:
        raise BadFieldError(
            f"payload [{at}, {at + length}) needs {HEADER_SIZE} bytes of room before it inside "
            f"a buffer of {buf.nbytes}"
        )
    _, trailer = _header(kind, buf[at : at + length], key=key, room=(buf, at), **fields)
    return buf[at - HEADER_SIZE : at + length], trailer


class DataSealer:
    """:func:`seal_in_place` for one sender's DATA chunks, at a sender's per-chunk rate: the key
    and the fields that do not change from chunk to chunk (``job``, ``sender``, ``layout``)
    are bound once, and :meth:`seal` packs the header straight into the room before the
    payload. The bytes are exactly :func:`seal_in_place`'s (a test compares them); a field
    out of range is reported by it, by name."""

    __slots__ = ("_aead", "_job", "_key", "_layout", "_sender")

    def __init__(self, key: bytes, *, job: int, sender: int, layout: int) -> None:
        for name, value in (("job", job), ("sender", sender), ("layout", layout)):
            _check_range(name, value)
        self._key = key
        self._aead = _aead(key)
        self._job, self._sender, self._layout = job, sender, layout

    def seal(
        self,
        buf: memoryview,
        at: int,
        length: int,
        *,
        iteration: int,
        seq: int,
        flags: int,
        dtype: int,
        bucket: int,
        offset: int,
    ) -> bytes:
        """Write the sealed DATA header of ``buf[at : at + length]`` to ``buf[at - HEADER_SIZE :
        at]`` and return the trailer (nonce ‖ tag) to send after the payload."""
        flags = int(flags) | _MAC_BIT
        size = _ITEMSIZE_INT.get(dtype, 0)
        h = at - HEADER_SIZE
        if not (
            flags & ~_DATA_ALLOWED
            or not size
            or length <= 0
            or length % size
            or offset % size
            or length + MAC_SIZE > MAX_PAYLOAD
            or h < 0
            or at + length > buf.nbytes
        ):
            try:
                _PREFIX.pack_into(
                    buf,
                    h,
                    MAGIC,
                    VERSION,
                    _DATA_CODE,
                    flags,
                    dtype,
                    self._sender,
                    self._job,
                    bucket,
                    iteration,
                    seq,
                    offset,
                    self._layout,
                    length + MAC_SIZE,
                )
            except struct.error:
                pass  # a field out of range: seal_in_place below names it
            else:
                _CSUM.pack_into(buf, h + _CSUM_AT, _crc32c(buf[h : h + _CSUM_AT]))
                nonce = _NONCES.next()
                return nonce + self._aead.encrypt(nonce, b"", buf[h : at + length])
        # something is wrong with the fields: seal_in_place raises the precise error
        _, trailer = seal_in_place(
            Kind.DATA,
            key=self._key,
            buf=buf,
            at=at,
            length=length,
            job=self._job,
            sender=self._sender,
            iteration=iteration,
            seq=seq,
            layout=self._layout,
            flags=flags & ~_MAC_BIT,
            dtype=DType(dtype),
            bucket=bucket,
            offset=offset,
        )
        return trailer


def encode(
    kind: Kind,
    *,
    payload: bytes | bytearray | memoryview = b"",
    key: bytes | None = None,
    **fields: Unpack[SendFields],
) -> bytes:
    """Header + payload (+ MAC tag with ``key``) as one ``bytes`` (a copy; for small control
    messages, tests and pcaps)."""
    header, tag = _header(kind, payload, key=key, **fields)
    return header + bytes(payload) + tag


def _check_data_fields(kind: Kind, dtype: DType, offset: int, length: int) -> None:
    if kind is Kind.DATA:
        if dtype is DType.NONE:
            raise BadFieldError("DATA message without a dtype")
        size = _ITEMSIZE[dtype]
        if length == 0:
            raise BadFieldError("DATA message with an empty payload")
        if length % size or offset % size:
            raise BadFieldError(
                f"DATA offset {offset} / length {length} not multiples of "
                f"{dtype.name} itemsize {size}"
            )
    elif dtype is not DType.NONE:
        raise BadFieldError(f"{kind.name} message with dtype {dtype.name}; only DATA has one")


def checksum(datagram: bytes | bytearray | memoryview) -> int:
    """The value the checksum field of ``datagram`` must hold: CRC-32C over header bytes 0..51,
    then — unless ``Flag.MAC`` is set (the tag covers those) — the bytes after the header."""
    mv = memoryview(datagram).cast("B")
    value = _crc32c(mv[:_CSUM_AT])
    if mv.nbytes > 4 and mv[4] & _MAC_BIT:
        return value
    return _crc32c(mv[HEADER_SIZE:], value)


def peek_header(buf: bytes | bytearray | memoryview) -> Header:
    """Unpack a header *without* verifying anything but its size. For logging and pcaps only."""
    mv = memoryview(buf)
    if mv.nbytes < HEADER_SIZE:
        raise TruncatedError(f"{mv.nbytes} bytes, header needs {HEADER_SIZE}")
    (
        _,
        version,
        kind,
        flags,
        dtype,
        sender,
        job,
        bucket,
        iteration,
        seq,
        offset,
        layout,
        length,
        _,
    ) = _STRUCT.unpack_from(mv)
    if flags & _MAC_BIT and length >= MAC_SIZE:
        length -= MAC_SIZE  # the payload's length, as decode() reports it
    return Header(
        kind, flags, dtype, sender, job, bucket, iteration, seq, offset, layout, length, version
    )


def decode(
    buf: bytes | bytearray | memoryview,
    *,
    job: int | None = None,
    layout: int | None = None,
    key: bytes | None = None,
    require: frozenset[Kind] = AUTHENTICATED_KINDS,
) -> Message:
    """Verify and decode one datagram. The payload is a view into ``buf`` (no copy).

    Checks, in order: size, magic, version, kind, announced length, checksum, flags, dtype and
    DATA alignment, kind-specific body structure, then job and layout when given, then — with
    ``key`` — the MAC: a datagram with ``Flag.MAC`` must verify, and a kind in ``require`` must
    have one. Each failure raises its own :class:`~shadowgrad.errors.WireError` subclass;
    ``err.reason`` is a short label for drop counters. The header's ``length`` is the
    payload's (without the tag).
    """
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    n = mv.nbytes
    if n < HEADER_SIZE:
        raise TruncatedError(f"{n} bytes, header needs {HEADER_SIZE}")
    (
        magic,
        version,
        kind,
        flags,
        dtype,
        sender,
        job_,
        bucket,
        iteration,
        seq,
        offset,
        layout_,
        length,
        checksum,
    ) = _STRUCT.unpack_from(mv)
    if magic != MAGIC:
        raise BadMagicError(f"magic 0x{magic:04x}, expected 0x{MAGIC:04x}")
    if version != VERSION:
        raise VersionError(f"protocol version {version}, this build speaks {VERSION}")
    kind_ = _KINDS.get(kind)
    if kind_ is None:
        raise UnknownKindError(f"message kind {kind} is not defined in version {VERSION}")
    kind = kind_
    if length > MAX_PAYLOAD:
        raise OversizeError(f"length field {length} exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    if n < HEADER_SIZE + length:
        raise TruncatedError(f"{n - HEADER_SIZE} payload bytes, header announces {length}")
    if n > HEADER_SIZE + length:
        raise OversizeError(f"{n - HEADER_SIZE - length} bytes past the announced payload")
    payload = mv[HEADER_SIZE:]
    sealed = flags & _MAC_BIT
    # sealed: the CRC covers the header only (the tag covers the rest, checked below)
    crc_ = _crc32c(mv[:_CSUM_AT]) if sealed else _crc32c(payload, _crc32c(mv[:_CSUM_AT]))
    if crc_ != checksum:
        raise ChecksumError(f"{kind.name} checksum mismatch (header says 0x{checksum:08x})")
    if flags & ~_ALLOWED_INT[kind]:
        raise BadFieldError(f"flags 0x{flags:02x} not allowed for {kind.name}")
    trailer = None
    if sealed:
        if length < MAC_SIZE:
            raise LengthMismatchError(f"{length} bytes cannot hold the {MAC_SIZE}-byte MAC")
        length -= MAC_SIZE
        trailer = payload[length:]
        payload = payload[:length]
    dtype_ = BY_CODE.get(dtype)
    if dtype_ is None:
        raise BadFieldError(f"dtype code {dtype} is not defined")
    dtype = dtype_
    _check_data_fields(kind, dtype, offset, length)
    checker = _BODY_CHECKS.get(kind)
    if checker is not None:
        checker(payload)
    if job is not None and job_ != job:
        raise ForeignJobError(f"datagram of job {job_}, this is job {job}")
    if layout is not None and layout_ != layout:
        raise LayoutMismatchError(
            f"datagram made under layout {layout_:016x}, this side holds {layout:016x}"
        )
    if key is not None:
        if trailer is not None:
            if not _verify(key, mv[: HEADER_SIZE + length], trailer):
                raise BadMacError(f"{kind.name} MAC does not verify under this job's key")
        elif kind in require:
            raise UnauthenticatedError(f"{kind.name} without a MAC; this job requires one")
    return Message(
        Header(
            kind,
            _FLAGS[flags],
            dtype,
            sender,
            job_,
            bucket,
            iteration,
            seq,
            offset,
            layout_,
            length,
            version,
        ),
        payload,
    )


# --------------------------------------------------------------------------- bodies

_COMMIT_FIXED = struct.Struct("!ddHHI")  # clip_coef, loss_scale, n_groups, n_nograd, user_len
_F64 = struct.Struct("!d")


@dataclass(frozen=True)
class CommitRecord:
    """The per-iteration COMMIT/heartbeat record sent by trainer rank 0 after its step decision.

    ``lrs`` holds the learning rate each param group used *for this step* (so any scheduler
    works); ``clip_coef`` is the exact (fp32-valued) factor gradients were multiplied by, or
    ``None`` without clipping; ``loss_scale`` is the scale the gradients carried, or ``None``
    without a loss scaler; ``skipped`` says the optimizer step was skipped; ``user_state`` is a
    small opaque blob (dataloader position, RNG state); ``no_grad``: layout indices of the
    parameters that had no gradient this iteration (the optimizer skipped them).
    """

    lrs: tuple[float, ...]
    clip_coef: float | None = None
    loss_scale: float | None = None
    skipped: bool = False
    user_state: bytes = b""
    no_grad: tuple[int, ...] = ()

    @property
    def flags(self) -> Flag:
        f = Flag(0)
        if self.skipped:
            f |= Flag.SKIPPED
        if self.clip_coef is not None:
            f |= Flag.CLIP
        if self.loss_scale is not None:
            f |= Flag.SCALER
        return f

    def body(self) -> bytes:
        if len(self.lrs) > 0xFFFF:
            raise BadFieldError(f"{len(self.lrs)} param groups; at most 65535")
        if len(self.no_grad) > 0xFFFF:
            raise BadFieldError(f"{len(self.no_grad)} parameters without gradient; at most 65535")
        head = _COMMIT_FIXED.pack(
            0.0 if self.clip_coef is None else float(self.clip_coef),
            0.0 if self.loss_scale is None else float(self.loss_scale),
            len(self.lrs),
            len(self.no_grad),
            len(self.user_state),
        )
        lrs = struct.pack(f"!{len(self.lrs)}d", *self.lrs)
        nograd = struct.pack(f"!{len(self.no_grad)}I", *sorted(self.no_grad))
        return head + lrs + nograd + bytes(self.user_state)

    def encode(
        self,
        *,
        job: int,
        sender: int,
        iteration: int,
        seq: int,
        layout: int,
        retx: bool = False,
        key: bytes | None = None,
    ) -> bytes:
        flags = self.flags | (Flag.RETX if retx else Flag(0))
        return encode(
            Kind.COMMIT,
            job=job,
            sender=sender,
            iteration=iteration,
            seq=seq,
            layout=layout,
            payload=self.body(),
            flags=flags,
            key=key,
        )

    @classmethod
    def from_message(cls, msg: Message) -> CommitRecord:
        if msg.header.kind is not Kind.COMMIT:
            raise UnknownKindError(f"expected COMMIT, got {msg.header.kind.name}")
        _check_commit(msg.payload)
        clip, scale, n, m, _ = _COMMIT_FIXED.unpack_from(msg.payload)
        lrs = struct.unpack_from(f"!{n}d", msg.payload, _COMMIT_FIXED.size)
        nograd = struct.unpack_from(f"!{m}I", msg.payload, _COMMIT_FIXED.size + 8 * n)
        user = bytes(msg.payload[_COMMIT_FIXED.size + 8 * n + 4 * m :])
        f = msg.header.flags
        return cls(
            lrs=tuple(lrs),
            clip_coef=clip if f & Flag.CLIP else None,
            loss_scale=scale if f & Flag.SCALER else None,
            skipped=bool(f & Flag.SKIPPED),
            user_state=user,
            no_grad=tuple(nograd),
        )


def _check_commit(payload: memoryview) -> None:
    if payload.nbytes < _COMMIT_FIXED.size:
        raise LengthMismatchError(
            f"COMMIT body of {payload.nbytes} bytes, fixed part needs {_COMMIT_FIXED.size}"
        )
    _, _, n, m, user_len = _COMMIT_FIXED.unpack_from(payload)
    want = _COMMIT_FIXED.size + 8 * n + 4 * m + user_len
    if payload.nbytes != want:
        raise LengthMismatchError(
            f"COMMIT body of {payload.nbytes} bytes; {n} groups + {m} no-grad indices + "
            f"{user_len} user bytes need {want}"
        )
    if m > 1:
        idx = struct.unpack_from(f"!{m}I", payload, _COMMIT_FIXED.size + 8 * n)
        if any(b <= a for a, b in itertools.pairwise(idx)):
            raise BadFieldError("COMMIT no-grad parameter indices are not strictly ascending")


class ReadyState(enum.IntEnum):
    READY = 1  #: all bytes of the iteration present and verified, COMMIT received
    APPLIED = 2  #: the optimizer step of the iteration has been applied
    DIVERGED = 3  #: a gap could not be repaired; the shard stopped advancing


_READY = struct.Struct("!HHB3xQ")  # shard, replica, state, pad, last_applied


@dataclass(frozen=True)
class ReadyRecord:
    """A shadow's report for ``header.iteration``: its shard, replica, state and last applied."""

    shard: int
    replica: int
    state: ReadyState
    last_applied: int

    def body(self) -> bytes:
        return _READY.pack(self.shard, self.replica, self.state, self.last_applied)

    @classmethod
    def from_message(cls, msg: Message) -> ReadyRecord:
        _check_ready(msg.payload)
        shard, replica, state, last = _READY.unpack_from(msg.payload)
        return cls(shard, replica, ReadyState(state), last)


def _check_ready(payload: memoryview) -> None:
    if payload.nbytes != _READY.size:
        raise LengthMismatchError(f"READY body of {payload.nbytes} bytes, expected {_READY.size}")
    state = payload[4]
    if state not in (1, 2, 3) or any(payload[5:8]):
        raise BadFieldError(f"READY state byte {state} / padding invalid")


_ACK = struct.Struct("!Q")


@dataclass(frozen=True)
class AckRecord:
    """Transport ACK: header ``seq`` is cumulative (every seq < it received); ``sack`` bit k set
    means ``seq + 1 + k`` was received too."""

    sack: int = 0

    def body(self) -> bytes:
        return _ACK.pack(self.sack)

    @classmethod
    def from_message(cls, msg: Message) -> AckRecord:
        _check_ack(msg.payload)
        return cls(_ACK.unpack_from(msg.payload)[0])


def _check_ack(payload: memoryview) -> None:
    if payload.nbytes != _ACK.size:
        raise LengthMismatchError(f"ACK body of {payload.nbytes} bytes, expected {_ACK.size}")


_NACK_HEAD = struct.Struct("!HH")  # count, reserved
_NACK_ENTRY = struct.Struct("!IQI")  # bucket, offset, length


class NackRange(NamedTuple):
    bucket: int
    offset: int
    length: int


@dataclass(frozen=True)
class NackRecord:
    """Request to resend byte ranges ``(bucket, offset, length)`` of ``header.iteration``."""

    ranges: tuple[NackRange, ...]

    def body(self) -> bytes:
        if len(self.ranges) > _MAX_NACK:
            raise OversizeError(f"{len(self.ranges)} NACK ranges; at most {_MAX_NACK} fit")
        parts = [_NACK_HEAD.pack(len(self.ranges), 0)]
        parts += [_NACK_ENTRY.pack(*r) for r in self.ranges]
        return b"".join(parts)

    @classmethod
    def from_message(cls, msg: Message) -> NackRecord:
        _check_nack(msg.payload)
        (n, _) = _NACK_HEAD.unpack_from(msg.payload)
        return cls(
            tuple(
                NackRange(
                    *_NACK_ENTRY.unpack_from(msg.payload, _NACK_HEAD.size + i * _NACK_ENTRY.size)
                )
                for i in range(n)
            )
        )

    @classmethod
    def of(cls, ranges: Sequence[tuple[int, int, int]]) -> NackRecord:
        return cls(tuple(NackRange(*r) for r in ranges))


_MAX_NACK = (MAX_PAYLOAD - _NACK_HEAD.size) // _NACK_ENTRY.size


def _check_nack(payload: memoryview) -> None:
    if payload.nbytes < _NACK_HEAD.size:
        raise LengthMismatchError(f"NACK body of {payload.nbytes} bytes, too short")
    n, reserved = _NACK_HEAD.unpack_from(payload)
    if reserved:
        raise BadFieldError(f"NACK reserved field = {reserved}, must be 0")
    want = _NACK_HEAD.size + n * _NACK_ENTRY.size
    if payload.nbytes != want:
        raise LengthMismatchError(f"NACK body of {payload.nbytes} bytes; {n} ranges need {want}")


_BODY_CHECKS = {
    Kind.COMMIT: _check_commit,
    Kind.READY: _check_ready,
    Kind.ACK: _check_ack,
    Kind.NACK: _check_nack,
}
