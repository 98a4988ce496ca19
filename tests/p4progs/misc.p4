/* Expression semantics, registers, hash, switch/action_run, hit/miss, exit. Results go to tag. */
#include "common.p4"

typedef bit<16> word_t;
enum bit<8> Color { RED = 1, GREEN = 2 }

control MiscIngress(inout headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    register<bit<16>>(8) seen;
    bit<16> tmp = 0;

    action a_one() { hdr.tag.info = 1; }
    action a_two(bit<16> v) { hdr.tag.info = v; }
    table sel {
        key = { hdr.tag.flags: exact; }
        actions = { a_one; a_two; }
    }
    apply {
        standard_metadata.egress_spec = 1;
        if (!hdr.tag.isValid()) {
            exit;
        }
        switch (sel.apply().action_run) {
            a_one: { hdr.tag.rid = 0x11; }
            a_two: { hdr.tag.rid = 0x22; }
            default: { hdr.tag.rid = 0x33; }
        }
        if (hdr.tag.itype == 1) {            /* wrap-around and saturation */
            bit<8> x = 250;
            hdr.tag.port = x + 10;           /* 4 */
            hdr.udp.checksum = 16w5 - 16w7;  /* 0xfffe */
            hdr.tag.info = (bit<16>) (x |+| 10) ++ 8w0 [7:0] == 0 ? 16w0x1 : 16w0x2;
        } else if (hdr.tag.itype == 2) {     /* signed arithmetic, casts, concat, slices */
            int<8> s = -3;
            int<8> t = s * 2;                /* -6 */
            hdr.tag.port = (bit<8>) t;       /* 0xfa */
            hdr.tag.info = hdr.ipv4.srcAddr[31:24] ++ (bit<8>) Color.GREEN;
            hdr.udp.checksum = (bit<16>) (s >> 1) ;       /* arithmetic shift: -2 -> 0xfffe */
        } else if (hdr.tag.itype == 3) {     /* registers keep state across packets */
            seen.read(tmp, 2);
            tmp = tmp + 1;
            seen.write(2, tmp);
            hdr.tag.info = tmp;
            seen.write(100, 5);              /* out of range: ignored */
        } else if (hdr.tag.itype == 4) {     /* hash */
            hash(hdr.tag.info, HashAlgorithm.crc16, 16w0, { hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
                 32w65536);
            hash(hdr.udp.checksum, HashAlgorithm.crc32, 16w100, { hdr.ipv4.srcAddr }, 32w50);
        } else if (hdr.tag.itype == 5) {     /* hit / miss */
            hdr.tag.port = 0;
        }
        if (hdr.tag.itype == 6) {
            if (hdr.tag.flags == 0) { exit; }
            hdr.tag.port = 0x66;
        }
    }
}

control MiscEgress(inout headers hdr, inout metadata meta,
                   inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), MiscIngress(), MiscEgress(), NoVerify(),
         AllDeparser()) main;
