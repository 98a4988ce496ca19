/* The deparser emits only valid headers: strip the tag, push a probe header. */
#include "common.p4"

control DpIngress(inout headers hdr, inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    apply {
        standard_metadata.egress_spec = 1;
        if (hdr.tag.isValid() && hdr.tag.flags == 1) {
            hdr.tag.setInvalid();
        }
        if (hdr.tag.isValid() && hdr.tag.flags == 2 && !hdr.probe.isValid()) {
            hdr.probe.setValid();
            hdr.probe.hops = 1;
            hdr.probe.marker = 0x5a;
            hdr.probe.etherType = hdr.ethernet.etherType;
            hdr.ethernet.etherType = ETH_PROBE;
        }
    }
}

control DpEgress(inout headers hdr, inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    apply { }
}

V1Switch(CommonParser(), NoVerify(), DpIngress(), DpEgress(), Ipv4Checksum(),
         AllDeparser()) main;
