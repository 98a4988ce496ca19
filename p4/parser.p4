/* SgParser: Ethernet / IPv4 (no options, not a fragment) / UDP / the shadowgrad header on its
 * UDP port (SG_UDP_PORT). Anything else is accepted with the headers parsed so far and
 * forwarded as ordinary traffic. A shadowgrad header with a wrong magic is a parser error
 * (v1model: the packet still enters ingress, with parser_error set; ingress drops and counts
 * it). */
parser SgParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* not a fragment: MF clear (flags bit 0) and offset 0 (a first fragment's UDP
         * payload is cut short; only whole datagrams are parsed, so never tapped) */
        transition select(hdr.ipv4.protocol, hdr.ipv4.fragOffset, hdr.ipv4.ihl,
                          hdr.ipv4.flags[0:0]) {
            (IP_PROTO_UDP, 0, 5, 0): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            SG_UDP_PORT: parse_sg;
            default: accept;
        }
    }
    state parse_sg {
        packet.extract(hdr.sg);
        verify(hdr.sg.magic == SG_MAGIC, error.ParserInvalidArgument);
        transition accept;
    }
}
