/* Ingress stage 2, anti-spoofing (included into SgIngress; controller class GuardStage).
 * Only a FINAL DATA chunk or a COMMIT ("tagged") is checked: its job must be served by this
 * switch (jobs) and its ingress port must be a registered trainer port of that job
 * (trainer_ports), else the packet is dropped and counted by reason. Tagged chunks and COMMITs
 * are counted per trainer port (the COMMIT count is the switch-side heartbeat). */
    counter(512, CounterType.packets_and_bytes) tagged_chunks;
    counter(512, CounterType.packets_and_bytes) commits;
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
