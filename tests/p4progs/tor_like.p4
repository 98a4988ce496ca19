/* The shape of the project's ToR program (p4/shadowgrad.p4, docs/switch.md), for the fast-path and
 * dataplane tests: Ethernet / IPv4 / UDP / the shadowgrad wire header (p4/include/headers.p4);
 * a FINAL DATA chunk of a known (job, bucket) goes to a multicast group {next ring hop, shadow
 * replicas}; egress rewrites a shadow copy's MAC and IP per egress_rid; everything else is
 * routed by LPM on the IPv4 destination. IPv4 checksum recomputed, UDP checksum cleared on
 * rewritten copies. */
#include <core.p4>
#include <v1model.p4>
#include "../../p4/include/headers.p4"

header ethernet_t { bit<48> dstAddr; bit<48> srcAddr; bit<16> etherType; }
header ipv4_t {
    bit<4> version; bit<4> ihl; bit<8> diffserv; bit<16> totalLen; bit<16> identification;
    bit<3> flags; bit<13> fragOffset; bit<8> ttl; bit<8> protocol; bit<16> hdrChecksum;
    bit<32> srcAddr; bit<32> dstAddr;
}
header udp_t { bit<16> srcPort; bit<16> dstPort; bit<16> length; bit<16> checksum; }

struct headers { ethernet_t ethernet; ipv4_t ipv4; udp_t udp; shadowgrad_h sg; }
struct metadata { bit<1> final; }

parser TorParser(packet_in packet, out headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) { 0x0800: parse_ipv4; default: accept; }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol, hdr.ipv4.fragOffset) {
            (17, 0): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) { SG_UDP_PORT: parse_sg; default: accept; }
    }
    state parse_sg {
        packet.extract(hdr.sg);
        verify(hdr.sg.magic == SG_MAGIC, error.ParserInvalidArgument);
        transition accept;
    }
}

control TorVerify(inout headers hdr, inout metadata meta) { apply { } }

control TorIngress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    counter(64, CounterType.packets_and_bytes) final_chunks;
    action drop() { mark_to_drop(standard_metadata); }
    action route(bit<48> dmac, bit<9> port) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = dmac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }
    action mirror(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
        meta.final = 1;
    }
    table ipv4_lpm {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { route; drop; NoAction; }
        default_action = drop();
    }
    table final_tap {
        key = { hdr.sg.job: exact; hdr.sg.bucket: exact; }
        actions = { mirror; NoAction; }
        default_action = NoAction();
    }
    apply {
        if (!hdr.ipv4.isValid() || standard_metadata.parser_error != error.NoError) {
            drop();
            exit;
        }
        ipv4_lpm.apply();
        if (hdr.sg.isValid() && hdr.sg.kind == SG_KIND_DATA
                && (hdr.sg.flags & SG_FLAG_FINAL) != 0) {
            if (final_tap.apply().hit) {
                final_chunks.count((bit<32>) hdr.sg.bucket[5:0]);
            }
        }
    }
}

control TorEgress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    action to_shadow(bit<48> dmac, bit<32> dip) {
        hdr.ethernet.dstAddr = dmac;
        hdr.ipv4.dstAddr = dip;
        hdr.udp.checksum = 0;
    }
    table shadow_rewrite {
        key = { standard_metadata.egress_rid: exact; }
        actions = { to_shadow; NoAction; }
        default_action = NoAction();
    }
    apply {
        if (standard_metadata.instance_type == 5 && standard_metadata.egress_rid != 0) {
            shadow_rewrite.apply();
        }
    }
}

control TorCompute(inout headers hdr, inout metadata meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control TorDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.sg);
    }
}

V1Switch(TorParser(), TorVerify(), TorIngress(), TorEgress(), TorCompute(), TorDeparser()) main;
