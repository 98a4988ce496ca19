/* verify_checksum sets checksum_error and does not drop; update_checksum rewrites. */
#include "common.p4"

control IpVerify(inout headers hdr, inout metadata meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control CsIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = standard_metadata.checksum_error == 1 ? 9w2 : 9w1;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }
}

control CsEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), IpVerify(), CsIngress(), CsEgress(), Ipv4Checksum(),
         AllDeparser()) main;
