/* shadowgrad's top-of-rack program (P4_16, v1model; bmv2 simple_switch_grpc or shadowgrad's
 * P4 target sg-switch-grpc). The switch copies every fully reduced gradient chunk (FINAL DATA)
 * of a data-parallel ring all-reduce to the shadow nodes that own its bytes, fans COMMITs out
 * to every shadow of the job, and forwards everything else as ordinary traffic.
 *
 * One file per control block; p4/README.md lists every table (keys, actions, who writes it
 * and when); docs/switch.md walks a packet through the pipeline. The controller's switch
 * driver (shadowgrad.controller.switch) writes every entry from the job spec and the layout.
 */
#include <core.p4>
#include <v1model.p4>

#include "include/types.p4"
#include "parser.p4"
#include "checksums.p4"
#include "ingress.p4"
#include "egress.p4"
#include "deparser.p4"

V1Switch(SgParser(), SgVerifyChecksum(), SgIngress(), SgEgress(), SgComputeChecksum(),
         SgDeparser()) main;
