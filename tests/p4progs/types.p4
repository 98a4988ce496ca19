/* Types: int<W> header fields, plain enums, bool/error metadata, header/struct copies,
 * local headers, lookahead of a header. */
#include "common.p4"

enum Phase { IDLE, BUSY }

header signed_t {
    int<8>  a;
    bit<8>  b;
}

struct info_t {
    Phase   phase;
    bool    flag;
    error   err;
    bit<8>  n;
}

control TyIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    info_t info;
    apply {
        standard_metadata.egress_spec = 1;
        if (!hdr.tag.isValid()) {
            exit;
        }
        info.phase = Phase.BUSY;
        info.flag = hdr.tag.flags != 0;
        info.err = standard_metadata.parser_error;
        info_t copy = info;
        copy.n = 3;
        info.n = 1;
        tag_t saved = hdr.tag;                    /* a copy, not an alias */
        hdr.tag.info = 0x1111;
        signed_t s;
        s.setValid();
        s.a = -2;
        s.b = (bit<8>) s.a;                       /* 0xfe */
        if (copy.phase == Phase.BUSY && copy.flag && copy.err == error.NoError) {
            hdr.tag.port = copy.n + info.n;       /* 4 */
        }
        hdr.tag.rid = saved.info[7:0];            /* value before the write above */
        hdr.tag.itype = s.b;
        int<16> wide = (int<16>) s.a;             /* sign extension: -2 */
        hdr.udp.checksum = (bit<16>) wide;        /* 0xfffe */
        if (s.a < 0 && wide < -1 && !(wide > 0)) {
            hdr.tag.flags = hdr.tag.flags |+| 0xff;   /* saturates at 0xff */
        }
    }
}

control TyEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), TyIngress(), TyEgress(), NoVerify(),
         AllDeparser()) main;
