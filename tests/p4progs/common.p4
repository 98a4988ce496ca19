/* Shared declarations of the dataplane test programs (tests/test_p4_dataplane.py).
 * Ethernet / optional probe / IPv4 / UDP / a test "tag" header on UDP port 0x1234. */
#ifndef TEST_COMMON_P4
#define TEST_COMMON_P4

#include <core.p4>
#include <v1model.p4>

const bit<16> ETH_IPV4  = 0x0800;
const bit<16> ETH_PROBE = 0x88b5;
const bit<8>  PROTO_UDP = 17;
const bit<16> TAG_PORT  = 0x1234;
const bit<9>  CPU_PORT  = 255;

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header probe_t {
    bit<8>  hops;
    bit<8>  marker;
    bit<16> etherType;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    bit<32> srcAddr;
    bit<32> dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

/* what the tests read back: instance type, egress_rid, and a free field */
header tag_t {
    bit<8>  itype;
    bit<8>  rid;
    bit<8>  flags;
    bit<8>  port;
    bit<16> info;
}

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> _pad;
}

@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<7> _pad;
}

struct headers {
    packet_in_t  packet_in;
    packet_out_t packet_out;
    ethernet_t   ethernet;
    probe_t      probe;
    ipv4_t       ipv4;
    udp_t        udp;
    tag_t        tag;
}

struct metadata {
    @field_list(1)
    bit<8>  mark;
    bit<16> scratch;
}

control NoVerify(inout headers hdr, inout metadata meta) {
    apply { }
}

control Ipv4Checksum(inout headers hdr, inout metadata meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control AllDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.probe);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.tag);
    }
}

parser CommonParser(packet_in packet, out headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }
    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }
    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETH_IPV4: parse_ipv4;
            ETH_PROBE: parse_probe;
            default: accept;
        }
    }
    state parse_probe {
        packet.extract(hdr.probe);
        transition select(hdr.probe.etherType) {
            ETH_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol, hdr.ipv4.fragOffset) {
            (PROTO_UDP, 0): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            TAG_PORT: parse_tag;
            default: accept;
        }
    }
    state parse_tag {
        packet.extract(hdr.tag);
        transition accept;
    }
}

#endif
