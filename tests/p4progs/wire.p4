/* A two-port wire: whatever enters port 1 leaves port 2 and back (tests/test_mininet.py). */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

struct metadata { }

struct headers {
    ethernet_t ethernet;
}

parser WireParser(packet_in packet, out headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control WireVerify(inout headers hdr, inout metadata meta) { apply { } }

control WireIngress(inout headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.ingress_port == 1) {
            standard_metadata.egress_spec = 2;
        } else {
            standard_metadata.egress_spec = 1;
        }
    }
}

control WireEgress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) { apply { } }

control WireCompute(inout headers hdr, inout metadata meta) { apply { } }

control WireDeparser(packet_out packet, in headers hdr) {
    apply { packet.emit(hdr.ethernet); }
}

V1Switch(WireParser(), WireVerify(), WireIngress(), WireEgress(), WireCompute(),
         WireDeparser()) main;
