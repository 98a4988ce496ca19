/* Ethernet / IPv4 / UDP headers, the parsed-header struct, user metadata and the constants
 * shared by every control of p4/shadowgrad.p4. The shadowgrad header itself is headers.p4. */
#ifndef SHADOWGRAD_TYPES_P4
#define SHADOWGRAD_TYPES_P4

#include "headers.p4"

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP   = 17;
const bit<48> MAC_BROADCAST  = 0xffffffffffff;

/* v1model instance_type of a PRE copy (multicast replica) */
const bit<32> INSTANCE_REPLICATION = 5;

/* indexes of SgIngress.drops, the drop counter by reason (controller/switch.py DROP_REASONS) */
const bit<32> DROP_SPOOFED      = 0;   /* FINAL chunk or COMMIT from a port that is not a
                                          registered trainer port of its job */
const bit<32> DROP_FOREIGN_JOB  = 1;   /* FINAL chunk or COMMIT of a job this switch serves not */
const bit<32> DROP_PARSER_ERROR = 2;   /* a parser error (bad magic, truncated header) */
const bit<32> DROP_NO_ROUTE     = 3;   /* no forwarding entry for the destination */
const bit<32> DROP_NO_REWRITE   = 4;   /* a shadow copy without a rewrite entry (egress) */
const bit<32> NUM_DROP_REASONS  = 8;

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

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

struct headers_t {
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    shadowgrad_h sg;
}

struct metadata_t {
    bit<1>  routed;       /* a forwarding table chose the egress */
    bit<1>  tagged;       /* a FINAL DATA chunk or a COMMIT */
    bit<16> rank;         /* the sending trainer's rank (guard) */
    bit<16> commit_grp;   /* the job's COMMIT multicast group (guard) */
    bit<16> shard;        /* the shard that owns a FINAL chunk's bytes (tap) */
    bit<1>  rejected;     /* the guard refused a tagged packet: SgIngress drops it */
    bit<32> drop_reason;  /* why (an index of SgIngress.drops, DROP_*) */
}

#endif
