/* SgDeparser: the valid headers in order, then the unparsed payload. */
control SgDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.sg);
    }
}
