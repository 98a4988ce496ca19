"""The skeleton of the small v1model programs the P4 target's tests write: what a test states
is what varies (the types, the parser's, ingress's and deparser's bodies; egress and
compute-checksum where it uses them), :func:`v1switch` the rest (the includes, the controls'
signatures, an empty verify-checksum control, ``V1Switch(...) main``)."""

from __future__ import annotations

__all__ = ["EXTRACT_H", "v1switch"]

#: a parser body that extracts ``hdr.h`` and accepts
EXTRACT_H = "{\n    state start { pkt.extract(hdr.h); transition accept; }\n}"
_EMPTY = "{ apply { } }"
_SM = "inout standard_metadata_t sm"


def v1switch(
    types: str,
    *,
    ingress: str,
    parser: str = EXTRACT_H,
    deparser: str = "{ apply { pkt.emit(hdr.h); } }",
    egress: str = _EMPTY,
    checksum: str = _EMPTY,
) -> str:
    """A v1model program: ``types`` (from its first line: ``struct headers``, ``struct
    meta_t`` and whatever else stands before the parser) after the includes, then ``parser P``,
    the controls ``V`` (empty), ``I``, ``E``, ``C`` and ``D`` with the bodies given (each from
    its opening brace; ``m`` is the metadata, ``sm`` the standard metadata) and ``main``. The
    text starts with a newline, as a program written in a triple-quoted string does (the
    diagnostics' line numbers count it)."""
    return (
        "\n#include <core.p4>\n#include <v1model.p4>\n"
        f"{types.lstrip(chr(10))}"
        f"parser P(packet_in pkt, out headers hdr, inout meta_t m, {_SM}) {parser}\n"
        f"control V(inout headers hdr, inout meta_t m) {_EMPTY}\n"
        f"control I(inout headers hdr, inout meta_t m, {_SM}) {ingress}\n"
        f"control E(inout headers hdr, inout meta_t m, {_SM}) {egress}\n"
        f"control C(inout headers hdr, inout meta_t m) {checksum}\n"
        f"control D(packet_out pkt, in headers hdr) {deparser}\n"
        "V1Switch(P(), V(), I(), E(), C(), D()) main;\n"
    )
