/* PacketIn/PacketOut through @controller_header headers on the CPU port, plus a digest. */
#include "common.p4"

struct learn_t {
    bit<48> srcAddr;
    bit<9>  port;
}

control IoIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply {
        if (hdr.packet_out.isValid()) {
            standard_metadata.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            exit;
        }
        if (hdr.ethernet.etherType == 0x88cc) {
            standard_metadata.egress_spec = CPU_PORT;
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = standard_metadata.ingress_port;
            hdr.packet_in._pad = 0;
        } else {
            digest<learn_t>(1, { hdr.ethernet.srcAddr, standard_metadata.ingress_port });
            standard_metadata.egress_spec = 1;
        }
    }
}

control IoEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), IoIngress(), IoEgress(), Ipv4Checksum(),
         AllDeparser()) main;
