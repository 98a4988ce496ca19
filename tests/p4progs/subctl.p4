/* Sub-controls: a control instantiated inside the ingress, with its own table, an inout
 * scalar parameter (copy-in/copy-out), return and exit. */
#include "common.p4"

control Classify(in bit<8> proto, inout bit<9> port, inout headers hdr) {
    action set_port(bit<9> p) { port = p; }
    table by_proto {
        key = { proto: exact; }
        actions = { set_port; NoAction; }
        default_action = NoAction();
    }
    apply {
        by_proto.apply();
        if (proto == 1) {
            return;                        /* leaves this control only */
        }
        if (proto == 2) {
            hdr.ipv4.ttl = 1;
            exit;                          /* ends the whole ingress */
        }
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }
}

control SubIngress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    Classify() classify;
    apply {
        bit<9> port = 1;
        classify.apply(hdr.ipv4.protocol, port, hdr);
        standard_metadata.egress_spec = port;
        hdr.ipv4.diffserv = 0x77;
    }
}

control SubEgress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), SubIngress(), SubEgress(), Ipv4Checksum(),
         AllDeparser()) main;
