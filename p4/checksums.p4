/* SgVerifyChecksum / SgComputeChecksum: the IPv4 header checksum is recomputed on every packet
 * that leaves (after the shadow rewrite); an unchanged header gets its own checksum back. The
 * UDP checksum is not recomputed: shadow copies carry 0 (egress.p4), forwarded packets keep the
 * sender's. Nothing is verified on the way in (the shadows verify their CRC32C). */
control SgVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control SgComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}
