/* Hash and checksum inputs the way bmv2 serialises a field list: fields packed MSB-first,
 * fields of an invalid header left out, and `identity` keeping the first 8 bytes only.
 * The probe header is valid only in frames with etherType 0x88b5. */
#include "common.p4"

control HashIngress(inout headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = 1;
        if (!hdr.tag.isValid()) {
            exit;
        }
        if (hdr.tag.itype == 1) {
            /* 10 bytes in: identity keeps srcPort ++ dstPort ++ srcAddr; mod 2^32 = srcAddr */
            hash(hdr.ipv4.dstAddr, HashAlgorithm.identity, 32w0,
                 { hdr.udp.srcPort, hdr.udp.dstPort, hdr.ipv4.srcAddr, hdr.tag.info },
                 64w0x100000000);
        } else if (hdr.tag.itype == 2) {
            /* the probe's fields count only when the probe header is valid */
            hash(hdr.tag.info, HashAlgorithm.crc16, 16w0,
                 { hdr.probe.hops, hdr.ipv4.srcAddr, hdr.probe.marker }, 32w65536);
            hash(hdr.ipv4.dstAddr, HashAlgorithm.crc32, 32w0,
                 { hdr.ipv4.ttl, hdr.probe.hops, hdr.tag.rid }, 64w0x100000000);
        } else if (hdr.tag.itype == 4) {
            /* max 0: bmv2 takes it as 1 (with a warning), so the result is base */
            hash(hdr.tag.info, HashAlgorithm.crc16, 16w7, { hdr.ipv4.srcAddr }, 32w0);
        }
    }
}

control HashEgress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    apply { }
}

control HashChecksum(inout headers hdr, inout metadata meta) {
    apply {
        /* the condition does not imply the probe is valid: its field is left out if not (a
         * zero byte in its place would shift the rest by 8 bits and change the sum) */
        update_checksum(hdr.tag.isValid() && hdr.tag.itype == 3,
            { hdr.probe.hops, hdr.tag.itype, hdr.tag.rid, hdr.ipv4.srcAddr },
            hdr.udp.checksum, HashAlgorithm.csum16);
    }
}

V1Switch(CommonParser(), NoVerify(), HashIngress(), HashEgress(), HashChecksum(),
         AllDeparser()) main;
