/* SgTap, ingress stage 3: the tap (instance SgIngress.tap; controller class TapStage), applied
 * to a FINAL chunk that passed the guard. Its bytes (job, bucket, offset) belong to exactly one
 * shard (tap: one range per route of the layout; the ring cuts FINAL datagrams at shard
 * boundaries). A chunk on its way to a trainer (the ring's next hop, the egress that
 * forwarding chose) goes to the multicast group {next hop, every replica of the shard}
 * (shard_groups). A FINAL chunk addressed to anything else (a retransmission sent straight to a
 * shadow) finds no group and is only forwarded. */
control SgTap(inout headers_t hdr, inout metadata_t meta,
              inout standard_metadata_t standard_metadata) {
    action to_shard(bit<16> shard) {
        meta.shard = shard;
    }
    action replicate(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
    }
    table tap {
        key = {
            hdr.sg.job: exact;
            hdr.sg.bucket: exact;
            hdr.sg.offset: range;
        }
        actions = { to_shard; NoAction; }
        default_action = NoAction();
        size = 16384;
    }
    table shard_groups {
        key = {
            hdr.sg.job: exact;
            meta.shard: exact;
            standard_metadata.egress_spec: exact;
        }
        actions = { replicate; NoAction; }
        default_action = NoAction();
        size = 4096;
    }
    apply {
        if (tap.apply().hit) {
            shard_groups.apply();
        }
    }
}
