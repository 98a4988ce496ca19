/* SgGuard, ingress stage 2: anti-spoofing (instance SgIngress.guard; controller class
 * GuardStage). Only a FINAL DATA chunk or a COMMIT ("tagged") is checked: its job must be served
 * by this switch (jobs) and its ingress port must be a registered trainer port of that job
 * (trainer_ports). The guard only decides: a refused packet gets meta.rejected and its drop
 * reason, and SgIngress drops and counts it (the drops counter is SgIngress's). */
control SgGuard(inout headers_t hdr, inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    action job_known(bit<16> commit_grp) {
        meta.commit_grp = commit_grp;
    }
    action trainer(bit<16> rank) {
        meta.rank = rank;
    }
    table jobs {
        key = { hdr.sg.job: exact; }
        actions = { job_known; NoAction; }
        default_action = NoAction();
        size = 64;
    }
    table trainer_ports {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.sg.job: exact;
        }
        actions = { trainer; NoAction; }
        default_action = NoAction();
        size = 1024;
    }
    apply {
        if (hdr.sg.isValid()) {
            if (hdr.sg.kind == SG_KIND_COMMIT) {
                meta.tagged = 1;
            } else if (hdr.sg.kind == SG_KIND_DATA && (hdr.sg.flags & SG_FLAG_FINAL) != 0) {
                meta.tagged = 1;
            }
        }
        if (meta.tagged == 1) {
            if (!jobs.apply().hit) {
                meta.rejected = 1;
                meta.drop_reason = DROP_FOREIGN_JOB;
            } else if (!trainer_ports.apply().hit) {
                meta.rejected = 1;
                meta.drop_reason = DROP_SPOOFED;
            }
        }
    }
}
