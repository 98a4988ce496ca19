/* SgIngress: parser errors are dropped and counted; then forwarding (ingress_forward.p4), the
 * anti-spoofing guard (ingress_guard.p4) and the tap (ingress_tap.p4). One control, its stages
 * in one file each, so the stages' tables are SgIngress.<table> in the P4Info. */
control SgIngress(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) drops;

    action drop() {
        mark_to_drop(standard_metadata);
    }

#include "ingress_forward.p4"
#include "ingress_guard.p4"
#include "ingress_tap.p4"

    apply {
        if (standard_metadata.parser_error != error.NoError) {
            drops.count(DROP_PARSER_ERROR);
            drop();
            exit;
        }
        /* stage 1: forwarding */
        if (hdr.ipv4.isValid()) {
            ipv4_forward.apply();
        }
        if (meta.routed == 0) {
            if (hdr.ethernet.dstAddr == MAC_BROADCAST) {
                l2_flood.apply();
            } else {
                l2_forward.apply();
            }
        }
        if (meta.routed == 0) {
            drops.count(DROP_NO_ROUTE);
            drop();
            exit;
        }
        /* stage 2: only the job's trainers may send FINAL chunks and COMMITs */
        if (hdr.sg.isValid()) {
            if (hdr.sg.kind == SG_KIND_COMMIT) {
                meta.tagged = 1;
            } else if (hdr.sg.kind == SG_KIND_DATA && (hdr.sg.flags & SG_FLAG_FINAL) != 0) {
                meta.tagged = 1;
            }
        }
        if (meta.tagged == 1) {
            if (!jobs.apply().hit) {
                drops.count(DROP_FOREIGN_JOB);
                drop();
                exit;
            }
            if (!trainer_ports.apply().hit) {
                drops.count(DROP_SPOOFED);
                drop();
                exit;
            }
            if (hdr.sg.kind == SG_KIND_COMMIT) {
                /* every shadow of the job gets the COMMIT (the trainer sends it once) */
                commits.count((bit<32>) standard_metadata.ingress_port);
                standard_metadata.mcast_grp = meta.commit_grp;
            } else {
                /* stage 3: the tap */
                tagged_chunks.count((bit<32>) standard_metadata.ingress_port);
                if (tap.apply().hit) {
                    shard_groups.apply();
                }
            }
        }
    }
}
