"""Type stub of the C extension shadow/_rxnative.c (the direct-run receive loop)."""

from typing import Any

from typing_extensions import Buffer

FLUSH: int
EMPTY: int
OTHER: int
ERROR: int

def crc32c(data: Buffer, value: int = 0, impl: str = "auto") -> int: ...
def crc32c_impls() -> tuple[str, ...]: ...

class Runner:
    def __init__(
        self,
        key: Buffer | None,
        header_size: int,
        tail_at: int,
        checksum_at: int,
        mac_size: int,
        nonce_size: int,
        max_datagram: int,
    ) -> None: ...
    def run(
        self,
        fd: int,
        box: Buffer,
        ls: int,
        end: int,
        seg_end: int,
        chunk: int,
        off: int,
        layout: int,
        prefix: Buffer,
        src: tuple[Any, ...],
        max_count: int,
        scratch: Buffer,
        sealed: bool,
        /,
    ) -> tuple[int, int, int, int, int, int, Any]: ...
    def verify(self, header: Buffer, payload: Buffer, trailer: Buffer, /) -> bool: ...
