/* Fast lossless restart-marker insertion for baseline JPEGs (part of dlpack_io.reader._jpeg).
 *
 * fast_restarts() rewrites the entropy-coded data of a Huffman sequential, 8-bit,
 * single-scan 3-component JPEG so that a restart marker follows every `interval` MCUs,
 * keeping every byte before the scan (a DRI segment is inserted right before SOS) and every
 * byte from the marker that ends the scan (EOI and anything after it), and the Huffman
 * tables. After a restart marker the DC predictors restart at 0, so the first block of each
 * component in an interval carries its DC value instead of the difference to the previous
 * block: only those DC codes are re-encoded; every other Huffman code (all AC codes, the
 * other DC differences) is copied bit for bit. The DCT coefficients, hence the decoded
 * pixels, are unchanged. Unlike a libjpeg transcode (decode all coefficients, write them
 * back with two Huffman passes) this reads each code once to find where blocks end and
 * moves the rest as bit strings: about the cost of the entropy decode alone.
 *
 * Returns 1 with a malloc'ed output, 0 when the file is not such a JPEG or already has a
 * restart interval, or its DC table lacks a code an absolute DC value needs (the caller
 * falls back to the libjpeg transcode), -1 on corrupt or truncated entropy data (the caller
 * lets libjpeg give the verdict). Runs without the GIL; reads only inside [src, src+len).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOOKAHEAD 9

typedef struct {
    /* decoding: (length << 8 | symbol) of the code in the next LOOKAHEAD bits, 0 = longer */
    uint16_t look[1 << LOOKAHEAD];
    int32_t maxcode[18];   /* largest code of each length, -1 if none */
    int32_t valoff[17];    /* symbol index of a length's first code minus that code */
    uint8_t vals[256];
    /* encoding: code and length of each symbol (length 0: no code) */
    uint16_t code[256];
    uint8_t size[256];
    int defined;
} Huff;

typedef struct {
    const uint8_t *u;      /* unstuffed entropy bytes, 8 zero bytes of padding after */
    size_t nbits;
    size_t pos;
} Bits;

typedef struct {
    uint8_t *out;
    size_t len, cap;
    uint64_t acc;
    int nacc;
} Writer;

static int build_huff(Huff *h, const uint8_t *bits, const uint8_t *vals, int nvals) {
    int len, i, k = 0;
    int32_t code = 0;
    memset(h, 0, sizeof(*h));
    memcpy(h->vals, vals, (size_t)nvals);
    for (len = 1; len <= 16; len++) {
        h->valoff[len] = k - code;
        for (i = 0; i < bits[len - 1]; i++, k++, code++) {
            uint8_t sym = vals[k];
            if (code >= (1 << len)) return 0; /* over-subscribed table */
            h->code[sym] = (uint16_t)code;
            h->size[sym] = (uint8_t)len;
            if (len <= LOOKAHEAD) {
                int shift = LOOKAHEAD - len, j;
                for (j = 0; j < (1 << shift); j++)
                    h->look[(code << shift) | j] = (uint16_t)(len << 8 | sym);
            }
        }
        h->maxcode[len] = bits[len - 1] ? code - 1 : -1;
        code <<= 1;
    }
    h->maxcode[17] = 0x7FFFFFFF;
    h->defined = 1;
    return 1;
}

static inline uint64_t peek64(const Bits *b) {
    const uint8_t *p = b->u + (b->pos >> 3);
    uint64_t v = ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
                 ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
                 ((uint64_t)p[6] << 8) | (uint64_t)p[7];
    return v << (b->pos & 7);
}

/* Next symbol; its code length goes to *len. -1 on an invalid code. */
static inline int decode_sym(const Bits *b, const Huff *h, int *len) {
    uint64_t v = peek64(b);
    uint16_t e = h->look[v >> (64 - LOOKAHEAD)];
    int l;
    if (e) {
        *len = e >> 8;
        return e & 0xFF;
    }
    for (l = LOOKAHEAD + 1; l <= 16; l++) {
        int32_t code = (int32_t)(v >> (64 - l));
        if (code <= h->maxcode[l]) {
            *len = l;
            return h->vals[h->valoff[l] + code];
        }
    }
    return -1;
}

static inline int put(Writer *w, uint32_t bits, int n) { /* n <= 32 */
    if (n == 0) return 1;
    w->acc = (w->acc << n) | (bits & ((n == 32) ? 0xFFFFFFFFu : ((1u << n) - 1)));
    w->nacc += n;
    if (w->nacc >= 32 && w->len + 8 <= w->cap) {
        uint32_t word = (uint32_t)(w->acc >> (w->nacc - 32));
        /* no 0xFF byte in the word (bit trick on the complement): 4 bytes at once */
        uint32_t inv = ~word;
        if (!((inv - 0x01010101u) & ~inv & 0x80808080u)) {
            w->out[w->len] = (uint8_t)(word >> 24);
            w->out[w->len + 1] = (uint8_t)(word >> 16);
            w->out[w->len + 2] = (uint8_t)(word >> 8);
            w->out[w->len + 3] = (uint8_t)word;
            w->len += 4;
            w->nacc -= 32;
        }
    }
    while (w->nacc >= 8) {
        uint8_t byte = (uint8_t)(w->acc >> (w->nacc - 8));
        if (w->len + 2 > w->cap) return 0;
        w->out[w->len++] = byte;
        if (byte == 0xFF) w->out[w->len++] = 0x00; /* byte stuffing */
        w->nacc -= 8;
    }
    return 1;
}

/* Copy input bits [from, to) to the output. */
static int copy_bits(Writer *w, const Bits *b, size_t from, size_t to) {
    Bits c = *b;
    c.pos = from;
    while (c.pos < to) {
        int n = to - c.pos < 32 ? (int)(to - c.pos) : 32;
        if (!put(w, (uint32_t)(peek64(&c) >> (64 - n)), n)) return 0;
        c.pos += (size_t)n;
    }
    return 1;
}

/* Pad with 1-bits to a byte boundary (as encoders do before a marker). */
static int pad(Writer *w) {
    return (w->nacc & 7) ? put(w, 0xFF, 8 - (w->nacc & 7)) : 1;
}

static int put_marker(Writer *w, uint8_t m) {
    if (w->len + 2 > w->cap) return 0;
    w->out[w->len++] = 0xFF;
    w->out[w->len++] = m;
    return 1;
}

typedef struct {
    int ncomp, h[3], v[3], dc[3], ac[3];
    long mcux, mcuy;
    size_t sos, scan;      /* offset of the SOS marker, of the first entropy byte */
    Huff dct[4], act[4];
} Frame;

/* Parse up to the first SOS; 1 when the file is one this transcoder handles. */
static int parse_frame(const uint8_t *s, size_t len, Frame *f) {
    size_t p = 2;
    int ci, hmax = 1, vmax = 1, nf = 0;
    long height = 0, width = 0;
    uint8_t ids[3] = {0, 0, 0};
    if (len < 4 || s[0] != 0xFF || s[1] != 0xD8) return 0;
    for (;;) {
        unsigned m;
        size_t seglen;
        const uint8_t *seg;
        while (p + 1 < len && s[p] == 0xFF && s[p + 1] == 0xFF) p++;
        if (p + 4 > len || s[p] != 0xFF) return 0;
        m = s[p + 1];
        seglen = ((size_t)s[p + 2] << 8) | s[p + 3];
        if (m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || seglen < 2 ||
            p + 2 + seglen > len)
            return 0;
        seg = s + p + 4;
        if (m == 0xC0 || m == 0xC1) {
            if (nf || seglen != 8 + 3 * 3 || seg[0] != 8 || seg[5] != 3) return 0;
            height = (seg[1] << 8) | seg[2];
            width = (seg[3] << 8) | seg[4];
            for (ci = 0; ci < 3; ci++) {
                ids[ci] = seg[6 + 3 * ci];
                f->h[ci] = seg[7 + 3 * ci] >> 4;
                f->v[ci] = seg[7 + 3 * ci] & 15;
                if (f->h[ci] < 1 || f->h[ci] > 4 || f->v[ci] < 1 || f->v[ci] > 4) return 0;
                if (f->h[ci] > hmax) hmax = f->h[ci];
                if (f->v[ci] > vmax) vmax = f->v[ci];
            }
            nf = 3;
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            return 0; /* progressive, lossless, arithmetic, hierarchical */
        } else if (m == 0xC4) {
            size_t q = 0, n = seglen - 2;
            while (q < n) {
                int tc, th, k, total = 0;
                if (q + 17 > n) return 0;
                tc = seg[q] >> 4;
                th = seg[q] & 15;
                for (k = 0; k < 16; k++) total += seg[q + 1 + k];
                if (tc > 1 || th > 3 || total > 256 || q + 17 + (size_t)total > n) return 0;
                if (!build_huff(tc ? &f->act[th] : &f->dct[th], seg + q + 1, seg + q + 17, total))
                    return 0;
                q += 17 + (size_t)total;
            }
        } else if (m == 0xDD) {
            if (seglen != 4 || seg[0] || seg[1]) return 0; /* has restarts: keep it */
        } else if (m == 0xDA) {
            if (!nf || seglen != 6 + 2 * 3 || seg[0] != 3) return 0;
            for (ci = 0; ci < 3; ci++) { /* scan order must be frame order */
                if (seg[1 + 2 * ci] != ids[ci]) return 0;
                f->dc[ci] = seg[2 + 2 * ci] >> 4;
                f->ac[ci] = seg[2 + 2 * ci] & 15;
                if (f->dc[ci] > 3 || f->ac[ci] > 3 || !f->dct[f->dc[ci]].defined ||
                    !f->act[f->ac[ci]].defined)
                    return 0;
            }
            if (seg[7] != 0 || seg[8] != 63 || seg[9] != 0) return 0;
            f->sos = p;
            f->scan = p + 2 + seglen;
            break;
        }
        p += 2 + seglen;
    }
    if (height < 1 || width < 1) return 0;
    f->ncomp = 3;
    f->mcux = (width + 8 * hmax - 1) / (8 * hmax);
    f->mcuy = (height + 8 * vmax - 1) / (8 * vmax);
    return 1;
}

/* Zero bytes after the unstuffed data: the scan is checked against its end after each
   block, and one block reads at most 64 codes of 16 + 15 bits plus an 8-byte peek. */
#define TAIL_PAD 512

/* Unstuff the entropy data from f->scan up to the next marker; *end = that marker. */
static uint8_t *unstuff(const uint8_t *s, size_t len, size_t start, size_t *n, size_t *end) {
    uint8_t *u = (uint8_t *)malloc(len - start + TAIL_PAD);
    size_t p = start, o = 0;
    if (u == NULL) return NULL;
    for (;;) {
        const uint8_t *q = p < len ? memchr(s + p, 0xFF, len - p) : NULL;
        size_t stop = q ? (size_t)(q - s) : len;
        memcpy(u + o, s + p, stop - p);
        o += stop - p;
        if (q == NULL || stop + 1 >= len) { *end = len; break; }
        if (s[stop + 1] == 0x00) { u[o++] = 0xFF; p = stop + 2; continue; }
        if (s[stop + 1] == 0xFF) { p = stop + 1; continue; } /* fill byte */
        *end = stop;
        break;
    }
    memset(u + o, 0, TAIL_PAD);
    *n = o;
    return u;
}

/* Skip one block's AC codes; 0 on corrupt data. */
static inline int skip_ac(Bits *b, const Huff *ac) {
    int k = 1, len;
    while (k < 64) {
        int rs = decode_sym(b, ac, &len);
        if (rs < 0) return 0;
        b->pos += (size_t)len + (rs & 15);
        if ((rs & 15) == 0) {
            if (rs != 0xF0) break; /* EOB */
            k += 16;
        } else {
            k += (rs >> 4) + 1;
        }
    }
    return k <= 64;
}

/* DC difference of the next block (moves past its code and bits); 0 on corrupt data. */
static inline int read_dc(Bits *b, const Huff *dc, int *diff) {
    int len, s = decode_sym(b, dc, &len);
    if (s < 0 || s > 11) return 0;
    b->pos += (size_t)len;
    if (s == 0) { *diff = 0; return 1; }
    {
        int bits = (int)(peek64(b) >> (64 - s));
        *diff = bits < (1 << (s - 1)) ? bits - (1 << s) + 1 : bits;
    }
    b->pos += (size_t)s;
    return 1;
}

/* Code the DC value `value` (a difference from 0); 0 when the table lacks the symbol. */
static inline int write_dc(Writer *w, const Huff *dc, int value) {
    int a = value < 0 ? -value : value, s = 0, bits;
    while (a) { s++; a >>= 1; }
    if (dc->size[s] == 0) return 0;
    bits = value < 0 ? value + (1 << s) - 1 : value;
    return put(w, dc->code[s], dc->size[s]) && put(w, (uint32_t)bits, s);
}

/* Rewrite every MCU; 1 done, 0 a DC table lacks a needed code, -1 corrupt, -2 no room. */
static int transcode_scan(const Frame *f, Bits *b, Writer *w, long interval) {
    long mcu, total = f->mcux * f->mcuy;
    int pred[3] = {0, 0, 0}, ci, k, diff;
    for (mcu = 0; mcu < total; mcu++) {
        int first = mcu % interval == 0;
        if (first && mcu > 0 &&
            (!pad(w) || !put_marker(w, (uint8_t)(0xD0 + ((mcu / interval - 1) & 7)))))
            return -2;
        for (ci = 0; ci < f->ncomp; ci++) {
            const Huff *dc = &f->dct[f->dc[ci]], *ac = &f->act[f->ac[ci]];
            size_t copy_from = b->pos;
            int value = 0;
            for (k = 0; k < f->h[ci] * f->v[ci]; k++) {
                if (!read_dc(b, dc, &diff)) return -1;
                pred[ci] += diff;
                if (k == 0 && first) { /* after a restart the predictor is 0 */
                    value = pred[ci];
                    copy_from = b->pos;
                }
                if (!skip_ac(b, ac) || b->pos > b->nbits) return -1;
            }
            if (first && !write_dc(w, dc, value)) return 0;
            if (!copy_bits(w, b, copy_from, b->pos)) return -2;
        }
    }
    return pad(w) ? 1 : -2;
}

int fast_restarts(const uint8_t *s, size_t len, long interval, uint8_t **out, size_t *out_len) {
    Frame *f = (Frame *)calloc(1, sizeof(Frame));
    Bits b;
    Writer w;
    uint8_t *u = NULL;
    size_t n = 0, end = 0, mcus;
    int rc = 0;
    *out = NULL;
    if (f == NULL) return 0;
    if (interval == 0 || !parse_frame(s, len, f)) goto done;
    if (interval < 0) { /* -k: the largest divisor of the MCU row that is <= k */
        interval = -interval < f->mcux ? -interval : f->mcux;
        while (f->mcux % interval) interval--;
    }
    if (f->mcux % interval) goto done;
    u = unstuff(s, len, f->scan, &n, &end);
    if (u == NULL) goto done;
    if (end >= len) { /* no marker ends the scan: truncated, let libjpeg say so */
        rc = -1;
        goto done;
    }
    b.u = u;
    b.nbits = n * 8;
    b.pos = 0;
    memset(&w, 0, sizeof(w));
    /* every block takes >= 2 input bits, so at most 4 n MCUs can be written whatever the
       header claims: the buffer stays linear in the input size */
    mcus = (size_t)f->mcux * (size_t)f->mcuy;
    if (mcus > 4 * n + 1) mcus = 4 * n + 1;
    w.cap = f->scan + 6 + 2 * (n + 16 * mcus) + (len - end) + 64;
    w.out = (uint8_t *)malloc(w.cap);
    if (w.out == NULL) goto done;
    memcpy(w.out, s, f->sos); /* everything before SOS, then DRI, then SOS itself */
    w.len = f->sos;
    w.out[w.len++] = 0xFF; w.out[w.len++] = 0xDD; w.out[w.len++] = 0; w.out[w.len++] = 4;
    w.out[w.len++] = (uint8_t)(interval >> 8); w.out[w.len++] = (uint8_t)interval;
    memcpy(w.out + w.len, s + f->sos, f->scan - f->sos);
    w.len += f->scan - f->sos;
    rc = transcode_scan(f, &b, &w, interval);
    if (rc == 1 && w.len + (len - end) <= w.cap) {
        memcpy(w.out + w.len, s + end, len - end); /* the ending marker and what follows */
        *out = w.out;
        *out_len = w.len + (len - end);
        w.out = NULL;
    } else if (rc == -2 || rc == 1) {
        rc = 0;
    }
    free(w.out);
done:
    free(u);
    free(f);
    return rc;
}
