/* Ternary/range ACL with priorities, plus a const-entries classifier (source order = priority). */
#include "common.p4"

control AclIngress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    action allow(bit<9> port) {
        standard_metadata.egress_spec = port;
    }
    action deny() {
        mark_to_drop(standard_metadata);
    }
    action set_class(bit<8> c) {
        hdr.ipv4.diffserv = c;
    }
    table acl {
        key = {
            hdr.ipv4.srcAddr: ternary;
            hdr.ipv4.protocol: ternary;
            hdr.udp.dstPort: range @name("dport");
        }
        actions = { allow; deny; }
        default_action = deny();
    }
    table classify {
        key = {
            hdr.ipv4.protocol: ternary;
            hdr.udp.dstPort: ternary;
        }
        actions = { set_class; NoAction; }
        const entries = {
            (17, 53): set_class(2);
            (17, _): set_class(1);
            (_, _): set_class(3);
        }
    }
    apply {
        if (hdr.ipv4.isValid()) {
            acl.apply();
            classify.apply();
        } else {
            mark_to_drop(standard_metadata);
        }
    }
}

control AclEgress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), AclIngress(), AclEgress(), Ipv4Checksum(),
         AllDeparser()) main;
