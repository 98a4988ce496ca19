"""FrameLink, the trainer's link through a P4 target's loopback port: what it sends is exactly
the frame :func:`shadowgrad.frames.encode_frame` makes of the datagram (the headers gathered in
front of the parts, nothing joined), and what it receives is a frame's payload, straight into
the caller's buffer, or a plain datagram from anyone else, whole."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from shadowgrad.frames import FRAME_OVERHEAD, decode_frame, encode_frame
from shadowgrad.trainer_hooks.link import FrameLink

MAC_A, MAC_B = 0x025347000001, 0x025347000002


@pytest.fixture
def rig() -> Iterator[tuple[FrameLink, socket.socket, socket.socket]]:
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    switch.settimeout(5)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    link = FrameLink(
        ("127.0.0.1", 0),
        switch=switch.getsockname(),
        mac=MAC_A,
        peers={("10.0.0.2", 4000): MAC_B},
    )
    link.me = link.address  # bound to an ephemeral port: frames must be addressed to it
    yield link, switch, other
    link.close()
    switch.close()
    other.close()


def test_sends_the_frame_of_the_gathered_parts(
    rig: tuple[FrameLink, socket.socket, socket.socket],
) -> None:
    link, switch, _other = rig
    parts = [b"h" * 56, memoryview(bytearray(os.urandom(9000))), bytes(28)]
    assert link.send(parts, ("10.0.0.2", 4000))
    frame, _ = switch.recvfrom(70000)
    want = encode_frame(
        b"".join(bytes(p) for p in parts),
        src=link.me,
        dst=("10.0.0.2", 4000),
        src_mac=MAC_A,
        dst_mac=MAC_B,
        ident=1,
    )
    assert frame == want
    f = decode_frame(frame)
    assert f is not None and bytes(f.payload) == b"".join(bytes(p) for p in parts)
    assert link.tx_frames == 1


@pytest.mark.parametrize("n", [1, 41, FRAME_OVERHEAD, 43, 1000, 65000])
def test_receives_frames_into_the_buffer_and_plain_datagrams_whole(
    rig: tuple[FrameLink, socket.socket, socket.socket], n: int
) -> None:
    link, switch, other = rig
    payload = os.urandom(n)
    buf = bytearray(65536)
    # a frame for this link: its payload, from the frame's source
    src = ("10.0.0.2", 4000)
    switch.sendto(
        encode_frame(payload, src=src, dst=link.me, src_mac=MAC_B, dst_mac=MAC_A), link.address
    )
    got = link.recv_into(buf, 5.0)
    assert got == (n, src) and bytes(buf[:n]) == payload
    # a frame for someone else is dropped and counted; the next datagram is delivered
    switch.sendto(
        encode_frame(payload, src=src, dst=("10.9.9.9", 1), src_mac=MAC_B, dst_mac=MAC_A),
        link.address,
    )
    # a plain datagram from another socket: whole, however its bytes were split on arrival
    other.sendto(payload, link.address)
    got = link.recv_into(buf, 5.0)
    assert got == (n, other.getsockname()) and bytes(buf[:n]) == payload
    assert link.rx_bad_frames == 1 and link.rx_frames == 1


def test_a_frame_larger_than_the_buffer_is_dropped(
    rig: tuple[FrameLink, socket.socket, socket.socket],
) -> None:
    link, switch, _other = rig
    switch.sendto(
        encode_frame(
            bytes(5000), src=("10.0.0.2", 4000), dst=link.me, src_mac=MAC_B, dst_mac=MAC_A
        ),
        link.address,
    )
    assert link.recv_into(bytearray(4000), 0.5) is None
    assert link.rx_bad_frames == 1
