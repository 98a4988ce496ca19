/* The queueing fields of standard_metadata in egress: enq_qdepth / deq_qdepth (packets in the
 * egress port's queue ahead of this one), enq_timestamp (µs), deq_timedelta. In ingress they
 * are 0. ECN-style marking on a lossless queue reads them. */
#include "common.p4"

control QIngress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = standard_metadata.ingress_port == 1 ? 9w2 : 9w1;
        if (hdr.tag.isValid()) {
            hdr.tag.flags = (bit<8>) standard_metadata.enq_qdepth;   /* 0 in ingress */
        }
    }
}

control QEgress(inout headers hdr, inout metadata meta,
                inout standard_metadata_t standard_metadata) {
    apply {
        if (hdr.tag.isValid()) {
            hdr.tag.info = (bit<16>) standard_metadata.enq_qdepth;
            hdr.tag.port = (bit<8>) standard_metadata.deq_qdepth;
            hdr.tag.rid = standard_metadata.enq_timestamp == 0 ? 8w0 : 8w1;
            hdr.udp.checksum = (bit<16>) standard_metadata.deq_timedelta;
            if (standard_metadata.enq_qdepth >= 3) {
                hdr.ipv4.diffserv = hdr.ipv4.diffserv | 3;          /* ECN CE */
            }
        }
    }
}

V1Switch(CommonParser(), NoVerify(), QIngress(), QEgress(), NoVerify(), AllDeparser()) main;
