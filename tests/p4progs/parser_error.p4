/* Parser errors do not drop: the packet reaches ingress with parser_error set. */
#include "common.p4"

error { BadIpVersion }

parser StrictParser(packet_in packet, out headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETH_IPV4: parse_ipv4;
            0x9000 &&& 0xff00: parse_strict;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        verify(hdr.ipv4.version == 4, error.BadIpVersion);
        transition accept;
    }
    state parse_strict {
        transition select(hdr.ethernet.srcAddr[7:0], packet.lookahead<bit<8>>()) {
            (1, 0x00 .. 0x7f): accept;     /* no default: anything else is NoMatch */
        }
    }
}

control ErrIngress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.parser_error == error.NoError) {
            standard_metadata.egress_spec = 1;
        } else if (standard_metadata.parser_error == error.PacketTooShort) {
            standard_metadata.egress_spec = 2;
        } else if (standard_metadata.parser_error == error.NoMatch) {
            standard_metadata.egress_spec = 3;
        } else if (standard_metadata.parser_error == error.BadIpVersion) {
            standard_metadata.egress_spec = 4;
        }
    }
}

control ErrEgress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply { }
}

control PlainDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
    }
}

V1Switch(StrictParser(), NoVerify(), ErrIngress(), ErrEgress(), NoVerify(),
         PlainDeparser()) main;
