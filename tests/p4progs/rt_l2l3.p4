/* rt_l2l3.p4: the switch-target runtime tests' program (P4Runtime, ports, netns).
 * L3: ipv4_lpm routes by destination (rewrites the destination MAC, decrements TTL).
 * L2: dmac exact on the destination MAC: unicast to a port, or multicast to a group; the
 *     egress suppresses the replica going back out of its ingress port and stamps egress_rid
 *     into the IPv4 identification field of multicast copies (rid-dependent egress rewrite).
 * acl: ternary with priorities, can drop or punt to the CPU (PacketIn with ingress_port).
 * PacketOut: the packet_out header names the egress port.
 * smac: exact on the source MAC; a miss sends a learn digest {srcAddr, ingress_port}.
 * Counters: indexed port_rx (per ingress port), direct counter on ipv4_lpm.
 * I2E clone to session 100 for packets matching the acl "mirror" action. */
#include <core.p4>
#include <v1model.p4>

const bit<9> CPU_PORT = 255;
const bit<16> TYPE_IPV4 = 0x0800;

@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<7> _pad;
}

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> _pad;
}

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
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

struct learn_t {
    bit<48> srcAddr;
    bit<9>  ingress_port;
}

struct metadata {
    bit<1> routed;
}

struct headers {
    packet_in_t  packet_in;
    packet_out_t packet_out;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
}

parser MyParser(packet_in packet, out headers hdr, inout metadata meta,
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
            TYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition accept;
    }
}

control MyVerifyChecksum(inout headers hdr, inout metadata meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control MyIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    counter(512, CounterType.packets_and_bytes) port_rx;
    direct_counter(CounterType.packets_and_bytes) lpm_counter;

    action drop() {
        mark_to_drop(standard_metadata);
    }
    action to_cpu() {
        standard_metadata.egress_spec = CPU_PORT;
    }
    action mirror() {
        clone(CloneType.I2E, 100);
    }
    action ipv4_forward(bit<48> dstAddr, bit<9> port) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.dstAddr = dstAddr;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        meta.routed = 1;
    }
    action l2_forward(bit<9> port) {
        standard_metadata.egress_spec = port;
    }
    action multicast(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
    }
    action learn() {
        digest<learn_t>(1, { hdr.ethernet.srcAddr, standard_metadata.ingress_port });
    }

    table ipv4_lpm {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { ipv4_forward; drop; NoAction; }
        size = 1024;
        default_action = NoAction();
        counters = lpm_counter;
    }
    table dmac {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { l2_forward; multicast; drop; }
        size = 1024;
        default_action = drop();
    }
    table acl {
        key = {
            hdr.ipv4.dstAddr: ternary;
            hdr.ipv4.protocol: ternary;
        }
        actions = { drop; to_cpu; mirror; NoAction; }
        size = 256;
        default_action = NoAction();
    }
    table smac {
        key = { hdr.ethernet.srcAddr: exact; }
        actions = { learn; NoAction; }
        size = 1024;
        default_action = learn();
    }

    apply {
        port_rx.count((bit<32>) standard_metadata.ingress_port);
        if (hdr.packet_out.isValid()) {
            standard_metadata.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            exit;
        }
        smac.apply();
        if (hdr.ipv4.isValid()) {
            ipv4_lpm.apply();
        }
        if (meta.routed == 0) {
            dmac.apply();
        }
        if (hdr.ipv4.isValid()) {
            acl.apply();
        }
    }
}

control MyEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.instance_type == 5) {
            if (standard_metadata.egress_port == standard_metadata.ingress_port) {
                mark_to_drop(standard_metadata);
            } else if (hdr.ipv4.isValid()) {
                hdr.ipv4.identification = standard_metadata.egress_rid;
            }
        }
        if (standard_metadata.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = standard_metadata.ingress_port;
            hdr.packet_in._pad = 0;
        }
    }
}

control MyComputeChecksum(inout headers hdr, inout metadata meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control MyDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
    }
}

V1Switch(MyParser(), MyVerifyChecksum(), MyIngress(), MyEgress(), MyComputeChecksum(),
         MyDeparser()) main;
