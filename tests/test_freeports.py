"""Port pickers of the test harness (shadowgrad.freeports)."""

from __future__ import annotations

import socket

from shadowgrad.freeports import _ephemeral_low, free_listen_port, free_tcp_base


def test_a_listen_port_is_free_and_below_the_ephemeral_range() -> None:
    low = _ephemeral_low()
    for _ in range(50):
        port = free_listen_port()
        assert 10000 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: binds


def test_a_tcp_base_lies_in_its_range() -> None:
    for _ in range(50):
        base = free_tcp_base(3, low=30000, high=30100)
        assert base >= 30000 and base + 3 <= 30100
