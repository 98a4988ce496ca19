/* Resubmit and recirculate with preserved field lists; truncate. */
#include "common.p4"

control RcIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = 1;
        if (!hdr.tag.isValid()) {
            exit;
        }
        if (standard_metadata.instance_type == 0 && hdr.tag.flags == 1) {
            meta.mark = 9;
            meta.scratch = 9;                     /* not in field list 1: reset */
            hdr.tag.info = 0xdead;                /* resubmit uses the original packet */
            resubmit_preserving_field_list(1);
        } else if (standard_metadata.instance_type == 6 || standard_metadata.instance_type == 4) {
            hdr.tag.itype = (bit<8>) standard_metadata.instance_type;
            hdr.tag.port = meta.mark;
            hdr.tag.rid = (bit<8>) meta.scratch;
            standard_metadata.egress_spec = 3;
        } else if (hdr.tag.flags == 3) {
            truncate(20);
        }
    }
}

control RcEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply {
        if (standard_metadata.instance_type == 0 && hdr.tag.flags == 2) {
            meta.mark = 5;
            hdr.tag.info = 0xbeef;                /* recirculation uses the deparsed packet */
            recirculate_preserving_field_list(1);
        }
    }
}

V1Switch(CommonParser(), NoVerify(), RcIngress(), RcEgress(), NoVerify(),
         AllDeparser()) main;
