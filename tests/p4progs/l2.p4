/* L2 exact forwarding with a direct counter and an indexed per-port counter. */
#include "common.p4"

control L2Ingress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    direct_counter(CounterType.packets_and_bytes) dmac_counter;
    counter(16, CounterType.packets_and_bytes) port_counter;

    action fwd(bit<9> port) {
        standard_metadata.egress_spec = port;
    }
    action drop() {
        mark_to_drop(standard_metadata);
    }
    table dmac {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { fwd; drop; }
        counters = dmac_counter;
        size = 64;
    }
    apply {
        port_counter.count((bit<32>) standard_metadata.ingress_port);
        dmac.apply();
    }
}

control L2Egress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), L2Ingress(), L2Egress(), Ipv4Checksum(),
         AllDeparser()) main;
