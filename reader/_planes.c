/* Decoded-planes records (`dlpack convert --mode planes`, record kind 3): the Y, Cb and Cr
 * planes of a JPEG as libjpeg(-turbo) leaves them after the IDCT, before chroma upsampling
 * and colour conversion. Reading one skips Huffman decoding and the IDCT; this file does
 * the rest exactly as libjpeg-turbo does for a whole-image decode (jdsample.c's "fancy"
 * triangle upsampling, jdcolor.c's fixed-point YCbCr -> RGB), so a box's pixels are
 * bit-identical to the same box of the decoded JPEG. The packer proves that per image
 * (it decodes the JPEG both ways and keeps the JPEG when they differ).
 *
 * Payload layout (THE spec is reader/format/spec.py, PLANES_HEADER; this mirrors it):
 *   16-byte header: magic "DLYP", version 1, components (1 or 3), h and v subsampling of
 *   the chroma planes (1 or 2 each), height and width (uint32 little-endian, the stored,
 *   not the upright, image); then the Y plane (height x width bytes), then Cb and Cr
 *   (ceil(height / v) x ceil(width / h) bytes each), rows back to back.
 *
 * Nothing here allocates or touches the GIL; the caller copies a mapped source first. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_planes.h"

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

/* Fill p from the header of a payload of `len` bytes; NULL, or what is wrong. Every size
   is checked against the payload length (no product can overflow: sides <= 65535). */
const char *planes_parse(const unsigned char *s, size_t len, PlanesInfo *p) {
    unsigned long long need;
    memset(p, 0, sizeof(*p));
    if (len < PLANES_HEADER_SIZE || !planes_magic(s, len))
        return "not a planes record (no DLYP header)";
    if (s[4] != PLANES_VERSION)
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
   (chosen at run time as the resize is), where steps 2 and 3 of the RGBX output the resize
   reads run as explicit 16- and 8-lane kernels. Integer arithmetic: the same bits. */
#define ALWAYS_INLINE __attribute__((always_inline)) static inline

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
#include <immintrin.h>
#define HAVE_AVX2_ROWS 1

/* up_h2, 16 chroma columns (32 output samples) a step. */
__attribute__((target("avx2"))) static void up_h2_avx2(const int16_t *s, long n, int vf,
                                                        uint8_t *u) {
    const __m256i bl = _mm256_set1_epi16(vf == 2 ? 8 : 1), br = _mm256_set1_epi16(vf == 2 ? 7 : 2);
    const __m128i shift = _mm_cvtsi32_si128(vf == 2 ? 4 : 2);
    long k = 0;
    for (; k + 16 <= n; k += 16) {
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
    up_h2(s, n, vf, k, u);
}

/* convert for RGBX, 8 pixels a step: one 32-bit lane per pixel. */
__attribute__((target("avx2"))) static void convert4_avx2(const uint8_t *yrow, const uint8_t *cb,
                                                           const uint8_t *cr, long n, uint8_t *d) {
    const __m256i c128 = _mm256_set1_epi32(128), half = _mm256_set1_epi32(32768);
    const __m256i kr = _mm256_set1_epi32(91881), kgb = _mm256_set1_epi32(-22554);
    const __m256i kgr = _mm256_set1_epi32(-46802), kb = _mm256_set1_epi32(116130);
    const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
    const __m256i alpha = _mm256_set1_epi32((int)0xFF000000u);
    long x = 0;
    for (; x + 8 <= n; x += 8) {
        __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(yrow + x)));
        __m256i b = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(cb + x))), c128);
        __m256i r = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(cr + x))), c128);
        __m256i vr = _mm256_add_epi32(y, _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(r, kr), half), 16));
        __m256i vg = _mm256_add_epi32(y, _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(
                         _mm256_mullo_epi32(b, kgb), half), _mm256_mullo_epi32(r, kgr)), 16));
        __m256i vb = _mm256_add_epi32(y, _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(b, kb), half), 16));
        vr = _mm256_min_epi32(_mm256_max_epi32(vr, zero), top);
        vg = _mm256_min_epi32(_mm256_max_epi32(vg, zero), top);
        vb = _mm256_min_epi32(_mm256_max_epi32(vb, zero), top);
        _mm256_storeu_si256((__m256i *)(d + 4 * x),
                            _mm256_or_si256(_mm256_or_si256(vr, _mm256_slli_epi32(vg, 8)),
                                            _mm256_or_si256(_mm256_slli_epi32(vb, 16), alpha)));
    }
    convert(yrow, cb, cr, x, n, 4, d);
}
#endif

ALWAYS_INLINE void rows_body(const PlanesInfo *p, long y0, long x0, long rows, long cols,
                             int ps, uint8_t *out, void *work, int avx2) {
    long last = p->cwidth - 1, y, x, k;
    long ca = x0 / 2, cz = (x0 + cols - 1) / 2, n = cz - ca + 1; /* chroma columns, 2:1 */
    int16_t *sums = (int16_t *)work;
    uint8_t *up = (uint8_t *)(sums + cols / 2 + 8); /* two upsampled rows of cols + 2 */
    for (y = y0; y < y0 + rows; y++) {
        const uint8_t *yrow = p->y + (size_t)y * p->width + x0;
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
            const uint8_t *row = base + (size_t)cy * p->cwidth;
            const uint8_t *near = base + (size_t)ny * p->cwidth;
            uint8_t *u = up + (size_t)plane * (size_t)(cols + 2);
            if (p->hf == 1) {
                if (p->vf == 1) {
                    memcpy(u, row + x0, (size_t)cols);
                } else {
                    int bias = upper ? 1 : 2;
                    for (x = 0; x < cols; x++)
                        u[x] = (uint8_t)((3 * row[x0 + x] + near[x0 + x] + bias) >> 2);
                }
                continue;
            }
            { /* sums[k]: chroma column ca - 1 + k, k = 0 .. n + 1, clamped at the edges */
                long c0 = ca - 1 < 0 ? 0 : ca - 1, c1 = cz + 1 > last ? last : cz + 1;
                int16_t *s = sums + (c0 - (ca - 1));
                if (p->vf == 2)
                    for (k = 0; k <= c1 - c0; k++)
                        s[k] = (int16_t)(3 * row[c0 + k] + near[c0 + k]);
                else
                    for (k = 0; k <= c1 - c0; k++)
                        s[k] = (int16_t)row[c0 + k];
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
