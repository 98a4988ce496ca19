"""The bulk channel of a ``fetch``: the reply's tensor stream on a TCP connection of its own,
received with ``socket.recv_into`` straight into the destination tensors (no ZeroMQ message in
between, so one user-space copy fewer per byte, and no freshly allocated receive buffer to
fault in).

Protocol (docs/shadow.md, *Bulk fetch*):

1. the requester asks for a stream in the ``fetch`` request (``"stream": true``) on the
   authenticated control channel;
2. the shadow answers with the manifest (``entries``, each with the CRC-32C of every chunk of
   ``chunk`` bytes) and ``"stream": {"port", "ticket", "chunk"}``: a TCP port of its
   :class:`BulkServer` on its control host and a random one-time ticket (32 bytes, hex), valid
   for this reply only and only for ``ticket_ttl_s``; no frames;
3. the requester connects to the port and sends the 32 ticket bytes; the shadow looks the
   ticket up (it is forgotten as it is used or when it expires: a second or late use finds
   nothing and the connection is closed unanswered), then sends the tensors' bytes in the
   manifest's order, back to back, from the tensors themselves (memoryviews, no copy), and
   closes the connection;
4. the requester ``recv_into`` s each chunk straight into its place and checks its CRC while it
   is in the cache (:class:`StreamReader`); a bad CRC (``checksum``), a stream that ends early
   (``truncated``) or a stall past the deadline (:class:`ShadowgradTimeout`) fail the fetch.

The shadow calls ``on_done(ok)`` exactly once per offer: when the send ended (all sent, or it
failed), or when the ticket expired unused, or when the server closed; the owner of the memory
(the node's live-serve bookkeeping) writes it again only after that.

Standard library only (the tensors travel as memoryviews).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shadowgrad import wire
from shadowgrad.errors import ControlError, ShadowgradTimeout

__all__ = [
    "BulkServer",
    "StreamReader",
    "STREAM_CHUNK_BYTES",
    "TICKET_BYTES",
    "connect_stream",
    "endpoint_host",
]

log = logging.getLogger(__name__)

#: bytes of a ticket
TICKET_BYTES = 32
#: chunk (CRC granule) of a streamed fetch: small enough that a chunk just received is still
#: in the cache when its CRC is computed
STREAM_CHUNK_BYTES = 2**20
#: socket buffer sizes asked for on both ends (the kernel caps them at its maxima)
SOCKET_BUFFER_BYTES = 4 * 2**20


def endpoint_host(endpoint: str) -> str:
    """The host of a zmq TCP endpoint (``tcp://host:port``; ``[v6]`` brackets dropped; ``*``
    is every interface: the empty string)."""
    rest = endpoint.removeprefix("tcp://")
    host = rest.rsplit(":", 1)[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return "" if host == "*" else host


@dataclass
class _Offer:
    frames: Sequence[memoryview]
    on_done: Callable[[bool], None]
    expires: float
    send_timeout_s: float


class BulkServer:
    """The shadow's side: a listening TCP socket on ``host`` (port 0: an ephemeral port,
    :attr:`port`) and a thread that accepts connections, each served on a thread of its own.

    ``ticket_ttl_s``: how long an offer waits to be claimed, and how long a connection may take
    to send its ticket; ``counters``: where ``bulk_*`` events are counted (the node's);
    ``max_offers``: offers pending at once (past it :meth:`offer` returns None: the caller
    answers the ZeroMQ way)."""

    def __init__(
        self,
        host: str,
        *,
        ticket_ttl_s: float,
        counters: Counter[str] | None = None,
        max_offers: int = 256,
        poll_s: float = 0.05,
        name: str = "bulk",
    ) -> None:
        self.ev: Counter[str] = counters if counters is not None else Counter()
        self._ttl = ticket_ttl_s
        self._max = max_offers
        self._poll = poll_s
        self._name = name
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        ls = socket.socket(fam, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((host, 0))
            ls.listen(64)
            ls.settimeout(poll_s)
        except OSError:
            ls.close()
            raise
        self._listener = ls
        #: the port the requesters connect to
        self.port: int = int(ls.getsockname()[1])
        self._lock = threading.Lock()
        self._offers: dict[bytes, _Offer] = {}
        self._conns: set[threading.Thread] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- offers

    def offer(
        self,
        frames: Sequence[memoryview],
        on_done: Callable[[bool], None],
        *,
        send_timeout_s: float,
    ) -> str | None:
        """Register ``frames`` to be sent to whoever presents the returned ticket (hex) within
        ``ticket_ttl_s``; ``send_timeout_s``: the send's whole deadline. None when the server
        is closed or has ``max_offers`` pending (``on_done`` is then not called)."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        key = hashlib.sha256(ticket).digest()
        with self._lock:
            if self._stop.is_set() or len(self._offers) >= self._max:
                return None
            self._offers[key] = _Offer(
                list(frames), on_done, time.monotonic() + self._ttl, send_timeout_s
            )
        return ticket.hex()

    @property
    def pending(self) -> int:
        """Offers not yet claimed."""
        with self._lock:
            return len(self._offers)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [k for k, o in self._offers.items() if o.expires <= now]
            dropped = [self._offers.pop(k) for k in gone]
        for o in dropped:
            self.ev["bulk_expired"] += 1
            _done(o, False)

    # ---------------------------------------------------------------- threads

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._expire()
            try:
                conn, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                self.ev["bulk_accept_error"] += 1
                time.sleep(self._poll)
                continue
            t = threading.Thread(target=self._serve, args=(conn,), name=f"{self._name}-send")
            t.daemon = True
            with self._lock:
                self._conns.add(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                offer = self._claim(conn)
                if offer is None:
                    return
                ok = False
                try:
                    _send_all(conn, offer.frames, time.monotonic() + offer.send_timeout_s)
                    ok = True
                    self.ev["bulk_sent"] += 1
                except (OSError, ShadowgradTimeout) as e:
                    self.ev["bulk_send_error"] += 1
                    log.warning("%s: stream send failed: %s", self._name, e)
                finally:
                    _done(offer, ok)
        finally:
            with self._lock:
                self._conns.discard(threading.current_thread())

    def _claim(self, conn: socket.socket) -> _Offer | None:
        """Read the ticket (within the TTL) and take its offer; None (counted) otherwise."""
        deadline = time.monotonic() + self._ttl
        buf = bytearray(TICKET_BYTES)
        view = memoryview(buf)
        got = 0
        try:
            while got < TICKET_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                conn.settimeout(remaining)
                n = conn.recv_into(view[got:])
                if n == 0:
                    break
                got += n
        except OSError:  # TimeoutError too
            got = -1
        if got != TICKET_BYTES:
            self.ev["bulk_bad_ticket"] += 1
            return None
        key = hashlib.sha256(bytes(buf)).digest()
        with self._lock:
            offer = self._offers.pop(key, None)
        if offer is None:
            self.ev["bulk_bad_ticket"] += 1
            return None
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        return offer

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, fail every pending offer (``on_done(False)``), and wait up to
        ``timeout_s`` for the sends in progress to end. Idempotent."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            offers, self._offers = list(self._offers.values()), {}
        self._thread.join(timeout_s)
        self._listener.close()
        for o in offers:
            _done(o, False)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            conns = list(self._conns)
        for t in conns:
            t.join(max(0.0, deadline - time.monotonic()))


def _done(offer: _Offer, ok: bool) -> None:
    try:
        offer.on_done(ok)
    except Exception:
        log.exception("bulk: on_done failed")


def _send_all(conn: socket.socket, frames: Sequence[memoryview], deadline: float) -> None:
    for f in frames:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ShadowgradTimeout("stream send past its deadline")
        conn.settimeout(remaining)
        conn.sendall(f)
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)


# -------------------------------------------------------------------- requester


def connect_stream(host: str, stream: Mapping[str, Any], deadline: float) -> StreamReader:
    """Connect to the stream a ``fetch`` reply offered (``stream``: its ``port``, ``ticket``,
    ``chunk``) on ``host`` (the shadow's control host), present the ticket and return the
    reader; everything by ``deadline`` (monotonic; :class:`ShadowgradTimeout`)."""
    try:
        port = int(stream["port"])
        ticket = bytes.fromhex(str(stream["ticket"]))
        chunk = int(stream["chunk"])
    except (KeyError, TypeError, ValueError) as e:
        raise ControlError("bad_reply", f"fetch reply: malformed stream {stream!r}: {e}") from None
    if len(ticket) != TICKET_BYTES or chunk <= 0 or not 0 < port < 65536:
        raise ControlError("bad_reply", "fetch reply: malformed stream")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ShadowgradTimeout("no time left to connect to the stream")
    try:
        sock = socket.create_connection((host, port), timeout=remaining)
    except TimeoutError:
        raise ShadowgradTimeout(f"stream connect to {host}:{port} timed out") from None
    except OSError as e:
        raise ControlError("unavailable", f"stream connect to {host}:{port}: {e}") from None
    try:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(ticket)
    except TimeoutError:
        sock.close()
        raise ShadowgradTimeout(f"stream {host}:{port}: ticket not sent in time") from None
    except OSError as e:
        sock.close()
        raise ControlError("unavailable", f"stream {host}:{port}: {e}") from None
    return StreamReader(sock, chunk, deadline, f"{host}:{port}")


class StreamReader:
    """The requester's end of one stream: :meth:`read_into` each tensor in manifest order."""

    def __init__(self, sock: socket.socket, chunk: int, deadline: float, where: str) -> None:
        self._sock = sock
        self.chunk = chunk
        self._deadline = deadline
        self._where = where
        #: bytes received and verified
        self.nbytes = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_into(self, dest: memoryview, crcs: Sequence[int], what: str) -> None:
        """Receive ``dest.nbytes`` bytes straight into ``dest`` (writable, bytes), chunk by
        chunk of :attr:`chunk` bytes, each checked against its CRC-32C in ``crcs`` right after
        it landed (ControlError ``checksum``; ``truncated`` when the stream ends early;
        :class:`ShadowgradTimeout` past the deadline). ``what`` names the tensor in errors."""
        n = dest.nbytes
        want = -(-n // self.chunk)
        if len(crcs) != want:
            raise ControlError(
                "bad_reply", f"{what}: {len(crcs)} CRCs for {n} B in chunks of {self.chunk} B"
            )
        sock = self._sock
        for k, crc in enumerate(crcs):
            lo = k * self.chunk
            piece = dest[lo : min(n, lo + self.chunk)]
            got = 0
            size = piece.nbytes
            while got < size:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise ShadowgradTimeout(f"stream {self._where} stalled in {what}")
                sock.settimeout(remaining)
                try:
                    r = sock.recv_into(piece[got:])
                except TimeoutError:
                    raise ShadowgradTimeout(f"stream {self._where} stalled in {what}") from None
                except OSError as e:
                    raise ControlError("truncated", f"stream {self._where}: {e}") from None
                if r == 0:
                    raise ControlError(
                        "truncated",
                        f"stream {self._where} ended in chunk {k} of {what} "
                        f"({self.nbytes + got} B received)",
                    )
                got += r
            if wire.crc(piece) != crc:
                raise ControlError("checksum", f"chunk {k} of {what} fails CRC-32")
            self.nbytes += size
