/* Our Huffman decoder for baseline JPEG scans, in place of libjpeg's.
 *
 * Why: in a region decode of an ImageNet-like photo (~110 KB, 500x375) libjpeg-turbo spends
 * about 60% of its instructions in entropy decoding, and with a restart interval (every
 * record `dlpack convert` writes has one) it always takes its slow, symbol-at-a-time path.
 * Everything after the entropy decoder (dequantize + IDCT, upsampling, colour conversion)
 * stays libjpeg's: we only hand it the same coefficient blocks faster, so the pixels are
 * libjpeg's to the bit.
 *
 * How: libjpeg calls its entropy module's decode_mcu once per MCU, in order, with zeroed
 * blocks to fill (NULL when skipping rows). After jpeg_start_decompress we point decode_mcu
 * at ours. Before that, one pass over the scan finds every restart interval (checking that
 * each RSTn marker is there, numbered in order, and that a marker ends the scan) and copies
 * the intervals' entropy-coded bytes, unstuffed (FF 00 -> FF, fill bytes dropped), into one
 * buffer with zeros after it; a scan that is not like that is left to libjpeg untouched.
 * Decoding reads that buffer at a bit position (the next 57+ bits are one unaligned load
 * away, so a code of <= 16 bits and its value of <= 15 always fit) and looks symbols up
 * FAST_BITS at a time: an AC code and its value bits that fit in FAST_BITS come out of one
 * lookup (run, value, length), and one load feeds five such symbols, each shifting the
 * loaded bits by what it used (the common symbol: a shift, a lookup, a store); the rest
 * (DC symbols, longer codes, ZRL, the end of a block) take a general path that loads again
 * and decodes as libjpeg does (libjpeg's canonical search for codes > FAST_BITS). Each
 * symbol waits for the one before it, so one reader runs at the latency of a lookup and a
 * shift per symbol; where every MCU is its own restart interval (what the packer writes)
 * two MCUs are decoded in turns, two independent chains the core overlaps, and the second
 * is kept for libjpeg's next call (benchmarks/huffman_decode.py: ~0.55x libjpeg's time for
 * the entropy decoding; a load per symbol was ~0.65x, one reader alone ~0.75x).
 *
 * Damaged data: where libjpeg would warn and conceal (a code that is no code, a run past the
 * block's end, an interval that needs more bits than it has), we stop, mark the scan refused
 * and raise libjpeg's error; the caller decodes the region again with libjpeg alone, which
 * does what it always did. Every read stays inside the buffer: an MCU reads at most
 * MCU_MAX_BYTES past where it started, the buffer has that many zeros after the data, and
 * the position is checked against the interval's end after every MCU.
 */
#include "_huffman.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>

/* libjpeg's entropy decoder module (jpegint.h; the same since libjpeg 6b): only its
   decode_mcu pointer is replaced. */
struct jpeg_entropy_decoder {
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    boolean insufficient_data;
};

int fast_scan_enabled = 1; /* read and written with __atomic_* (threads without the GIL) */
unsigned long fast_scan_taken, fast_scan_refusals;

#define FAST_BITS 11 /* 2.5% faster than 10; 12 (four fast symbols a load) slower */
#define EOB_RUN 0x80
/* an ac entry for bits whose code and value do not fit FAST_BITS: a run of 64, so the
   fast path's one test (the position after the run > 62) sends it to the general path */
#define NO_FIT (64 << 8)
/* How many fast symbols one load of the bits feeds: a load holds >= 57 bits from the
   position on, a fast symbol uses <= FAST_BITS of them and its lookup needs FAST_BITS, so
   the fifth still looks at loaded bits (57 - 4 * 11 >= 11; checked below). */
#define FAST_PER_LOAD 5
typedef char fast_per_load_fits_a_load[57 - (FAST_PER_LOAD - 1) * FAST_BITS >= FAST_BITS ? 1 : -1];
/* A block reads at most 64 symbols of <= 31 bits (a 16-bit code, 15 value bits); an MCU
   at most D_MAX_BLOCKS_IN_MCU blocks; + the 8 bytes a load reads. */
#define MCU_MAX_BYTES (D_MAX_BLOCKS_IN_MCU * 64 * 31 / 8 + 16)

typedef struct {
    /* codes of <= FAST_BITS bits, looked up by the next FAST_BITS bits: length << 8 |
       symbol; 0 where the code is longer */
    uint16_t sym_len[1 << FAST_BITS];
    /* AC tables: a code and its value bits within FAST_BITS: value << 16 | run << 8 |
       bits used (run EOB_RUN: end of block); NO_FIT where they do not fit, and for ZRL
       (its run may end the block, which the general path handles as libjpeg does) */
    int32_t ac[1 << FAST_BITS];
    /* libjpeg's canonical decode of the longer codes: maxcode[l] is the largest code of
       l bits (-1: none), a code c of l bits is symbol huffval[c + valoffset[l]] */
    int32_t maxcode[17], valoffset[17];
    uint8_t huffval[256];
    int nsyms;
} HuffLut;

/* zigzag position -> natural (row-major) position in the 8x8 block */
static const unsigned char NATURAL[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
    12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

struct FastScan {
    HuffLut dc[NUM_HUFF_TBLS], ac[NUM_HUFF_TBLS];
    const HuffLut *blk_dc[D_MAX_BLOCKS_IN_MCU], *blk_ac[D_MAX_BLOCKS_IN_MCU];
    int blk_comp[D_MAX_BLOCKS_IN_MCU], blocks;
    unsigned char *data; /* the intervals' unstuffed bytes, then MCU_MAX_BYTES zeros */
    size_t *seg;         /* interval i is data[seg[i] .. seg[i + 1]) */
    long ri, mcus, mcu;
    size_t pos;          /* bits of data read so far, in the current interval */
    size_t seg_end;      /* the current interval's end, in bytes */
    int last_dc[MAX_COMPS_IN_SCAN];
    JBLOCK own[D_MAX_BLOCKS_IN_MCU];   /* the blocks of an MCU libjpeg skips */
    JBLOCK ahead[D_MAX_BLOCKS_IN_MCU]; /* the next MCU's, decoded with this one */
    long ahead_mcu;      /* the MCU whose blocks are in ahead (-1: none) */
    int refused;
};

/* 1 and the table in *h when t is a table libjpeg accepts (jpeg_make_d_derived_tbl). */
static int build_lut(const JHUFF_TBL *t, int is_ac, HuffLut *h) {
    long code = 0;
    int p = 0, l, i;
    if (t == NULL) return 0;
    memset(h->sym_len, 0, sizeof(h->sym_len));
    for (i = 0; i < (1 << FAST_BITS); i++) h->ac[i] = NO_FIT;
    h->maxcode[0] = -1;
    for (l = 1; l <= 16; l++) {
        int n = t->bits[l];
        /* libjpeg refuses these tables too; checked before any entry is written, so the
           codes of length l all lie below 1 << l (the all-ones code is never one) */
        if (p + n > 256 || code + n >= (1L << l)) return 0;
        h->valoffset[l] = p - (int32_t)code;
        h->maxcode[l] = n ? (int32_t)(code + n - 1) : -1;
        for (i = 0; i < n; i++, p++, code++) {
            int sym = t->huffval[p];
            if (!is_ac && sym > 15) return 0;
            h->huffval[p] = (uint8_t)sym;
            if (l <= FAST_BITS) {
                int shift = FAST_BITS - l, j;
                long base = code << shift;
                for (j = 0; j < (1 << shift); j++)
                    h->sym_len[base + j] = (uint16_t)(l << 8 | sym);
                if (is_ac) {
                    int r = sym >> 4, s = sym & 15;
                    if (s == 0 && r != 15) { /* end of block (and the undefined r/0) */
                        int32_t e = EOB_RUN << 8 | l;
                        for (j = 0; j < (1 << shift); j++) h->ac[base + j] = e;
                    } else if (s > 0 && l + s <= FAST_BITS) {
                        int v, rest = FAST_BITS - l - s;
                        for (v = 0; v < (1 << s); v++) {
                            int value = v < (1 << (s - 1)) ? v - (1 << s) + 1 : v;
                            long at = ((code << s) | v) << rest;
                            int32_t e = (int32_t)((uint32_t)value << 16) | r << 8 | (l + s);
                            for (j = 0; j < (1 << rest); j++) h->ac[at + j] = e;
                        }
                    }
                }
            }
        }
        code <<= 1;
    }
    h->nsyms = p;
    return 1;
}

size_t scan_next_marker(const unsigned char *s, size_t p, size_t len) {
    for (;;) {
        const unsigned char *q = p < len ? memchr(s + p, 0xFF, len - p) : NULL;
        if (q == NULL) return len;
        p = (size_t)(q - s);
        while (p + 1 < len && s[p + 1] == 0xFF) p++;
        if (p + 1 >= len) return len;
        if (s[p + 1] != 0x00) return p;
        p += 2;
    }
}

/* Copy s[a..b) unstuffed to d; the bytes written. s[a..b) holds no marker (scan_next_marker). */
static size_t unstuff(const unsigned char *s, size_t a, size_t b, unsigned char *d) {
    size_t o = 0;
    while (a < b) {
        const unsigned char *q = memchr(s + a, 0xFF, b - a);
        size_t n = q ? (size_t)(q - s) - a : b - a;
        memcpy(d + o, s + a, n);
        o += n;
        a += n;
        if (q == NULL) break;
        if (a + 1 < b && s[a + 1] == 0x00) { /* a stuffed 0xFF */
            d[o++] = 0xFF;
            a += 2;
        } else { /* a fill byte: dropped */
            a++;
        }
    }
    return o;
}

/* A code longer than FAST_BITS at the top of q (libjpeg's jpeg_huff_decode from
   FAST_BITS + 1 bits on): length << 8 | symbol, as sym_len holds the short ones; 0 for bits
   that are no code. */
static uint32_t long_code(const HuffLut *h, uint64_t q) {
    int l;
    for (l = FAST_BITS + 1; l <= 16; l++) {
        int32_t c = (int32_t)(q >> (64 - l));
        if (c <= h->maxcode[l]) {
            int32_t at = c + h->valoffset[l];
            return at < 0 || at >= h->nsyms ? 0 : (uint32_t)(l << 8 | h->huffval[at]);
        }
    }
    return 0;
}

/* The next 57+ bits of data from bit position pos on, MSB first (one unaligned load). */
static inline uint64_t bits_at(const unsigned char *data, size_t pos) {
    uint64_t v;
    memcpy(&v, data + (pos >> 3), 8);
    return __builtin_bswap64(v) << (pos & 7);
}

/* The lookup of the symbol at the top of q_ in table h: c_ (length << 8 | symbol), s_ (its
   value's size), q_ at the value's bits, pos past code and value; st -1 and out of the
   enclosing do-while for bits that are no code. */
#define SYMBOL(h, pos, st)                                                               \
    c_ = (h)->sym_len[q_ >> (64 - FAST_BITS)];                                           \
    if (c_ == 0 && (c_ = long_code((h), q_)) == 0) {                                     \
        st = -1;                                                                         \
        break;                                                                           \
    }                                                                                    \
    s_ = (int)(c_ & 15);                                                                 \
    q_ <<= c_ >> 8;                                                                      \
    pos += (c_ >> 8) + (unsigned)s_

/* A lane is the reading of one MCU (or, in decode_one, of an interval's MCUs): the bit
 * position L##pos in data and L##q, the bits from there on (MSB first); the block L##b
 * being filled (L##blk, its AC table L##act) and its next zigzag position L##k; the DC
 * predictions `last` and the MCU's blocks `dst`; L##st 1 while reading, 0 when the MCU is
 * complete, -1 on bits libjpeg would conceal. Macros, so that each lane's state stays in
 * registers. */
#define LANE_LOAD(L) L##q = bits_at(fs->data, L##pos)

/* The DC symbol of block L##b (the next symbol at L##pos): the block's first coefficient. */
#define LANE_DC(L, last, dst)                                                            \
    do {                                                                                 \
        uint64_t q_ = bits_at(fs->data, L##pos);                                         \
        uint32_t c_;                                                                     \
        int s_, v_, *l_ = &(last)[fs->blk_comp[L##b]];                                   \
        L##blk = (dst)[L##b];                                                            \
        L##act = fs->blk_ac[L##b]->ac;                                                   \
        SYMBOL(fs->blk_dc[L##b], L##pos, L##st); /* a DC symbol: the difference's size */ \
        v_ = (int)((q_ >> (63 - s_)) >> 1);      /* 0 when s_ is 0 */                    \
        v_ -= ((v_ - ((1 << s_) >> 1)) >> 31) & ((1 << s_) - 1);                         \
        *l_ = (int)((unsigned)*l_ + (unsigned)v_); /* wraps as libjpeg's does */         \
        L##blk[0] = (JCOEF)*l_;                                                          \
        L##k = 1;                                                                        \
    } while (0)

/* Start lane L at block 0 of an MCU. */
#define LANE_BEGIN(L, last, dst)                                                         \
    do {                                                                                 \
        L##b = 0;                                                                        \
        L##st = 1;                                                                       \
        LANE_DC(L, last, dst);                                                           \
    } while (0)

/* The common AC symbol: code and value within FAST_BITS (one lookup in L##q, no new load)
   and the block goes on after it; anything else (a longer code, ZRL, the end of the
   block, the value at position 63, a run past the block) goes to the general path. */
#define LANE_FAST(L, general)                                                            \
    do {                                                                                 \
        int32_t e_ = L##act[L##q >> (64 - FAST_BITS)];                                   \
        int k_ = L##k + (e_ >> 8 & 0xFF);                                                \
        unsigned n_ = (unsigned)e_ & 0xFF;                                               \
        if (k_ > 62) goto general;                                                       \
        L##blk[NATURAL[k_]] = (JCOEF)(e_ >> 16);                                         \
        L##k = k_ + 1;                                                                   \
        L##q <<= n_;                                                                     \
        L##pos += n_;                                                                    \
    } while (0)

/* Any AC symbol of lane L, from L##pos; at the block's end the next block's DC, or the
   lane done (L##st 0). */
#define LANE_GENERAL(L, last, dst)                                                       \
    do {                                                                                 \
        uint64_t q_ = bits_at(fs->data, L##pos);                                         \
        uint32_t c_;                                                                     \
        int s_, v_;                                                                      \
        SYMBOL(fs->blk_ac[L##b], L##pos, L##st);                                         \
        L##k += (int)(c_ >> 4 & 15); /* the run of zeros before the value */             \
        if (s_) {                                                                        \
            if (L##k > 63) {                                                             \
                L##st = -1;                                                              \
                break;                                                                   \
            }                                                                            \
            v_ = (int)(q_ >> (64 - s_));                                                 \
            v_ -= ((v_ - (1 << (s_ - 1))) >> 31) & ((1 << s_) - 1);                      \
            L##blk[NATURAL[L##k]] = (JCOEF)v_;                                           \
            L##k++;                                                                      \
        } else if ((c_ & 0xF0) == 0xF0) {                                                \
            L##k++; /* 16 zeros: k moved 15, + 1 */                                      \
        } else {                                                                         \
            L##k = 64; /* end of block (and libjpeg's reading of the undefined r/0) */   \
        }                                                                                \
        if (L##k < 64) break;                                                            \
        if (++L##b == fs->blocks) {                                                      \
            L##st = 0;                                                                   \
            break;                                                                       \
        }                                                                                \
        LANE_DC(L, last, dst);                                                           \
    } while (0)

/* Read lane L to its end: FAST_PER_LOAD fast symbols per load of the bits, the general
   path where one is not. `general` names a label unique to the call. */
#define LANE_RUN(L, last, dst, general)                                                  \
    while (L##st > 0) {                                                                  \
        LANE_LOAD(L);                                                                    \
        for (int i_ = 0; i_ < FAST_PER_LOAD; i_++) /* unrolled by the compiler */       \
            LANE_FAST(L, general);                                                       \
        continue;                                                                        \
    general:                                                                             \
        LANE_GENERAL(L, last, dst);                                                      \
    }

/* The lane variables of L. */
#define LANE_VARS(L)                                                                     \
    size_t L##pos;                                                                       \
    uint64_t L##q = 0;                                                                   \
    int L##k = 0, L##b = 0, L##st = 1;                                                   \
    JCOEF *L##blk = NULL;                                                                \
    const int32_t *L##act = NULL

/* The blocks of the MCU libjpeg asked for, or (skipping rows: NULL) ours, zeroed */
static void mcu_blocks(const FastScan *fs, JBLOCKROW *MCU_data, JBLOCK *own, JCOEF **dst) {
    int b;
    if (MCU_data == NULL) memset(own, 0, (size_t)fs->blocks * sizeof(JBLOCK));
    for (b = 0; b < fs->blocks; b++) dst[b] = MCU_data ? MCU_data[b][0] : own[b];
}

/* Decode one MCU from fs->pos on; 0 on bits that libjpeg would conceal. */
static int decode_one(FastScan *fs, JCOEF **dst) {
    LANE_VARS(a_);
    a_pos = fs->pos;
    LANE_BEGIN(a_, fs->last_dc, dst);
    LANE_RUN(a_, fs->last_dc, dst, general_one);
    fs->pos = a_pos;
    return a_st == 0 && a_pos <= fs->seg_end * 8;
}

/* Decode MCUs i and i + 1, each its own restart interval, in turns: two independent chains
   of symbols, so the core works on one while the other waits for its table lookup. Where
   one lane leaves the fast path both start over from a new load (the other lane's bits
   are where it stopped). */
static int decode_two(FastScan *fs, long i, JCOEF **da, JCOEF **db) {
    int la[MAX_COMPS_IN_SCAN] = {0}, lb[MAX_COMPS_IN_SCAN] = {0};
    LANE_VARS(a_);
    LANE_VARS(b_);
    a_pos = fs->seg[i] * 8;
    b_pos = fs->seg[i + 1] * 8;
    LANE_BEGIN(a_, la, da);
    LANE_BEGIN(b_, lb, db);
    while (a_st > 0 && b_st > 0) {
        LANE_LOAD(a_);
        LANE_LOAD(b_);
        for (int i_ = 0; i_ < FAST_PER_LOAD; i_++) { /* unrolled by the compiler */
            LANE_FAST(a_, general_a);
            LANE_FAST(b_, general_b);
        }
        continue;
    general_a:
        LANE_GENERAL(a_, la, da);
        continue;
    general_b:
        LANE_GENERAL(b_, lb, db);
    }
    LANE_RUN(a_, la, da, general_a_alone);
    LANE_RUN(b_, lb, db, general_b_alone);
    return a_st == 0 && b_st == 0 && a_pos <= fs->seg[i + 1] * 8 && b_pos <= fs->seg[i + 2] * 8;
}

static boolean fast_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    FastScan *fs = (FastScan *)cinfo->client_data;
    JCOEF *dst[D_MAX_BLOCKS_IN_MCU], *ahead[D_MAX_BLOCKS_IN_MCU];
    int ok = fs->mcu < fs->mcus;
    if (ok && fs->mcu == fs->ahead_mcu) { /* decoded with the MCU before it */
        int b;
        if (MCU_data)
            for (b = 0; b < fs->blocks; b++) memcpy(MCU_data[b], fs->ahead[b], sizeof(JBLOCK));
    } else if (ok && fs->ri == 1 && fs->mcu + 1 < fs->mcus) {
        mcu_blocks(fs, MCU_data, fs->own, dst);
        mcu_blocks(fs, NULL, fs->ahead, ahead);
        ok = decode_two(fs, fs->mcu, dst, ahead);
        fs->ahead_mcu = fs->mcu + 1;
    } else if (ok) {
        if (fs->mcu % fs->ri == 0) { /* a new interval: its own bytes, DC predictions 0 */
            long i = fs->mcu / fs->ri;
            fs->pos = fs->seg[i] * 8;
            fs->seg_end = fs->seg[i + 1];
            memset(fs->last_dc, 0, sizeof(fs->last_dc));
        }
        mcu_blocks(fs, MCU_data, fs->own, dst);
        ok = decode_one(fs, dst);
    }
    fs->mcu++;
    if (!ok) {
        fs->refused = 1;
        __atomic_fetch_add(&fast_scan_refusals, 1, __ATOMIC_RELAXED);
        ERREXIT(cinfo, JERR_BAD_HUFF_TABLE); /* the caller decodes again, with libjpeg */
    }
    return TRUE;
}

FastScan *fast_scan_start(struct jpeg_decompress_struct *cinfo, const unsigned char *src,
                          size_t len) {
    FastScan *fs;
    size_t scan, p, o = 0;
    long total, ri, nseg, i;
    int b, used_dc = 0, used_ac = 0;
    if (!__atomic_load_n(&fast_scan_enabled, __ATOMIC_RELAXED) || cinfo->progressive_mode ||
        cinfo->arith_code ||
        cinfo->data_precision != 8 || cinfo->comps_in_scan != cinfo->num_components ||
        cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 || cinfo->Al != 0 ||
        cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU ||
        cinfo->entropy == NULL || cinfo->src == NULL || cinfo->client_data != NULL)
        return NULL;
    /* the scan's data starts where libjpeg stopped reading: right after the SOS segment */
    if (cinfo->src->next_input_byte < src || cinfo->src->next_input_byte > src + len)
        return NULL;
    scan = (size_t)(cinfo->src->next_input_byte - src);
    total = (long)cinfo->MCUs_per_row * (long)cinfo->MCU_rows_in_scan;
    ri = cinfo->restart_interval ? (long)cinfo->restart_interval : total;
    if (total < 1 || ri < 1) return NULL;
    nseg = (total + ri - 1) / ri;
    if ((size_t)nseg > (len - scan) / 2 + 1) return NULL; /* each interval ends in a marker */
    fs = (FastScan *)malloc(sizeof(FastScan));
    if (fs == NULL) return NULL;
    fs->seg = (size_t *)malloc(((size_t)nseg + 1) * sizeof(size_t));
    fs->data = (unsigned char *)malloc(len - scan + MCU_MAX_BYTES);
    if (fs->seg == NULL || fs->data == NULL) goto refuse;
    for (i = 0, p = scan; i < nseg; i++) {
        size_t m = scan_next_marker(src, p, len);
        int rst;
        if (m >= len) goto refuse; /* truncated: libjpeg's warning and grey */
        rst = src[m + 1] >= 0xD0 && src[m + 1] <= 0xD7;
        if (i < nseg - 1 ? !rst || src[m + 1] != 0xD0 + (i & 7) : rst) goto refuse;
        fs->seg[i] = o;
        o += unstuff(src, p, m, fs->data + o);
        p = m + 2;
    }
    fs->seg[nseg] = o;
    memset(fs->data + o, 0, MCU_MAX_BYTES);
    fs->blocks = cinfo->blocks_in_MCU;
    for (b = 0; b < fs->blocks; b++) {
        int ci = cinfo->MCU_membership[b], d, a;
        jpeg_component_info *comp;
        if (ci < 0 || ci >= cinfo->comps_in_scan) goto refuse;
        comp = cinfo->cur_comp_info[ci];
        d = comp->dc_tbl_no;
        a = comp->ac_tbl_no;
        if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS) goto refuse;
        if (!(used_dc & 1 << d) && !build_lut(cinfo->dc_huff_tbl_ptrs[d], 0, &fs->dc[d]))
            goto refuse;
        if (!(used_ac & 1 << a) && !build_lut(cinfo->ac_huff_tbl_ptrs[a], 1, &fs->ac[a]))
            goto refuse;
        used_dc |= 1 << d;
        used_ac |= 1 << a;
        fs->blk_dc[b] = &fs->dc[d];
        fs->blk_ac[b] = &fs->ac[a];
        fs->blk_comp[b] = ci;
    }
    fs->ri = ri;
    fs->mcus = total;
    fs->mcu = 0;
    fs->ahead_mcu = -1;
    fs->pos = 0;
    fs->seg_end = 0;
    fs->refused = 0;
    cinfo->client_data = fs;
    cinfo->entropy->decode_mcu = fast_decode_mcu;
    __atomic_fetch_add(&fast_scan_taken, 1, __ATOMIC_RELAXED);
    return fs;
refuse:
    fast_scan_free(fs);
    return NULL;
}

int fast_scan_refused(const FastScan *fs) { return fs != NULL && fs->refused; }

void fast_scan_free(FastScan *fs) {
    if (fs == NULL) return;
    free(fs->seg);
    free(fs->data);
    free(fs);
}
