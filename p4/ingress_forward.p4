/* SgForward, ingress stage 1: forwarding (instance SgIngress.forward; controller class
 * ForwardStage). IPv4 by longest prefix (the driver writes a /32 per host: port and the host's
 * MAC), anything else by destination MAC, broadcast (ARP) flooded to the other hosts of the
 * ingress port's job. The routing rewrite is the destination MAC only: no TTL change, so a
 * forwarded frame leaves byte-identical apart from it. Sets meta.routed when a table chose the
 * egress; SgIngress drops what is left unrouted. */
control SgForward(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    action route(bit<9> port, bit<48> dmac) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.dstAddr = dmac;
        meta.routed = 1;
    }
    action bridge(bit<9> port) {
        standard_metadata.egress_spec = port;
        meta.routed = 1;
    }
    action flood(bit<16> grp) {
        standard_metadata.mcast_grp = grp;
        meta.routed = 1;
    }
    table ipv4_forward {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { route; NoAction; }
        default_action = NoAction();
        size = 4096;
    }
    table l2_forward {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { bridge; NoAction; }
        default_action = NoAction();
        size = 4096;
    }
    table l2_flood {
        key = { standard_metadata.ingress_port: exact; }
        actions = { flood; NoAction; }
        default_action = NoAction();
        size = 512;
    }
    apply {
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
    }
}
