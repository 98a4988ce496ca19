/* shadowgrad P4 software target: core declarations (written for this project).
 * Declares the P4_16 core library names the target understands; the semantics of the
 * externs are built into the target (see docs/p4target.md). */
#ifndef SHADOWGRAD_CORE_P4
#define SHADOWGRAD_CORE_P4
/* the include guard p4c's core.p4 defines; programs test it (#ifdef _CORE_P4_) */
#define _CORE_P4_

error {
    NoError,
    PacketTooShort,
    NoMatch,
    StackOutOfBounds,
    HeaderTooShort,
    ParserTimeout,
    ParserInvalidArgument
}

extern packet_in {
    void extract<T>(out T hdr);
    T lookahead<T>();
    void advance(in bit<32> sizeInBits);
    bit<32> length();
}

extern packet_out {
    void emit<T>(in T hdr);
}

extern void verify(in bool check, in error toSignal);

@noWarn("unused")
action NoAction() {}

match_kind {
    exact,
    ternary,
    lpm
}

#endif
