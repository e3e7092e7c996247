/* Decoded-planes records (`dlpack convert --mode planes`, record kind 3): the Y, Cb and Cr
 * planes of a JPEG as libjpeg(-turbo) leaves them after the IDCT, before chroma upsampling
 * and colour conversion. Reading one skips Huffman decoding and the IDCT; this file does
 * the rest exactly as libjpeg-turbo does for a whole-image decode (jdsample.c's "fancy"
 * triangle upsampling, jdcolor.c's fixed-point YCbCr -> RGB), so a box's pixels are
 * bit-identical to the same box of the decoded JPEG. The packer proves that per image
 * (it decodes the JPEG both ways and keeps the JPEG when they differ).
 *
 * Payload layout (THE spec is reader/format/spec.py, PLANES_HEADER; this mirrors it):
 *   16-byte header: magic "DLYP", version, components (1 or 3), h and v subsampling of
 *   the chroma planes (1 or 2 each), height and width (uint32 little-endian, the stored,
 *   not the upright, image); then the Y plane (height x width), then Cb and Cr
 *   (ceil(height / v) x ceil(width / h) each): version 1 their samples, rows back to back;
 *   version 2 (what the packer writes) each plane packed in 8x8 blocks (see "Packed
 *   planes" below), which a read unpacks only where its box lies.
 *
 * Nothing here allocates or touches the GIL; the caller guards reads of mapped memory. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_planes.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* jdcolor.c's YCbCr -> RGB tables (build_ycc_rgb_table: SCALEBITS 16, FIX(x) rounded,
   RIGHT_SHIFT arithmetic) are these formulas tabulated; convert() computes them in line,
   so the loops vectorize. FIX(1.40200) = 91881, FIX(1.77200) = 116130, FIX(0.71414) = 46802,
   FIX(0.34414) = 22554, ONE_HALF = 32768. */
static int use_avx2;

const char *resize_isa(void); /* _resize.c: "avx2" unless the CPU lacks it or it is off */

int planes_magic(const unsigned char *s, size_t len) {
    return len >= 4 && memcmp(s, PLANES_MAGIC, 4) == 0;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void planes_header_dims(const unsigned char *head, unsigned long *height,
                        unsigned long *width) {
    *height = le32(head + 8);
    *width = le32(head + 12);
}

#define ALWAYS_INLINE __attribute__((always_inline)) static inline

/* Blocks of one plane in a packed record: ceil(rows / 8) x ceil(cols / 8). */
static long blocks_of(long rows, long cols) {
    return ((rows + 7) / 8) * ((cols + 7) / 8);
}

/* Sum and largest value of n bytes (written plainly: -O3 vectorizes both). */
static unsigned long long sum_bytes(const unsigned char *b, long n, unsigned *largest) {
    unsigned long long sum = 0;
    unsigned top = 0;
    long k;
    for (k = 0; k < n; k++) {
        sum += b[k];
        top = b[k] > top ? b[k] : top;
    }
    *largest = top;
    return sum;
}

/* Sum of n bytes. */
static size_t sum_bytes_plain(const unsigned char *b, long n) {
    size_t sum = 0;
    long k;
    for (k = 0; k < n; k++) sum += b[k];
    return sum;
}

/* Fill p from the header of a payload of `len` bytes; NULL, or what is wrong. Every size
   is checked against the payload length (no product can overflow: sides <= 65535; a packed
   plane's blocks take 66 bytes at most each). */
const char *planes_parse(const unsigned char *s, size_t len, PlanesInfo *p) {
    unsigned long long need;
    memset(p, 0, sizeof(*p));
    if (len < PLANES_HEADER_SIZE || !planes_magic(s, len))
        return "not a planes record (no DLYP header)";
    if (s[4] != PLANES_PLAIN && s[4] != PLANES_PACKED)
        return "planes record of an unknown version";
    p->comps = s[5];
    p->hf = s[6];
    p->vf = s[7];
    p->height = (long)le32(s + 8);
    p->width = (long)le32(s + 12);
    if (p->comps != 1 && p->comps != 3)
        return "planes record with a component count other than 1 or 3";
    if (p->hf < 1 || p->hf > 2 || p->vf < 1 || p->vf > 2 || (p->comps == 1 && (p->hf | p->vf) != 1))
        return "planes record with unsupported chroma subsampling";
    if (p->height < 1 || p->width < 1 || p->height > PLANES_MAX_SIDE || p->width > PLANES_MAX_SIDE)
        return "planes record with an image side outside 1..65535";
    p->cheight = (p->height + p->vf - 1) / p->vf;
    p->cwidth = (p->width + p->hf - 1) / p->hf;
    p->ystride = p->width;
    p->cstride = p->cwidth;
    p->end = s + len;
    if (s[4] == PLANES_PACKED) {
        const unsigned char *at = s + PLANES_HEADER_SIZE;
        int c;
        p->packed = 1;
        for (c = 0; c < p->comps; c++) {
            long nb = c ? blocks_of(p->cheight, p->cwidth) : blocks_of(p->height, p->width);
            unsigned largest;
            unsigned long long bits;
            if ((size_t)(p->end - at) < 2 * (size_t)nb)
                return "packed planes record shorter than its block tables";
            bits = 8ULL * sum_bytes(at + nb, nb, &largest);
            if (largest > 8)
                return "packed planes record with a block width over 8 bits";
            if ((unsigned long long)(p->end - at) - 2ULL * (unsigned long long)nb < bits)
                return "packed planes record shorter than its blocks";
            p->mins[c] = at;
            p->widths[c] = at + nb;
            p->bits[c] = at + 2 * nb;
            at += 2 * nb + (size_t)bits;
        }
        if (at != p->end)
            return "planes record whose length does not match its header";
        return NULL;
    }
    need = PLANES_HEADER_SIZE + (unsigned long long)p->height * p->width;
    if (p->comps == 3)
        need += 2ULL * p->cheight * p->cwidth;
    if (need != len)
        return "planes record whose length does not match its header";
    p->y = s + PLANES_HEADER_SIZE;
    p->cb = p->y + (size_t)p->height * p->width;
    p->cr = p->cb + (size_t)p->cheight * p->cwidth;
    return NULL;
}

/* ---- Packed planes (version 2) ----------------------------------------------------------
   Each plane is cut into 8x8 blocks (the IDCT's own blocks for Y), in raster order, the
   last row and column of blocks cut short by the plane's edge. A block stores its smallest
   sample m and a width w (0..8): the fewest bits that hold (largest - m); then its 64
   values v = sample - m (0 beyond the plane's edge), row by row, w bits each, LSB first,
   so each row of 8 takes exactly w bytes and the block 8w. A sample is min(255, m + v).
   The three tables of a plane (minimums, widths, bits) follow each other. */

/* Rows of a block in portable C, 8 samples in one 64-bit word ("SIMD within a register"):
   a row's 8w bits spread to one value per byte in three halvings (4 + 4 values, 2 + 2,
   1 + 1), then each byte plus the block's minimum, saturated at 255. */
#define REPEAT8(b) (0x0101010101010101ULL * (b))
ALWAYS_INLINE void block_rows(const unsigned char *b, const int w, int m, unsigned char *d,
                              long stride) {
    const uint64_t m4 = (1ULL << (4 * w)) - 1, m2 = ((1ULL << (2 * w)) - 1) * 0x100000001ULL;
    const uint64_t m1 = ((1ULL << w) - 1) * 0x0001000100010001ULL, mm = REPEAT8((uint64_t)m);
    const uint64_t low7 = REPEAT8(0x7F), top = REPEAT8(0x80);
    int r, k;
    for (r = 0; r < 8; r++, b += w, d += stride) {
        uint64_t x = 0, sum, carry;
        for (k = 0; k < w; k++) x |= (uint64_t)b[k] << (8 * k);
        x = (x & m4) | (x >> (4 * w)) << 32;
        x = (x & m2) | ((x >> (2 * w)) & m2) << 16;
        x = (x & m1) | ((x >> w) & m1) << 8;
        sum = ((x & low7) + (mm & low7)) ^ ((x ^ mm) & top); /* bytewise, wrapping */
        carry = ((x & mm) | ((x | mm) & ~sum)) & top;        /* bytes that wrapped */
        sum |= (carry >> 7) * 0xFF;
        for (k = 0; k < 8; k++) d[k] = (unsigned char)(sum >> (8 * k));
    }
}

/* One block's 8 x 8 samples into d (rows `stride` apart), portable C: one copy of the
   loops per width, so every shift and mask is a constant. */
static void block_plain(const unsigned char *b, int w, int m, unsigned char *d, long stride) {
    switch (w) {
    case 0: block_rows(b, 0, m, d, stride); break;
    case 1: block_rows(b, 1, m, d, stride); break;
    case 2: block_rows(b, 2, m, d, stride); break;
    case 3: block_rows(b, 3, m, d, stride); break;
    case 4: block_rows(b, 4, m, d, stride); break;
    case 5: block_rows(b, 5, m, d, stride); break;
    case 6: block_rows(b, 6, m, d, stride); break;
    case 7: block_rows(b, 7, m, d, stride); break;
    default: block_rows(b, 8, m, d, stride); break; /* 8: planes_parse refuses wider */
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Per width w, for a pair of rows (the first in the low 128-bit half, the second, w bytes
   on, in the high half; both halves loaded from the first row's start): the two bytes that
   hold each value (pshufb control), and 2^(16 - w - its bit offset), which a 16-bit
   multiply turns into a left shift putting the value's top bit at bit 15; a right shift by
   16 - w then leaves the value alone. */
static int8_t block_shuffle[9][32];
static uint16_t block_scale[9][16];

static void block_tables(void) {
    int w, c, half;
    for (w = 0; w <= 8; w++)
        for (half = 0; half < 2; half++)
            for (c = 0; c < 8; c++) {
                int bit = c * w, byte = half * w + (bit >> 3);
                block_shuffle[w][16 * half + 2 * c] = (int8_t)byte;
                block_shuffle[w][16 * half + 2 * c + 1] = (int8_t)(byte + 1);
                block_scale[w][8 * half + c] = (uint16_t)(1u << (16 - w - (bit & 7)) & 0xFFFF);
            }
}

/* block_plain, four rows a step. Reads 16 bytes from the start of rows 0, 2, 4 and 6: up
   to 16 - 2w bytes past the block (the caller keeps that inside the payload). */
__attribute__((target("avx2"), always_inline)) static inline void block_avx2(
    const unsigned char *b, int w, int m, unsigned char *d, long stride) {
    const __m256i shuffle = _mm256_loadu_si256((const __m256i *)block_shuffle[w]);
    const __m256i scale = _mm256_loadu_si256((const __m256i *)block_scale[w]);
    const __m128i down = _mm_cvtsi32_si128(16 - w);
    const __m256i base = _mm256_set1_epi8((char)m);
    int r;
    for (r = 0; r < 8; r += 4) {
        __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + r * w)));
        __m256i y = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + (r + 2) * w)));
        __m128i lo, hi;
        x = _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(x, shuffle), scale), down);
        y = _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(y, shuffle), scale), down);
        /* per 128-bit half: [x's row, y's row]: rows r, r + 2 low, r + 1, r + 3 high */
        x = _mm256_adds_epu8(_mm256_packus_epi16(x, y), base); /* min(255, m + v) */
        lo = _mm256_castsi256_si128(x);
        hi = _mm256_extracti128_si256(x, 1);
        _mm_storel_epi64((__m128i *)(d + r * stride), lo);
        _mm_storel_epi64((__m128i *)(d + (r + 1) * stride), hi);
        /* the high halves through storel: _mm_storeh_pd would claim a double's alignment */
        _mm_storel_epi64((__m128i *)(d + (r + 2) * stride), _mm_unpackhi_epi64(lo, lo));
        _mm_storel_epi64((__m128i *)(d + (r + 3) * stride), _mm_unpackhi_epi64(hi, hi));
    }
}

/* n blocks of a row (bits from b, widths w, minimums mn) side by side into d; the last
   blocks, whose 16-byte reads would pass `end`, as block_plain. */
__attribute__((target("avx2"))) static void block_row_avx2(
    const unsigned char *b, const unsigned char *w, const unsigned char *mn, long n,
    unsigned char *d, long stride, const unsigned char *end) {
    long k;
    for (k = 0; k < n; k++) {
        /* a mapped record is rarely in cache: ask for the bytes ~7 blocks on (a hint, never
           a fault, so it may point past the payload) */
        _mm_prefetch((const char *)b + 384, _MM_HINT_T0);
        if (end - b >= 6 * w[k] + 16)
            block_avx2(b, w[k], mn[k], d + 8 * k, stride);
        else
            block_plain(b, w[k], mn[k], d + 8 * k, stride);
        b += 8 * w[k];
    }
}
#endif

static void block_row_plain(const unsigned char *b, const unsigned char *w,
                            const unsigned char *mn, long n, unsigned char *d, long stride) {
    long k;
    for (k = 0; k < n; k++) {
        block_plain(b, w[k], mn[k], d + 8 * k, stride);
        b += 8 * w[k];
    }
}

/* Blocks by0..by1-1 x bx0..bx1-1 of plane c (rows x cols samples) into d, rows `stride`
   apart. A block's bits start where the widths of the blocks before it end. */
static void unpack_blocks(const PlanesInfo *p, int c, long cols, long by0, long by1, long bx0,
                          long bx1, unsigned char *d, long stride) {
    const unsigned char *mins = p->mins[c], *widths = p->widths[c];
    long per_row = (cols + 7) / 8, by;
    size_t at = 8 * sum_bytes_plain(widths, by0 * per_row); /* block row by0's first bit */
    size_t o = at + 8 * sum_bytes_plain(widths + by0 * per_row, bx0), next;
    for (by = by0; by < by1; by++, o = next) {
        const unsigned char *w = widths + by * per_row, *mn = mins + by * per_row;
        unsigned char *row = d + (size_t)(by - by0) * 8 * (size_t)stride;
        /* where the next row's blocks start, fetched while this row unpacks: each block
           row of the window is a jump the hardware prefetcher does not foresee */
        at += 8 * sum_bytes_plain(w, per_row);
        next = at + 8 * sum_bytes_plain(w + per_row, by + 1 < by1 ? bx0 : 0);
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_prefetch(p->bits[c] + next);
        __builtin_prefetch(p->bits[c] + next + 64);
        if (use_avx2)
            block_row_avx2(p->bits[c] + o, w + bx0, mn + bx0, bx1 - bx0, row, stride, p->end);
        else
#endif
            block_row_plain(p->bits[c] + o, w + bx0, mn + bx0, bx1 - bx0, row, stride);
    }
}

/* Samples lo..hi (inclusive, clamped to 0..n-1) of a side of n: the blocks b0..b1-1. */
static void block_span(long lo, long hi, long n, long *b0, long *b1) {
    if (lo < 0) lo = 0;
    if (hi > n - 1) hi = n - 1;
    *b0 = lo / 8;
    *b1 = hi / 8 + 1;
}

size_t planes_window_bytes(long rows, long cols) {
    /* n samples touch at most n / 8 + 2 blocks; chroma adds a sample each side */
    size_t y = (size_t)(rows / 8 + 2) * (size_t)(cols / 8 + 2);
    size_t c = (size_t)((rows + 2) / 8 + 2) * (size_t)((cols + 2) / 8 + 2);
    return 64 * (y + 2 * c);
}

void planes_window(const PlanesInfo *p, long y0, long x0, long rows, long cols,
                   unsigned char *scratch, PlanesInfo *win) {
    long by0, by1, bx0, bx1;
    int c;
    *win = *p;
    win->packed = 0;
    block_span(y0, y0 + rows - 1, p->height, &by0, &by1);
    block_span(x0, x0 + cols - 1, p->width, &bx0, &bx1);
    win->oy = by0 * 8;
    win->ox = bx0 * 8;
    win->ystride = (bx1 - bx0) * 8;
    win->y = scratch;
    unpack_blocks(p, 0, p->width, by0, by1, bx0, bx1, scratch, win->ystride);
    scratch += (size_t)(by1 - by0) * 8 * (size_t)win->ystride;
    if (p->comps == 1)
        return;
    /* the chroma rows and columns rows_body reads: the neighbours of the first and last */
    block_span(y0 / p->vf - 1, (y0 + rows - 1) / p->vf + 1, p->cheight, &by0, &by1);
    block_span(x0 / p->hf - 1, (x0 + cols - 1) / p->hf + 1, p->cwidth, &bx0, &bx1);
    win->coy = by0 * 8;
    win->cox = bx0 * 8;
    win->cstride = (bx1 - bx0) * 8;
    for (c = 1; c < 3; c++) {
        unpack_blocks(p, c, p->cwidth, by0, by1, bx0, bx1, scratch, win->cstride);
        if (c == 1) win->cb = scratch; else win->cr = scratch;
        scratch += (size_t)(by1 - by0) * 8 * (size_t)win->cstride;
    }
}

size_t planes_packed_bound(long height, long width) {
    return 66 * (size_t)blocks_of(height, width);
}

size_t planes_pack(const unsigned char *plane, long height, long width, size_t stride,
                   unsigned char *out) {
    long per_row = (width + 7) / 8, nb = blocks_of(height, width), by, bx, r, c;
    unsigned char *mins = out, *widths = out + nb, *bits = out + 2 * nb;
    for (by = 0; by * 8 < height; by++)
        for (bx = 0; bx < per_row; bx++) {
            long rows = height - by * 8 < 8 ? height - by * 8 : 8;
            long cols = width - bx * 8 < 8 ? width - bx * 8 : 8;
            const unsigned char *at = plane + (size_t)by * 8 * stride + (size_t)bx * 8;
            int lo = 255, hi = 0, w = 0;
            for (r = 0; r < rows; r++)
                for (c = 0; c < cols; c++) {
                    int v = at[(size_t)r * stride + (size_t)c];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
            while ((1 << w) <= hi - lo) w++;
            mins[by * per_row + bx] = (unsigned char)lo;
            widths[by * per_row + bx] = (unsigned char)w;
            for (r = 0; r < 8; r++) {
                uint64_t acc = 0;
                for (c = 0; c < 8; c++)
                    if (r < rows && c < cols)
                        acc |= (uint64_t)(at[(size_t)r * stride + (size_t)c] - lo) << (c * w);
                for (c = 0; c < w; c++) *bits++ = (unsigned char)(acc >> (8 * c));
            }
        }
    return (size_t)(bits - out);
}

/* Per output row:
     1. chroma rows: for 2:1 vertical sampling, "3 x the nearer row + the farther one" (the
        row above for an upper output row, below for a lower one; clamped at the image's
        first and last rows, which is libjpeg's edge replication);
     2. 2:1 horizontal: each chroma column c gives output columns 2c and 2c + 1, "3 x c +
        its left (right) neighbour" (clamped at the edges) with jdsample.c's rounding:
        h2v2 (x + 8) >> 4 left, (x + 7) >> 4 right; h2v1 (x + 1) >> 2, (x + 2) >> 2;
        h1v2: (x + 1) >> 2 above, (x + 2) >> 2 below;
     3. jdcolor.c's ycc_rgb_convert.
   The row code is written once (rows_body) and built twice: for any x86-64, and for AVX2
   (chosen at run time as the resize is), where step 1's 2:1 sums and steps 2 and 3 of the
   RGBX output the resize reads run as explicit 16-lane kernels, each row's last step ending
   at its last pixel. Integer arithmetic: the same bits. */

/* Step 2 for n chroma columns: s[0 .. n + 1] are the column sums (h2v2) or samples (h2v1)
   of columns c - 1 .. c + n; u[0 .. 2n - 1] the upsampled row. */
ALWAYS_INLINE void up_h2(const int16_t *s, long n, int vf, long from, uint8_t *u) {
    long k;
    if (vf == 2)
        for (k = from; k < n; k++) {
            u[2 * k] = (uint8_t)((3 * s[k + 1] + s[k] + 8) >> 4);
            u[2 * k + 1] = (uint8_t)((3 * s[k + 1] + s[k + 2] + 7) >> 4);
        }
    else
        for (k = from; k < n; k++) {
            u[2 * k] = (uint8_t)((3 * s[k + 1] + s[k] + 1) >> 2);
            u[2 * k + 1] = (uint8_t)((3 * s[k + 1] + s[k + 2] + 2) >> 2);
        }
}

/* Step 3 for pixels from .. n - 1. */
ALWAYS_INLINE void convert(const uint8_t *yrow, const uint8_t *cb, const uint8_t *cr, long from,
                           long n, int ps, uint8_t *d) {
    long x;
    for (x = from; x < n; x++) {
        int32_t luma = yrow[x], b = (int32_t)cb[x] - 128, r = (int32_t)cr[x] - 128, v;
        v = luma + ((91881 * r + 32768) >> 16);
        d[x * ps] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        v = luma + ((-22554 * b + 32768 - 46802 * r) >> 16);
        d[x * ps + 1] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        v = luma + ((116130 * b + 32768) >> 16);
        d[x * ps + 2] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        if (ps == 4) d[x * ps + 3] = 255;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_ROWS 1

/* up_h2 for the 16 chroma columns from k (32 output samples). */
__attribute__((target("avx2"))) static inline void up_h2_16(const int16_t *s, long k, int vf,
                                                            uint8_t *u) {
    const __m256i bl = _mm256_set1_epi16(vf == 2 ? 8 : 1), br = _mm256_set1_epi16(vf == 2 ? 7 : 2);
    const __m128i shift = _mm_cvtsi32_si128(vf == 2 ? 4 : 2);
    __m256i left = _mm256_loadu_si256((const __m256i *)(s + k));
    __m256i here = _mm256_loadu_si256((const __m256i *)(s + k + 1));
    __m256i right = _mm256_loadu_si256((const __m256i *)(s + k + 2));
    __m256i three = _mm256_add_epi16(_mm256_add_epi16(here, here), here);
    __m256i even = _mm256_sra_epi16(_mm256_add_epi16(_mm256_add_epi16(three, left), bl), shift);
    __m256i odd = _mm256_sra_epi16(_mm256_add_epi16(_mm256_add_epi16(three, right), br), shift);
    /* per 128-bit lane: unpacklo = e0 o0 .. e3 o3, unpackhi = e4 o4 .. e7 o7 */
    __m256i lo = _mm256_unpacklo_epi16(even, odd), hi = _mm256_unpackhi_epi16(even, odd);
    _mm256_storeu_si256((__m256i *)(u + 2 * k), _mm256_packus_epi16(lo, hi));
}

/* up_h2, 16 chroma columns a step, the last step ending at n (columns done twice get the
   same bytes again): only rows under 16 chroma columns take the scalar code. */
__attribute__((target("avx2"))) static void up_h2_avx2(const int16_t *s, long n, int vf,
                                                        uint8_t *u) {
    long k = 0;
    if (n < 16) {
        up_h2(s, n, vf, 0, u);
        return;
    }
    for (; k + 16 <= n; k += 16)
        up_h2_16(s, k, vf, u);
    if (k < n)
        up_h2_16(s, n - 16, vf, u);
}

/* Step 1 for 2:1 vertical sampling, s[k] = 3 * at[k] + next[k], for the 16 k from k. */
__attribute__((target("avx2"))) static inline void sums_v2_16(const uint8_t *at,
                                                              const uint8_t *next, long k,
                                                              int16_t *s) {
    __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(at + k)));
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(next + k)));
    _mm256_storeu_si256((__m256i *)(s + k),
                        _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(a, a), a), b));
}

/* sums_v2_16 for k < n, the last step ending at n (as up_h2_avx2). */
__attribute__((target("avx2"))) static void sums_v2_avx2(const uint8_t *at, const uint8_t *next,
                                                          long n, int16_t *s) {
    long k = 0;
    if (n < 16) {
        for (; k < n; k++)
            s[k] = (int16_t)(3 * at[k] + next[k]);
        return;
    }
    for (; k + 16 <= n; k += 16)
        sums_v2_16(at, next, k, s);
    if (k < n)
        sums_v2_16(at, next, n - 16, s);
}

/* convert for 16 RGBX pixels from x, in 16-bit lanes. Each (k * x + 32768) >> 16 of
   convert() has a product past 16 bits, so a constant past 32767 is split as
   k = m * 65536 + k' (the m * x leaves the shift whole):
     R: 91881 = 65536 + 26345          -> x + hi(26345 x) + round bit
     B: 116130 = 2 * 65536 - 14942     -> 2x + hi(-14942 x) + round bit
   where hi() is mulhi (the product's floor / 65536) and the round bit is bit 15 of mullo
   (the low half of the product, + 32768 carrying into the high half exactly then);
     G: -46802 = -65536 + 18734        -> -r + (madd(b, r; -22554, 18734) + 32768) >> 16
   in 32-bit lanes (both products summed before the one shift, as convert() does). packus
   is the range limit. The same bits as convert(), for every triple (test_planes). */
__attribute__((target("avx2"))) static inline void convert16(const uint8_t *yrow,
                                                             const uint8_t *cb,
                                                             const uint8_t *cr, long x,
                                                             uint8_t *d) {
    const __m256i c128 = _mm256_set1_epi16(128), kr = _mm256_set1_epi16(26345);
    const __m256i kb = _mm256_set1_epi16(-14942), half = _mm256_set1_epi32(32768);
    const __m256i kg = _mm256_set1_epi32((int)((uint32_t)18734 << 16 | (uint16_t)-22554));
    const __m256i alpha = _mm256_set1_epi16(255);
    __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(yrow + x)));
    __m256i b = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(cb + x))), c128);
    __m256i r = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(cr + x))), c128);
    __m256i vr = _mm256_add_epi16(_mm256_add_epi16(y, r), _mm256_add_epi16(
                     _mm256_mulhi_epi16(r, kr), _mm256_srli_epi16(_mm256_mullo_epi16(r, kr), 15)));
    __m256i vb = _mm256_add_epi16(_mm256_add_epi16(y, _mm256_add_epi16(b, b)), _mm256_add_epi16(
                     _mm256_mulhi_epi16(b, kb), _mm256_srli_epi16(_mm256_mullo_epi16(b, kb), 15)));
    /* per 128-bit lane: unpacklo pairs pixels 0-3 (8-11), unpackhi 4-7 (12-15); packs
       puts each lane's four and four back in order */
    __m256i glo = _mm256_srai_epi32(_mm256_add_epi32(
                      _mm256_madd_epi16(_mm256_unpacklo_epi16(b, r), kg), half), 16);
    __m256i ghi = _mm256_srai_epi32(_mm256_add_epi32(
                      _mm256_madd_epi16(_mm256_unpackhi_epi16(b, r), kg), half), 16);
    __m256i vg = _mm256_add_epi16(_mm256_sub_epi16(y, r), _mm256_packs_epi32(glo, ghi));
    /* lanes: rb = R0-7 B0-7 | R8-15 B8-15, ga = G0-7 255s | G8-15 255s */
    __m256i rb = _mm256_packus_epi16(vr, vb), ga = _mm256_packus_epi16(vg, alpha);
    __m256i rg = _mm256_unpacklo_epi8(rb, ga), bx = _mm256_unpackhi_epi8(rb, ga);
    __m256i p0 = _mm256_unpacklo_epi16(rg, bx), p1 = _mm256_unpackhi_epi16(rg, bx);
    /* p0 = pixels 0-3 | 8-11, p1 = 4-7 | 12-15 */
    _mm256_storeu_si256((__m256i *)(d + 4 * x), _mm256_permute2x128_si256(p0, p1, 0x20));
    _mm256_storeu_si256((__m256i *)(d + 4 * x + 32), _mm256_permute2x128_si256(p0, p1, 0x31));
}

/* convert for RGBX: 16 pixels a step, the last step ending at n (pixels done twice get
   the same bytes again), so only rows under 16 pixels take the scalar code. */
__attribute__((target("avx2"))) static void convert4_avx2(const uint8_t *yrow, const uint8_t *cb,
                                                           const uint8_t *cr, long n, uint8_t *d) {
    long x = 0;
    if (n < 16) {
        convert(yrow, cb, cr, 0, n, 4, d);
        return;
    }
    for (; x + 16 <= n; x += 16)
        convert16(yrow, cb, cr, x, d);
    if (x < n)
        convert16(yrow, cb, cr, n - 16, d);
}
#endif

ALWAYS_INLINE void rows_body(const PlanesInfo *p, long y0, long x0, long rows, long cols,
                             int ps, uint8_t *out, void *work, int avx2) {
    long last = p->cwidth - 1, y, x, k;
    long ca = x0 / 2, cz = (x0 + cols - 1) / 2, n = cz - ca + 1; /* chroma columns, 2:1 */
    int16_t *sums = (int16_t *)work;
    uint8_t *up = (uint8_t *)(sums + cols / 2 + 8); /* two upsampled rows of cols + 2 */
    for (y = y0; y < y0 + rows; y++) {
        const uint8_t *yrow = p->y + (size_t)(y - p->oy) * (size_t)p->ystride + (x0 - p->ox);
        uint8_t *d = out + (size_t)(y - y0) * cols * ps, *ucb, *ucr;
        long cy = y / p->vf, ny = cy;
        int upper = (y % 2) == 0, plane;
        if (p->comps == 1) { /* grey: R = G = B = Y, as libjpeg's gray -> RGB */
            for (x = 0; x < cols; x++) {
                d[x * ps] = d[x * ps + 1] = d[x * ps + 2] = yrow[x];
                if (ps == 4) d[x * ps + 3] = 255;
            }
            continue;
        }
        if (p->vf == 2) {
            ny = upper ? cy - 1 : cy + 1;
            if (ny < 0) ny = 0;
            if (ny > p->cheight - 1) ny = p->cheight - 1;
        }
        for (plane = 0; plane < 2; plane++) {
            const uint8_t *base = plane ? p->cr : p->cb;
            /* chroma sample (row, column c) at row[c - p->cox] */
            const uint8_t *row = base + (size_t)(cy - p->coy) * (size_t)p->cstride;
            const uint8_t *near = base + (size_t)(ny - p->coy) * (size_t)p->cstride;
            uint8_t *u = up + (size_t)plane * (size_t)(cols + 2);
            if (p->hf == 1) {
                if (p->vf == 1) {
                    memcpy(u, row + (x0 - p->cox), (size_t)cols);
                } else {
                    int bias = upper ? 1 : 2;
                    for (x = 0; x < cols; x++)
                        u[x] = (uint8_t)((3 * row[x0 - p->cox + x] + near[x0 - p->cox + x] +
                                          bias) >> 2);
                }
                continue;
            }
            { /* sums[k]: chroma column ca - 1 + k, k = 0 .. n + 1, clamped at the edges */
                long c0 = ca - 1 < 0 ? 0 : ca - 1, c1 = cz + 1 > last ? last : cz + 1;
                int16_t *s = sums + (c0 - (ca - 1));
                const uint8_t *at = row + (c0 - p->cox), *next = near + (c0 - p->cox);
#ifdef HAVE_AVX2_ROWS
                if (avx2 && p->vf == 2)
                    sums_v2_avx2(at, next, c1 - c0 + 1, s);
                else
#endif
                if (p->vf == 2)
                    for (k = 0; k <= c1 - c0; k++)
                        s[k] = (int16_t)(3 * at[k] + next[k]);
                else
                    for (k = 0; k <= c1 - c0; k++)
                        s[k] = (int16_t)at[k];
                if (ca - 1 < 0) sums[0] = sums[1];
                if (cz + 1 > last) sums[n + 1] = sums[n];
            }
#ifdef HAVE_AVX2_ROWS
            if (avx2) {
                up_h2_avx2(sums, n, p->vf, u);
                continue;
            }
#endif
            up_h2(sums, n, p->vf, 0, u);
        }
        ucb = up + (p->hf == 2 ? (x0 & 1) : 0);
        ucr = ucb + cols + 2;
#ifdef HAVE_AVX2_ROWS
        if (avx2 && ps == 4) {
            convert4_avx2(yrow, ucb, ucr, cols, d);
            continue;
        }
#endif
        convert(yrow, ucb, ucr, 0, cols, ps, d);
    }
    (void)avx2;
}

static void rows_plain(const PlanesInfo *p, long y0, long x0, long rows, long cols, int ps,
                       uint8_t *out, void *work) {
    if (ps == 4) rows_body(p, y0, x0, rows, cols, 4, out, work, 0);
    else rows_body(p, y0, x0, rows, cols, 3, out, work, 0);
}

#ifdef HAVE_AVX2_ROWS
__attribute__((target("avx2"))) static void rows_avx2(const PlanesInfo *p, long y0, long x0,
                                                       long rows, long cols, int ps,
                                                       uint8_t *out, void *work) {
    if (ps == 4) rows_body(p, y0, x0, rows, cols, 4, out, work, 1);
    else rows_body(p, y0, x0, rows, cols, 3, out, work, 1);
}
#endif

void planes_init(void) {
#ifdef HAVE_AVX2_ROWS
    block_tables();
    use_avx2 = strcmp(resize_isa(), "avx2") == 0;
#endif
}

/* Rows y0..y0+rows-1, columns x0..x0+cols-1 of the stored image as RGB (ps 3) or RGBX
   (ps 4, X = 255) into out, rows cols * ps bytes apart. The box must lie inside the image
   (the caller checks); `work` holds planes_work_bytes(cols) bytes. */
void planes_rgb(const PlanesInfo *p, long y0, long x0, long rows, long cols, int ps,
                unsigned char *out, int *work) {
#ifdef HAVE_AVX2_ROWS
    if (use_avx2) {
        rows_avx2(p, y0, x0, rows, cols, ps, out, work);
        return;
    }
#endif
    rows_plain(p, y0, x0, rows, cols, ps, out, work);
}

size_t planes_work_bytes(long cols) {
    /* chroma sums (cols / 2 + 3 used) and two upsampled rows of cols + 1 (+ 1 spare) */
    return (size_t)(cols / 2 + 8) * sizeof(int16_t) + 2 * (size_t)(cols + 2);
}
