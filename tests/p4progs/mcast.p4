/* Multicast with per-replica (egress_rid) rewrite; mark_to_drop clears mcast_grp. */
#include "common.p4"

control McIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    action flood(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
        standard_metadata.egress_spec = 9;   /* multicast overrides unicast */
    }
    action flood_then_drop(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
        mark_to_drop(standard_metadata);
    }
    table mc {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { flood; flood_then_drop; NoAction; }
        default_action = NoAction();
    }
    apply {
        mc.apply();
    }
}

control McEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.egress_port == standard_metadata.ingress_port) {
            mark_to_drop(standard_metadata);   /* no copy back to the sender */
        } else if (hdr.tag.isValid()) {
            hdr.tag.itype = (bit<8>) standard_metadata.instance_type;
            hdr.tag.rid = standard_metadata.egress_rid[7:0];
            hdr.tag.port = (bit<8>) standard_metadata.egress_port;
            hdr.ethernet.dstAddr[7:0] = standard_metadata.egress_rid[7:0];
        }
    }
}

V1Switch(CommonParser(), NoVerify(), McIngress(), McEgress(), Ipv4Checksum(),
         AllDeparser()) main;
