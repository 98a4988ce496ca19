/* SgEgress (controller class EgressStage): a PRE copy with egress_rid != 0 is a shadow copy;
 * shadow_rewrite (job, rid) gives it the shadow's MAC, IPv4 address and UDP port, and clears
 * the UDP checksum (zero = "no checksum" in IPv4 UDP; the shadowgrad header carries its own
 * CRC32C over header and payload). A copy with rid 0 is the original's path (the ring's next
 * hop, or a flood copy, which is pruned on the port it came in on) and is left untouched. */
control SgEgress(inout headers_t hdr, inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    counter(512, CounterType.packets_and_bytes) shadow_copies;
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) egress_drops;

    action to_shadow(bit<48> dmac, bit<32> dip, bit<16> dport) {
        hdr.ethernet.dstAddr = dmac;
        hdr.ipv4.dstAddr = dip;
        hdr.udp.dstPort = dport;
        hdr.udp.checksum = 0;
    }
    table shadow_rewrite {
        key = {
            hdr.sg.job: exact;
            standard_metadata.egress_rid: exact;
        }
        actions = { to_shadow; NoAction; }
        default_action = NoAction();
        size = 1024;
    }
    apply {
        if (standard_metadata.instance_type == INSTANCE_REPLICATION) {
            if (standard_metadata.egress_rid == 0) {
                if (standard_metadata.egress_port == standard_metadata.ingress_port) {
                    mark_to_drop(standard_metadata);
                }
            } else if (hdr.sg.isValid() && hdr.ipv4.isValid() && hdr.udp.isValid()) {
                if (shadow_rewrite.apply().hit) {
                    if (hdr.sg.kind == SG_KIND_DATA) {
                        shadow_copies.count((bit<32>) standard_metadata.egress_port);
                    }
                } else {
                    egress_drops.count(DROP_NO_REWRITE);
                    mark_to_drop(standard_metadata);
                }
            } else {
                egress_drops.count(DROP_NO_REWRITE);
                mark_to_drop(standard_metadata);
            }
        }
    }
}
