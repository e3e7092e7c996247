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
   RIGHT_SHIFT arithmetic) are these formulas tabulated; computed in line instead, the
   loops vectorize. FIX(1.40200) = 91881, FIX(1.77200) = 116130, FIX(0.71414) = 46802,
   FIX(0.34414) = 22554, ONE_HALF = 32768. */
static int use_avx2;

const char *resize_isa(void); /* _resize.c: "avx2" unless the CPU lacks it or it is off */

int planes_magic(const unsigned char *s, size_t len) {
    return len >= 4 && memcmp(s, PLANES_MAGIC, 4) == 0;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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

/* Every loop below is plain integer arithmetic over contiguous arrays, so the compiler
   vectorizes it; ROWS_BODY is compiled twice, for any x86-64 and for AVX2 (chosen at run
   time as the resize is), and both give the same bits. Per output row:
     1. chroma rows: for 2:1 vertical sampling, "3 x the nearer row + the farther one" (the
        row above for an upper output row, below for a lower one; clamped at the image's
        first and last rows, which is libjpeg's edge replication);
     2. 2:1 horizontal: each chroma column c gives output columns 2c and 2c + 1, "3 x c +
        its left (right) neighbour" (clamped at the edges) with jdsample.c's rounding:
        h2v2 (x + 8) >> 4 left, (x + 7) >> 4 right; h2v1 (x + 1) >> 2, (x + 2) >> 2;
        h1v2: (x + 1) >> 2 above, (x + 2) >> 2 below;
     3. jdcolor.c's ycc_rgb_convert. */
#define ROWS_BODY                                                                          \
    long last = p->cwidth - 1, y, x, k, n;                                                 \
    long ca = x0 / 2, cb_ = (x0 + cols - 1) / 2;  /* chroma columns of a 2:1 row */        \
    int16_t *sums = (int16_t *)work;                                                       \
    uint8_t *up = (uint8_t *)(sums + cols / 2 + 8);          /* two upsampled rows */      \
    uint8_t *row_cb, *row_cr;                                                              \
    for (y = y0; y < y0 + rows; y++) {                                                     \
        const uint8_t *yrow = p->y + (size_t)y * p->width + x0;                           \
        uint8_t *d = out + (size_t)(y - y0) * cols * ps;                                  \
        long cy = y / p->vf, ny = cy;                                                      \
        int upper = (y % 2) == 0, plane;                                                   \
        if (p->comps == 1) { /* grey: R = G = B = Y, as libjpeg's gray -> RGB */           \
            for (x = 0; x < cols; x++) {                                                   \
                d[x * ps] = d[x * ps + 1] = d[x * ps + 2] = yrow[x];                      \
                if (ps == 4) d[x * ps + 3] = 255;                                          \
            }                                                                              \
            continue;                                                                      \
        }                                                                                  \
        if (p->vf == 2) {                                                                  \
            ny = upper ? cy - 1 : cy + 1;                                                  \
            if (ny < 0) ny = 0;                                                            \
            if (ny > p->cheight - 1) ny = p->cheight - 1;                                  \
        }                                                                                  \
        for (plane = 0; plane < 2; plane++) {                                              \
            const uint8_t *base = plane ? p->cr : p->cb;                                   \
            const uint8_t *row = base + (size_t)cy * p->cwidth;                            \
            const uint8_t *near = base + (size_t)ny * p->cwidth;                           \
            uint8_t *u = up + (size_t)plane * (cols + 2);                                  \
            if (p->hf == 1) {                                                              \
                if (p->vf == 1) {                                                          \
                    memcpy(u, row + x0, (size_t)cols);                                     \
                } else {                                                                   \
                    int bias = upper ? 1 : 2;                                              \
                    for (x = 0; x < cols; x++)                                             \
                        u[x] = (uint8_t)((3 * row[x0 + x] + near[x0 + x] + bias) >> 2);   \
                }                                                                          \
                continue;                                                                  \
            }                                                                              \
            /* sums[k]: chroma column ca - 1 + k, for k = 0 .. n + 1 (n = columns used) */ \
            n = cb_ - ca + 1;                                                              \
            {                                                                              \
                long c0 = ca - 1 < 0 ? 0 : ca - 1, c1 = cb_ + 1 > last ? last : cb_ + 1;  \
                int16_t *s = sums + (c0 - (ca - 1));                                       \
                if (p->vf == 2)                                                            \
                    for (k = 0; k <= c1 - c0; k++)                                         \
                        s[k] = (int16_t)(3 * row[c0 + k] + near[c0 + k]);                  \
                else                                                                       \
                    for (k = 0; k <= c1 - c0; k++)                                         \
                        s[k] = (int16_t)row[c0 + k];                                       \
                if (ca - 1 < 0) sums[0] = sums[1];                                         \
                if (cb_ + 1 > last) sums[n + 1] = sums[n];                                 \
            }                                                                              \
            if (p->vf == 2)                                                                \
                for (k = 0; k < n; k++) {                                                  \
                    u[2 * k] = (uint8_t)((3 * sums[k + 1] + sums[k] + 8) >> 4);            \
                    u[2 * k + 1] = (uint8_t)((3 * sums[k + 1] + sums[k + 2] + 7) >> 4);    \
                }                                                                          \
            else                                                                           \
                for (k = 0; k < n; k++) {                                                  \
                    u[2 * k] = (uint8_t)((3 * sums[k + 1] + sums[k] + 1) >> 2);            \
                    u[2 * k + 1] = (uint8_t)((3 * sums[k + 1] + sums[k + 2] + 2) >> 2);    \
                }                                                                          \
        }                                                                                  \
        row_cb = up + (p->hf == 2 ? (x0 & 1) : 0);                                         \
        row_cr = row_cb + cols + 2;                                                        \
        for (x = 0; x < cols; x++) {                                                       \
            int32_t luma = yrow[x], b = (int32_t)row_cb[x] - 128;                          \
            int32_t r = (int32_t)row_cr[x] - 128, v;                                       \
            v = luma + ((91881 * r + 32768) >> 16);                                        \
            d[x * ps] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);                          \
            v = luma + ((-22554 * b + 32768 - 46802 * r) >> 16);                           \
            d[x * ps + 1] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);                      \
            v = luma + ((116130 * b + 32768) >> 16);                                       \
            d[x * ps + 2] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);                      \
            if (ps == 4) d[x * ps + 3] = 255;                                              \
        }                                                                                  \
    }

#define ROWS_FUNC(NAME, PS, ATTR)                                                          \
    ATTR static void NAME(const PlanesInfo *p, long y0, long x0, long rows, long cols,     \
                          uint8_t *out, void *work) {                                      \
        const int ps = PS;                                                                 \
        ROWS_BODY                                                                          \
    }

ROWS_FUNC(rows3_plain, 3, )
ROWS_FUNC(rows4_plain, 4, )
#if defined(__x86_64__) && defined(__GNUC__)
ROWS_FUNC(rows3_avx2, 3, __attribute__((target("avx2"))))
ROWS_FUNC(rows4_avx2, 4, __attribute__((target("avx2"))))
#define HAVE_AVX2_ROWS 1
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
        if (ps == 4) rows4_avx2(p, y0, x0, rows, cols, out, work);
        else rows3_avx2(p, y0, x0, rows, cols, out, work);
        return;
    }
#endif
    if (ps == 4) rows4_plain(p, y0, x0, rows, cols, out, work);
    else rows3_plain(p, y0, x0, rows, cols, out, work);
}

size_t planes_work_bytes(long cols) {
    /* chroma sums (cols / 2 + 3 used) and two upsampled rows of cols + 1 (+ 1 spare) */
    return (size_t)(cols / 2 + 8) * sizeof(int16_t) + 2 * (size_t)(cols + 2);
}
