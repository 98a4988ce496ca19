/* I2E clone (original packet, re-parsed) and E2E clone (packet as after egress). */
#include "common.p4"

control CloneIngress(inout headers hdr, inout metadata meta,
                     inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = 2;
        if (hdr.tag.isValid()) {
            hdr.tag.info = 0xaaaa;            /* an ingress change the I2E copy must not see */
            meta.mark = 7;
            if (hdr.tag.flags[0:0] == 1) {
                clone_preserving_field_list(CloneType.I2E, 5, 1);
            }
        }
    }
}

control CloneEgress(inout headers hdr, inout metadata meta,
                    inout standard_metadata_t standard_metadata) {
    apply {
        if (hdr.tag.isValid()) {
            hdr.tag.itype = (bit<8>) standard_metadata.instance_type;
            hdr.tag.rid = (bit<8>) standard_metadata.egress_rid;
            hdr.tag.port = meta.mark;
            if (standard_metadata.instance_type == 0 && hdr.tag.flags[1:1] == 1) {
                hdr.tag.info = 0xbbbb;        /* the E2E copy carries this change */
                clone(CloneType.E2E, 6);
            }
        }
    }
}

V1Switch(CommonParser(), NoVerify(), CloneIngress(), CloneEgress(), Ipv4Checksum(),
         AllDeparser()) main;
