/* shadowgrad.shadow._rxnative: the shadow's direct-run receive loop in C.
 *
 * Receiver._run_recv (shadow/_receiver.py) receives a run of DATA chunks, each straight into
 * where it goes in an iteration's box, checks that it is the chunk expected there and verifies
 * it in place (the GMAC over header and payload, or without DATA authentication the CRC-32C).
 * In Python that loop costs ~8 us of interpreter time per datagram. Runner.run does the same
 * loop for up to `max_count` chunks with the GIL released: one recvmsg per datagram into
 * [header, box bytes, trailer, overflow], the checks, the GMAC (OpenSSL's AES-256-GCM over
 * the header and the payload as associated data, no plaintext) or the CRC-32C (folded with
 * VPCLMULQDQ, or the SSE4.2 instruction, where the CPU has them), and returns to Python to
 * cover what verified.
 *
 * The wire format is not defined here: the header size, where its offset/layout/length fields
 * and its checksum lie, the MAC trailer's size come from shadowgrad.wire through the Runner's
 * constructor; tests/test_rxnative.py checks this loop against wire.encode's datagrams.
 *
 * One Runner is used by one thread at a time (the caller holds the receiver's rx lock).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* CRC-32C (Castagnoli), the values of the crc32c package: crc32c(data, value) continues value */

#define POLY 0x82f63b78u
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t crc_table[8][256];
static uint32_t crc_long[4][256];
static uint32_t crc_short[4][256];
static int have_sse42;
static int have_vpclmul; /* AVX-512 with VPCLMULQDQ: the carry-less-multiply fold below */
/* fold constants: {for the first 8 bytes of a 16-byte lane, for its last 8}, by distance */
static uint64_t fold_2048[2], fold_512[2], fold_128[2];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* the operator that appends len zero bytes (len a power of two) to a CRC */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = POLY;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* 2 zero bits */
    gf2_square(odd, even); /* 4 zero bits */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void zeros_table(uint32_t zeros[][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t crc_shift(uint32_t zeros[][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/* x^n mod P, P = x^32 + 0x1edc6f41 (the Castagnoli polynomial, not bit-reflected) */
static uint32_t xpow_mod(unsigned n) {
    uint32_t r = 1;
    while (n--)
        r = (r << 1) ^ (r & 0x80000000u ? 0x1edc6f41u : 0);
    return r;
}

static uint64_t reflect64(uint64_t v) {
    uint64_t r = 0;
    for (int i = 0; i < 64; i++, v >>= 1)
        r = (r << 1) | (v & 1);
    return r;
}

/* The constants that move a 16-byte lane `bits` further along the message. A lane loaded
   little-endian holds, in the bit-reflected order of this CRC, L(x) x^64 + H(x) (L: its first
   8 bytes); moved by `bits` it is L x^(64+bits) + H x^bits, which mod P is L k0 + H k1 with
   k0 = x^(64+bits) mod P, k1 = x^bits mod P, each of degree < 32. A carry-less multiply of two
   bit-reflected 64-bit words yields their product times x (its 127 bits sit in the low end of
   the 128), hence the constants' x^-1. */
static void fold_constants(uint64_t k[2], unsigned bits) {
    k[0] = reflect64(xpow_mod(64 + bits - 1));
    k[1] = reflect64(xpow_mod(bits - 1));
}

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ POLY : crc >> 1;
        crc_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            crc = crc_table[0][crc & 0xff] ^ (crc >> 8);
            crc_table[k][n] = crc;
        }
    }
    zeros_table(crc_long, LONG_BLOCK);
    zeros_table(crc_short, SHORT_BLOCK);
    fold_constants(fold_2048, 2048);
    fold_constants(fold_512, 512);
    fold_constants(fold_128, 128);
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") != 0;
    have_vpclmul = have_sse42 && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("vpclmulqdq");
#endif
}

/* slicing-by-8 (any CPU) */
static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
/* one step of the three interleaved streams: the CRC of 3 * block bytes at *pp continuing c0,
   the two later streams joined by the zeros operator of `block` bytes; *pp moves past them */
__attribute__((target("sse4.2"))) static inline uint64_t crc_3way(uint64_t c0,
                                                                  const unsigned char **pp,
                                                                  size_t block,
                                                                  uint32_t zeros[][256]) {
    const unsigned char *p = *pp;
    const unsigned char *end = p + block;
    uint64_t c1 = 0, c2 = 0;
    do {
        uint64_t a, b, c;
        memcpy(&a, p, 8);
        memcpy(&b, p + block, 8);
        memcpy(&c, p + 2 * block, 8);
        c0 = _mm_crc32_u64(c0, a);
        c1 = _mm_crc32_u64(c1, b);
        c2 = _mm_crc32_u64(c2, c);
        p += 8;
    } while (p < end);
    c0 = crc_shift(zeros, (uint32_t)c0) ^ c1;
    c0 = crc_shift(zeros, (uint32_t)c0) ^ c2;
    *pp = p + 2 * block;
    return c0;
}

/* three interleaved streams of the SSE4.2 crc32 instruction, joined by the zeros operators */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t len) {
    uint64_t c0 = ~crc & 0xffffffffu;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    for (; len >= 3 * LONG_BLOCK; len -= 3 * LONG_BLOCK)
        c0 = crc_3way(c0, &p, LONG_BLOCK, crc_long);
    for (; len >= 3 * SHORT_BLOCK; len -= 3 * SHORT_BLOCK)
        c0 = crc_3way(c0, &p, SHORT_BLOCK, crc_short);
    while (len >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
        p += 8;
        len -= 8;
    }
    while (len--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}
#endif

#if defined(__x86_64__)
#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))

FOLD_TARGET static inline __m512i fold512(__m512i acc, __m512i k, __m512i next) {
    /* acc's lanes moved by the constants' distance, xor next: (a ^ b ^ c) is 0x96 */
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                     _mm512_clmulepi64_epi128(acc, k, 0x11), next, 0x96);
}

FOLD_TARGET static inline __m128i fold128(__m128i acc, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00),
                                       _mm_clmulepi64_si128(acc, k, 0x11)),
                         next);
}

/* The CRC of len >= 256 bytes by folding: four 64-byte accumulators of four 16-byte lanes each
   move 256 bytes along the message per step (VPCLMULQDQ), are folded into one lane, and the
   crc32 instruction reduces that lane (16 bytes whose polynomial equals, mod P, what came
   before) and CRCs the last len % 64 bytes. The value to continue is xored into the first four
   bytes, as appending to it would do. */
FOLD_TARGET static uint32_t crc_fold(uint32_t crc, const unsigned char *p, size_t len) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_2048[1],
                                                                (long long)fold_2048[0]));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_512[1],
                                                               (long long)fold_512[0]));
    const __m128i k128 = _mm_set_epi64x((long long)fold_128[1], (long long)fold_128[0]);
    __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)p),
                                  _mm512_castsi128_si512(_mm_cvtsi32_si128((int)~crc)));
    __m512i a1 = _mm512_loadu_si512((const void *)(p + 64));
    __m512i a2 = _mm512_loadu_si512((const void *)(p + 128));
    __m512i a3 = _mm512_loadu_si512((const void *)(p + 192));
    p += 256;
    len -= 256;
    for (; len >= 256; p += 256, len -= 256) {
        a0 = fold512(a0, k2048, _mm512_loadu_si512((const void *)p));
        a1 = fold512(a1, k2048, _mm512_loadu_si512((const void *)(p + 64)));
        a2 = fold512(a2, k2048, _mm512_loadu_si512((const void *)(p + 128)));
        a3 = fold512(a3, k2048, _mm512_loadu_si512((const void *)(p + 192)));
    }
    a1 = fold512(a0, k512, a1);
    a2 = fold512(a1, k512, a2);
    a0 = fold512(a2, k512, a3);
    for (; len >= 64; p += 64, len -= 64)
        a0 = fold512(a0, k512, _mm512_loadu_si512((const void *)p));
    __m128i x = _mm512_extracti32x4_epi32(a0, 0);
    x = fold128(x, k128, _mm512_extracti32x4_epi32(a0, 1));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(a0, 2));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(a0, 3));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return crc_hw(~(uint32_t)c, p, len); /* the last len % 64 bytes, from that state */
}

/* the fold at any length (it needs 256 bytes; shorter goes to the crc32 instruction) */
static uint32_t crc_fold_any(uint32_t crc, const unsigned char *p, size_t len) {
    return len >= 256 ? crc_fold(crc, p, len) : crc_hw(crc, p, len);
}
#endif

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t len) {
#if defined(__x86_64__)
    if (have_vpclmul && len >= 256)
        return crc_fold(crc, p, len);
    if (have_sse42)
        return crc_hw(crc, p, len);
#endif
    return crc_sw(crc, p, len);
}

/* ------------------------------------------------------------------------------------------ */

static uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v = (v << 8) | p[k];
    return v;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

enum { ST_FLUSH = 0, ST_EMPTY = 1, ST_OTHER = 2, ST_ERROR = 3 };

#define MAX_HEADER 256
#define MAX_TRAILER 64

typedef struct {
    PyObject_HEAD EVP_CIPHER_CTX *ctx; /* the key's AES-256-GCM; NULL without a key */
    Py_ssize_t hsize, tail_at, csum_at, mac_size, nonce_size, max_datagram;
    unsigned char *over; /* what a longer datagram leaves after the trailer's place */
    int busy;
} Runner;

static void Runner_dealloc(Runner *self) {
    if (self->ctx)
        EVP_CIPHER_CTX_free(self->ctx);
    PyMem_Free(self->over);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Runner_init(Runner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key",      "header_size", "tail_at",      "checksum_at",
                             "mac_size", "nonce_size",  "max_datagram", NULL};
    Py_buffer key = {0};
    PyObject *key_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnnnnn", kwlist, &key_obj, &self->hsize,
                                     &self->tail_at, &self->csum_at, &self->mac_size,
                                     &self->nonce_size, &self->max_datagram))
        return -1;
    if (self->hsize <= 0 || self->hsize > MAX_HEADER || self->tail_at < 0 ||
        self->tail_at + 20 > self->csum_at || self->csum_at + 4 > self->hsize ||
        self->mac_size > MAX_TRAILER || self->nonce_size != 12 ||
        self->mac_size != self->nonce_size + 16 || self->max_datagram < self->hsize) {
        PyErr_SetString(PyExc_ValueError, "Runner: inconsistent header layout");
        return -1;
    }
    if (self->ctx) {
        EVP_CIPHER_CTX_free(self->ctx);
        self->ctx = NULL;
    }
    if (key_obj != Py_None) {
        if (PyObject_GetBuffer(key_obj, &key, PyBUF_SIMPLE) < 0)
            return -1;
        if (key.len != 32) {
            PyBuffer_Release(&key);
            PyErr_Format(PyExc_ValueError, "a MAC key is 32 bytes, got %zd", key.len);
            return -1;
        }
        self->ctx = EVP_CIPHER_CTX_new();
        int ok = self->ctx &&
                 EVP_EncryptInit_ex(self->ctx, EVP_aes_256_gcm(), NULL, key.buf, NULL) == 1;
        PyBuffer_Release(&key);
        if (!ok) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL: AES-256-GCM init failed");
            return -1;
        }
    }
    if (!self->over) {
        self->over = PyMem_Malloc((size_t)self->max_datagram + 1);
        if (!self->over) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* the GMAC under the runner's key of header + payload, against the trailer (nonce, tag) */
static int gmac_ok(EVP_CIPHER_CTX *ctx, const unsigned char *hdr, size_t hlen,
                   const unsigned char *payload, size_t plen, const unsigned char *trailer) {
    unsigned char tag[16], scratch[16];
    int outl;
    if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, trailer) != 1)
        return 0;
    if (EVP_EncryptUpdate(ctx, NULL, &outl, hdr, (int)hlen) != 1)
        return 0;
    if (plen && EVP_EncryptUpdate(ctx, NULL, &outl, payload, (int)plen) != 1)
        return 0;
    if (EVP_EncryptFinal_ex(ctx, scratch, &outl) != 1)
        return 0;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) != 1)
        return 0;
    return CRYPTO_memcmp(tag, trailer + 12, 16) == 0;
}

static int same_source(const struct sockaddr_storage *got, const struct sockaddr_storage *want) {
    if (got->ss_family != want->ss_family)
        return 0;
    if (got->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)got, *b = (const void *)want;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (got->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)got, *b = (const void *)want;
        return a->sin6_port == b->sin6_port &&
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(a->sin6_addr)) == 0;
    }
    return 0;
}

/* the source as Python's socket module gives it: (host, port) or (host, port, flow, scope) */
static PyObject *source_tuple(const struct sockaddr_storage *ss) {
    char host[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        return Py_BuildValue("(si)", host, ntohs(a->sin_port));
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        return Py_BuildValue("(siII)", host, ntohs(a->sin6_port), ntohl(a->sin6_flowinfo),
                             a->sin6_scope_id);
    }
    Py_RETURN_NONE;
}

static int parse_source(PyObject *src, struct sockaddr_storage *out) {
    const char *host;
    int port;
    memset(out, 0, sizeof(*out));
    if (!PyTuple_Check(src) || PyTuple_GET_SIZE(src) < 2) {
        PyErr_SetString(PyExc_TypeError, "src: a (host, port) tuple");
        return -1;
    }
    host = PyUnicode_AsUTF8(PyTuple_GET_ITEM(src, 0));
    if (!host)
        return -1;
    port = (int)PyLong_AsLong(PyTuple_GET_ITEM(src, 1));
    if (port == -1 && PyErr_Occurred())
        return -1;
    struct sockaddr_in *a = (void *)out;
    struct sockaddr_in6 *b = (void *)out;
    if (inet_pton(AF_INET, host, &a->sin_addr) == 1) {
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &b->sin6_addr) == 1) {
        b->sin6_family = AF_INET6;
        b->sin6_port = htons((uint16_t)port);
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "src: not a numeric address: %s", host);
    return -1;
}

PyDoc_STRVAR(
    Runner_run_doc,
    "run(fd, box, ls, end, seg_end, chunk, off, layout, prefix, src, max_count, scratch, sealed)\n"
    "--\n\n"
    "Receive up to max_count chunks of a run from the non-blocking socket fd, each into\n"
    "box[ls:ls + min(chunk, seg_end - ls)] while that ends at or before `end`: a chunk counts\n"
    "when its datagram is header + those bytes (+ the MAC trailer when sealed), from src, its\n"
    "header starts with `prefix` and carries (off, layout, size + trailer), and its GMAC (sealed)\n"
    "or CRC-32C verifies; a datagram of the right shape that fails the check counts as bad.\n"
    "Returns (status, ls, off, count, bad, got, src): status 0 when Python must cover what\n"
    "verified (max_count reached, the room ends); 1 when the socket is empty; 2 when another\n"
    "datagram came (gathered into scratch, `got` bytes from `src`; the box bytes it landed on\n"
    "are not covered); 3 on a socket error (errno in `got`).");

static PyObject *Runner_run(Runner *self, PyObject *args) {
    int fd, sealed;
    Py_buffer box = {0}, prefix = {0}, scratch = {0};
    Py_ssize_t ls, end, seg_end, chunk, max_count;
    unsigned long long off, layout;
    PyObject *src_obj;
    struct sockaddr_storage want, from;
    if (!PyArg_ParseTuple(args, "iw*nnnnKKy*Onw*p", &fd, &box, &ls, &end, &seg_end, &chunk,
                          &off, &layout, &prefix, &src_obj, &max_count, &scratch, &sealed))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t hsize = self->hsize;
    const Py_ssize_t mac = sealed ? self->mac_size : 0;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Runner.run: one thread at a time");
        goto done;
    }
    if (sealed && !self->ctx) {
        PyErr_SetString(PyExc_ValueError, "Runner.run: sealed without a key");
        goto done;
    }
    if (ls < 0 || end > box.len || seg_end > box.len || chunk <= 0 ||
        prefix.len > hsize || scratch.len < self->max_datagram + 1) {
        PyErr_SetString(PyExc_ValueError, "Runner.run: bounds outside the box or the scratch");
        goto done;
    }
    if (parse_source(src_obj, &want) < 0)
        goto done;
    self->busy = 1;

    unsigned char hdr[MAX_HEADER], trailer[MAX_TRAILER];
    unsigned char *base = box.buf;
    const unsigned char *pre = prefix.buf;
    const Py_ssize_t pre_len = prefix.len, tail_at = self->tail_at, csum_at = self->csum_at;
    const Py_ssize_t over_len = self->max_datagram + 1;
    Py_ssize_t count = 0, bad = 0, got = 0, size = 0;
    int status = ST_FLUSH, err = 0;

    Py_BEGIN_ALLOW_THREADS;
    for (;;) {
        size = seg_end - ls < chunk ? seg_end - ls : chunk;
        if (count >= max_count || size <= 0 || ls + size > end) {
            status = ST_FLUSH;
            break;
        }
        struct iovec iov[4];
        int n = 0;
        iov[n].iov_base = hdr;
        iov[n++].iov_len = (size_t)hsize;
        iov[n].iov_base = base + ls;
        iov[n++].iov_len = (size_t)size;
        if (mac) {
            iov[n].iov_base = trailer;
            iov[n++].iov_len = (size_t)mac;
        }
        iov[n].iov_base = self->over;
        iov[n++].iov_len = (size_t)over_len;
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_name = &from;
        msg.msg_namelen = sizeof(from);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        ssize_t r = recvmsg(fd, &msg, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                status = ST_EMPTY;
            } else {
                status = ST_ERROR;
                err = errno;
            }
            break;
        }
        got = r;
        if (r == hsize + size + mac && same_source(&from, &want) && memcmp(hdr, pre, pre_len) == 0 &&
            be64(hdr + tail_at) == off && be64(hdr + tail_at + 8) == layout &&
            be32(hdr + tail_at + 16) == (uint64_t)(size + mac)) {
            int ok;
            if (mac)
                ok = gmac_ok(self->ctx, hdr, (size_t)hsize, base + ls, (size_t)size, trailer);
            else
                ok = crc32c(crc32c(0, hdr, (size_t)csum_at), base + ls, (size_t)size) ==
                     be32(hdr + csum_at);
            if (ok) {
                ls += size;
                off += (unsigned long long)size;
                count++;
            } else {
                bad++;
            }
            continue;
        }
        status = ST_OTHER;
        break;
    }
    Py_END_ALLOW_THREADS;
    self->busy = 0;

    if (status == ST_OTHER) {
        /* gather the datagram as it came: header, the box bytes, trailer, overflow */
        unsigned char *out = scratch.buf;
        Py_ssize_t pos = 0, k;
        const unsigned char *parts[4] = {hdr, base + ls, trailer, self->over};
        Py_ssize_t lens[4] = {hsize, size, mac, over_len};
        for (int i = 0; i < 4 && pos < got; i++) {
            k = lens[i] < got - pos ? lens[i] : got - pos;
            memcpy(out + pos, parts[i], (size_t)k);
            pos += k;
        }
        PyObject *src = source_tuple(&from);
        if (!src)
            goto done;
        result = Py_BuildValue("(inKnnnN)", status, ls, off, count, bad, got, src);
    } else {
        result = Py_BuildValue("(inKnnnO)", status, ls, off, count, bad,
                               status == ST_ERROR ? (Py_ssize_t)err : (Py_ssize_t)0, Py_None);
    }
done:
    PyBuffer_Release(&box);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&scratch);
    return result;
}

static PyObject *Runner_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data = {0};
    unsigned int value = 0;
    const char *impl = "auto";
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|Is", &data, &value, &impl))
        return NULL;
    /* each implementation by name, so that the tests reach those this CPU does not pick */
    uint32_t (*fn)(uint32_t, const unsigned char *, size_t) = NULL;
    if (strcmp(impl, "auto") == 0)
        fn = crc32c;
    else if (strcmp(impl, "table") == 0)
        fn = crc_sw;
#if defined(__x86_64__)
    else if (strcmp(impl, "sse42") == 0 && have_sse42)
        fn = crc_hw;
    else if (strcmp(impl, "fold") == 0 && have_vpclmul)
        fn = crc_fold_any;
#endif
    if (fn == NULL) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "CRC-32C implementation %s is unknown or not on this CPU",
                     impl);
        return NULL;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS;
    crc = fn(value, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *Runner_crc32c_impls(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    if (have_vpclmul)
        return Py_BuildValue("(sss)", "table", "sse42", "fold");
    if (have_sse42)
        return Py_BuildValue("(ss)", "table", "sse42");
    return Py_BuildValue("(s)", "table");
}

PyDoc_STRVAR(Runner_verify_doc,
             "verify(header, payload, trailer): the loop's own GMAC check of header + payload\n"
             "against trailer (nonce, tag) under the runner's key, exposed for its tests.");

static PyObject *Runner_verify(Runner *self, PyObject *args) {
    Py_buffer h = {0}, p = {0}, t = {0};
    int ok = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*", &h, &p, &t))
        return NULL;
    if (!self->ctx || t.len != self->mac_size || self->busy) {
        PyErr_SetString(PyExc_ValueError, "verify: no key, a busy runner or a wrong trailer");
    } else {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS;
        ok = gmac_ok(self->ctx, h.buf, (size_t)h.len, p.buf, (size_t)p.len, t.buf);
        Py_END_ALLOW_THREADS;
        self->busy = 0;
    }
    PyBuffer_Release(&h);
    PyBuffer_Release(&p);
    PyBuffer_Release(&t);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(ok);
}

static PyMethodDef Runner_methods[] = {
    {"verify", (PyCFunction)Runner_verify, METH_VARARGS, Runner_verify_doc},
    {"run", (PyCFunction)Runner_run, METH_VARARGS, Runner_run_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shadowgrad.shadow._rxnative.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Runner(key, header_size, tail_at, checksum_at, mac_size, nonce_size, "
                        "max_datagram): a direct run's receive loop (key: the 32-byte MAC key "
                        "or None)"),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Runner_init,
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_methods = Runner_methods,
};

static PyMethodDef module_methods[] = {
    {"crc32c", Runner_crc32c, METH_VARARGS,
     "crc32c(data, value=0, impl='auto'): the CRC-32C of data continuing value (the crc32c "
     "package's values); the loop's own implementation, exposed for its tests, which name each "
     "of 'table', 'sse42' and 'fold' (those of crc32c_impls())"},
    {"crc32c_impls", Runner_crc32c_impls, METH_NOARGS,
     "crc32c_impls(): the CRC-32C implementations this CPU runs, the one 'auto' prefers last"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "shadowgrad.shadow._rxnative",
    "The shadow's direct-run receive loop in C (see Receiver._run_recv).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__rxnative(void) {
    crc_init();
    if (PyType_Ready(&RunnerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&RunnerType);
    if (PyModule_AddObject(m, "Runner", (PyObject *)&RunnerType) < 0) {
        Py_DECREF(&RunnerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "FLUSH", ST_FLUSH) < 0 ||
        PyModule_AddIntConstant(m, "EMPTY", ST_EMPTY) < 0 ||
        PyModule_AddIntConstant(m, "OTHER", ST_OTHER) < 0 ||
        PyModule_AddIntConstant(m, "ERROR", ST_ERROR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
