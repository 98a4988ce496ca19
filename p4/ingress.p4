/* SgIngress: parser errors are dropped and counted; then three stages, each a control of its
 * own (tables, actions, apply) in its own file and instantiated here: forwarding (SgForward,
 * ingress_forward.p4), the anti-spoofing guard (SgGuard, ingress_guard.p4) and the tap (SgTap,
 * ingress_tap.p4). A stage's tables and actions are SgIngress.<instance>.<name> in the P4Info
 * (SgIngress.forward.ipv4_forward). The counters and every drop stay here: a stage only decides
 * (meta.routed, meta.rejected and meta.drop_reason). */
#include "ingress_forward.p4"
#include "ingress_guard.p4"
#include "ingress_tap.p4"

control SgIngress(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) drops;
    /* tagged chunks and COMMITs that passed the guard, per trainer port (the COMMIT count is
     * the switch-side heartbeat) */
    counter(512, CounterType.packets_and_bytes) tagged_chunks;
    counter(512, CounterType.packets_and_bytes) commits;

    SgForward() forward;
    SgGuard() guard;
    SgTap() tap;

    action drop() {
        mark_to_drop(standard_metadata);
    }

    apply {
        if (standard_metadata.parser_error != error.NoError) {
            drops.count(DROP_PARSER_ERROR);
            drop();
            exit;
        }
        /* stage 1: forwarding */
        forward.apply(hdr, meta, standard_metadata);
        if (meta.routed == 0) {
            drops.count(DROP_NO_ROUTE);
            drop();
            exit;
        }
        /* stage 2: only the job's trainers may send FINAL chunks and COMMITs */
        guard.apply(hdr, meta, standard_metadata);
        if (meta.rejected == 1) {
            drops.count(meta.drop_reason);
            drop();
            exit;
        }
        if (meta.tagged == 1) {
            if (hdr.sg.kind == SG_KIND_COMMIT) {
                /* every shadow of the job gets the COMMIT (the trainer sends it once) */
                commits.count((bit<32>) standard_metadata.ingress_port);
                standard_metadata.mcast_grp = meta.commit_grp;
            } else {
                /* stage 3: the tap */
                tagged_chunks.count((bit<32>) standard_metadata.ingress_port);
                tap.apply(hdr, meta, standard_metadata);
            }
        }
    }
}
