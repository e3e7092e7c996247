/* Antialiased bilinear resampling of a box of pixels (part of dlpack_io.reader._jpeg).
 *
 * resize_aa_bilinear() computes what Pillow's Image.resize(size, BILINEAR, box=...) computes
 * for an 8-bit RGB / RGBX image (the meaning torchvision's antialias=True gives PIL): the
 * same filter support (1 source pixel scaled by the reduction factor), the same double
 * coefficients normalised per output pixel, the same fixed-point weights (22 fractional
 * bits, rounded half away from zero), two passes each rounded and clipped to 8 bits, in
 * Pillow 13's order (rows first when the height shrinks by more than twice the width,
 * else columns first over just the rows the second pass reads). The result is
 * bit-identical to plain Pillow 13's; Pillow <= 12 always went columns first and
 * Pillow-SIMD rounds its 16-bit weights its own way: both differ from it by at most 2
 * grey levels in a few pixels (tests/reader/test_resize.py pins the figures).
 *
 * What it does not do that PIL did: no Image objects, no tobytes() copy, no separate
 * HWC->CHW copy. The vertical pass sums whole rows (a loop the compiler vectorises); the
 * last pass writes straight into the destination, as three CHW planes or as HWC RGB, with
 * horizontal and vertical flips folded into the store.
 *
 * With AVX2 (checked at run time; DLPACK_IO_NO_AVX2=1 forces the scalar code) both passes
 * run 8 channels per multiply, the integers unchanged.
 *
 * Pure C, no Python: the caller (py_resize in _jpeg.c) checks every size and the box,
 * releases the GIL and guards the reads against SIGBUS. resize_plan() allocates every
 * table and row (0, RESIZE_NO_MEMORY, or RESIZE_TOO_WIDE when the coefficient tables pass
 * Pillow's own limit, out * taps * 8 bytes > INT_MAX, which Pillow refuses with
 * MemoryError too), resize_run() only reads and writes pixels (the part under the SIGBUS
 * guard: a fault jumps out of it and leaks nothing), resize_free() frees the plan.
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22 /* 32 - 8 - 2, as Pillow */
#define RESIZE_NO_MEMORY (-1)
#define RESIZE_TOO_WIDE (-2)

typedef struct ResizePlan ResizePlan;

typedef struct {
    int ksize;       /* taps per output pixel (stride of kk) */
    int kmax;        /* the most taps any output pixel has (<= ksize; the rest weigh 0) */
    int *bounds;     /* per output pixel: first source index, number of taps */
    int32_t *kk;     /* fixed-point weights, ksize per output pixel */
} Taps;

static double bilinear(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis: `out` samples over
   [in0, in1) of an axis of `in_size` pixels. in0 and in1 are floats as Pillow's box is.
   Returns 0, RESIZE_NO_MEMORY, or RESIZE_TOO_WIDE (checked before allocating) when the
   tables pass Pillow's limit, out * taps * sizeof(double) > INT_MAX, as Pillow refuses. */
static int make_taps(int in_size, float in0, float in1, int out, Taps *t) {
    double scale, filterscale, support, center, ww, ss, lo, hi, *w;
    int xx, x, xmin, xmax;
    filterscale = scale = (double)(in1 - in0) / out;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = 1.0 * filterscale;
    if ((ceil(support) * 2 + 1) * sizeof(double) * out > (double)INT_MAX)
        return RESIZE_TOO_WIDE; /* also keeps ksize, bounds and every index below in int */
    t->ksize = (int)ceil(support) * 2 + 1;
    t->kmax = 0;
    t->bounds = malloc((size_t)out * 2 * sizeof(int));
    t->kk = malloc((size_t)out * t->ksize * sizeof(int32_t));
    w = malloc((size_t)t->ksize * sizeof(double));
    if (t->bounds == NULL || t->kk == NULL || w == NULL) {
        free(w);
        return RESIZE_NO_MEMORY;
    }
    ss = 1.0 / filterscale;
    for (xx = 0; xx < out; xx++) {
        int32_t *k = t->kk + (size_t)xx * t->ksize;
        center = in0 + (xx + 0.5) * scale;
        lo = center - support + 0.5; /* Pillow's (int) casts, clamped before converting */
        hi = center + support + 0.5;
        xmin = lo > 0.0 ? (int)lo : 0;
        xmax = hi < (double)in_size ? (int)hi : in_size;
        xmax = xmax > xmin ? xmax - xmin : 0;
        ww = 0.0;
        for (x = 0; x < xmax; x++) {
            w[x] = bilinear((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        for (x = 0; x < t->ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
            k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
                         : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
        }
        t->bounds[2 * xx] = xmin;
        t->bounds[2 * xx + 1] = xmax;
        if (xmax > t->kmax)
            t->kmax = xmax;
    }
    free(w);
    return 0;
}

static void free_taps(Taps *t) {
    free(t->bounds);
    free(t->kk);
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* ---- the two passes, one row at a time ---------------------------------------------------
 * Both produce RGBX rows (4 bytes a pixel, X undefined) from rows of ps-byte pixels; the
 * last pass's rows are then scattered into the destination (store_row). Scalar versions
 * here, AVX2 versions below (chosen at run time); they compute the same integers. */
#define HALF (1 << (PRECISION_BITS - 1))

/* Output pixel xx of a row's horizontal pass (its three channels) into d[0..2]. */
static inline void h_pixel(const uint8_t *s, int ps, const Taps *h, int xx, uint8_t *d) {
    const int32_t *k = h->kk + (size_t)xx * h->ksize;
    const uint8_t *p = s + (size_t)h->bounds[2 * xx] * ps;
    int n = h->bounds[2 * xx + 1], x;
    int32_t s0 = HALF, s1 = HALF, s2 = HALF;
    for (x = 0; x < n; x++, p += ps) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
    }
    d[0] = clip8(s0);
    d[1] = clip8(s1);
    d[2] = clip8(s2);
}

/* One row's horizontal pass: ow RGBX pixels from a row of ps-byte pixels. */
static void h_row(const uint8_t *s, int ps, const Taps *h, int ow, uint8_t *d) {
    int xx;
    for (xx = 0; xx < ow; xx++)
        h_pixel(s, ps, h, xx, d + 4 * (size_t)xx);
}

/* Output row yy's vertical pass over nbytes bytes of rows `stride` apart. */
static void v_row(const uint8_t *rows, size_t stride, const Taps *v, int yy, size_t nbytes,
                  uint8_t *d) {
    const int32_t *k = v->kk + (size_t)yy * v->ksize;
    const uint8_t *r = rows + (size_t)v->bounds[2 * yy] * stride;
    int n = v->bounds[2 * yy + 1], y;
    size_t i;
    for (i = 0; i < nbytes; i++) {
        int32_t acc = HALF;
        for (y = 0; y < n; y++)
            acc += r[(size_t)y * stride + i] * k[y];
        d[i] = clip8(acc);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* A pixel's 4 bytes (any alignment). */
static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* h_rows2_avx2's pairs of output pixels for ks taps, from the first until a pair whose last
   tap would pass the row; returns the first pixel it left. Inlined with a constant ks for
   the common counts, so their taps unroll. */
__attribute__((target("avx2"), always_inline)) static inline int h_pairs(
    const uint8_t *s0, const uint8_t *s1, int cols, const Taps *h, const int32_t *w8, int ow,
    uint8_t *d0, uint8_t *d1, const int ks) {
    const __m256i half = _mm256_set1_epi32(HALF);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int xx, t;
    for (xx = 0; xx + 1 < ow; xx += 2) {
        int a = h->bounds[2 * xx], b = h->bounds[2 * xx + 2];
        const int32_t *w = w8 + (size_t)(xx / 2) * ks * 8;
        const uint8_t *pa = s0 + 4 * (size_t)a, *pb = s0 + 4 * (size_t)b;
        const uint8_t *qa = s1 + 4 * (size_t)a, *qb = s1 + 4 * (size_t)b;
        __m256i acc0 = half, acc1 = half, px;
        if (b + ks > cols) /* bounds only grow: every later pair would too */
            break;
        for (t = 0; t < ks; t++) { /* pixel xx in the low 128-bit half, xx + 1 in the high */
            __m256i wk = _mm256_loadu_si256((const __m256i *)(w + 8 * t));
            __m256i x0 = _mm256_cvtepu8_epi32(
                _mm_insert_epi32(_mm_cvtsi32_si128(ld32(pa + 4 * t)), ld32(pb + 4 * t), 1));
            __m256i x1 = _mm256_cvtepu8_epi32(
                _mm_insert_epi32(_mm_cvtsi32_si128(ld32(qa + 4 * t)), ld32(qb + 4 * t), 1));
            acc0 = _mm256_add_epi32(acc0, _mm256_mullo_epi32(x0, wk));
            acc1 = _mm256_add_epi32(acc1, _mm256_mullo_epi32(x1, wk));
        }
        /* per half: row 0's pixel, row 1's -> bytes; then row 0's two pixels first */
        px = _mm256_packs_epi32(_mm256_srai_epi32(acc0, PRECISION_BITS),
                                _mm256_srai_epi32(acc1, PRECISION_BITS));
        px = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(px, px), order);
        _mm_storel_epi64((__m128i *)(d0 + 4 * (size_t)xx), _mm256_castsi256_si128(px));
        _mm_storel_epi64((__m128i *)(d1 + 4 * (size_t)xx),
                         _mm_unpackhi_epi64(_mm256_castsi256_si128(px),
                                            _mm256_castsi256_si128(px)));
    }
    return xx;
}

/* h_row for two RGBX rows sharing the taps, two output pixels at a time (h_pairs): one
   32-bit lane per channel of each pixel, so a tap is one multiply per row for both pixels
   and the sums need no reduction. Every pair runs kmax taps, the most any pixel of the row
   has (ksize, Pillow's table width, is about 2 more): those past a pixel's own count
   weigh 0 (make_taps). The pixels h_pairs leaves (near the row's end, an odd last
   one) go through h_pixel. w8: per pair of output pixels, per tap, k_xx[t] x4 then
   k_xx+1[t] x4 (pair_weights). */
__attribute__((target("avx2")))
static void h_rows2_avx2(const uint8_t *s0, const uint8_t *s1, int cols, const Taps *h,
                         const int32_t *w8, int ow, uint8_t *d0, uint8_t *d1) {
    int xx;
    switch (h->kmax) { /* the counts of 224-pixel crops of photos, unrolled */
    case 2: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, 2); break;
    case 3: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, 3); break;
    case 4: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, 4); break;
    case 5: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, 5); break;
    case 6: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, 6); break;
    default: xx = h_pairs(s0, s1, cols, h, w8, ow, d0, d1, h->kmax); break;
    }
    for (; xx < ow; xx++) {
        h_pixel(s0, 4, h, xx, d0 + 4 * (size_t)xx);
        h_pixel(s1, 4, h, xx, d1 + 4 * (size_t)xx);
    }
}

/* v_row with the sums in registers: 32 bytes at a time, then 8, the rest by the scalar
   loop. */
__attribute__((target("avx2")))
static void v_row_avx2(const uint8_t *rows, size_t stride, const Taps *v, int yy,
                       size_t nbytes, uint8_t *d) {
    const int32_t *k = v->kk + (size_t)yy * v->ksize;
    const uint8_t *r = rows + (size_t)v->bounds[2 * yy] * stride;
    int n = v->bounds[2 * yy + 1], y;
    size_t i;
    /* 32 bytes a step (4 sums of 8), each tap's weight broadcast once for the four */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (i = 0; i + 32 <= nbytes; i += 32) {
        __m256i a0 = _mm256_set1_epi32(HALF), a1 = a0, a2 = a0, a3 = a0, p01, p23;
        const uint8_t *s = r + i;
        for (y = 0; y < n; y++, s += stride) {
            __m256i wk = _mm256_set1_epi32(k[y]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                          _mm_loadl_epi64((const __m128i *)s)), wk));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                          _mm_loadl_epi64((const __m128i *)(s + 8))), wk));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                          _mm_loadl_epi64((const __m128i *)(s + 16))), wk));
            a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                          _mm_loadl_epi64((const __m128i *)(s + 24))), wk));
        }
        /* per 128-bit half: bytes 0-3 of each sum's lanes, then 4-7; put back in order */
        p01 = _mm256_packs_epi32(_mm256_srai_epi32(a0, PRECISION_BITS),
                                 _mm256_srai_epi32(a1, PRECISION_BITS));
        p23 = _mm256_packs_epi32(_mm256_srai_epi32(a2, PRECISION_BITS),
                                 _mm256_srai_epi32(a3, PRECISION_BITS));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_permutevar8x32_epi32(
                                                    _mm256_packus_epi16(p01, p23), order));
    }
    for (; i + 8 <= nbytes; i += 8) {
        __m256i acc = _mm256_set1_epi32(HALF);
        __m128i lo, hi, packed;
        for (y = 0; y < n; y++) {
            __m256i px = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(r + (size_t)y * stride + i)));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, _mm256_set1_epi32(k[y])));
        }
        acc = _mm256_srai_epi32(acc, PRECISION_BITS);
        lo = _mm256_castsi256_si128(acc);
        hi = _mm256_extracti128_si256(acc, 1);
        packed = _mm_packs_epi32(lo, hi);
        _mm_storel_epi64((__m128i *)(d + i), _mm_packus_epi16(packed, packed));
    }
    for (; i < nbytes; i++) {
        int32_t acc = HALF;
        for (y = 0; y < n; y++)
            acc += r[(size_t)y * stride + i] * k[y];
        d[i] = clip8(acc);
    }
}

/* The first ow - ow % 8 RGBX pixels of a row of ow -> three planes, in order or mirrored
   (flip), 8 pixels a step; returns how many it stored (store_row does the rest). */
__attribute__((target("avx2")))
static int split_row_avx2(const uint8_t *row, int ow, uint8_t *d0, uint8_t *d1, uint8_t *d2,
                          int flip) {
    const __m256i fwd = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i rev = _mm256_setr_epi8(12, 8, 4, 0, 13, 9, 5, 1, 14, 10, 6, 2, 15, 11, 7, 3,
                                         12, 8, 4, 0, 13, 9, 5, 1, 14, 10, 6, 2, 15, 11, 7, 3);
    const __m256i shuffle = flip ? rev : fwd;
    const __m256i order = flip ? _mm256_setr_epi32(4, 0, 5, 1, 6, 2, 7, 3)
                               : _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int x;
    for (x = 0; x + 8 <= ow; x += 8) {
        int t = flip ? ow - 8 - x : x;
        __m256i px = _mm256_loadu_si256((const __m256i *)(row + 4 * x));
        px = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(px, shuffle), order);
        _mm_storel_epi64((__m128i *)(d0 + t), _mm256_castsi256_si128(px));
        _mm_storel_epi64((__m128i *)(d1 + t), _mm_unpackhi_epi64(_mm256_castsi256_si128(px),
                                                                 _mm256_castsi256_si128(px)));
        _mm_storel_epi64((__m128i *)(d2 + t), _mm256_extracti128_si256(px, 1));
    }
    return x;
}

/* AVX2 present, and not switched off with DLPACK_IO_NO_AVX2 set to anything but "" or "0"
   (the tests of the scalar path). Read once; threads racing the first call store the same
   value. */
static int have_avx2(void) {
    static int known = -1;
    if (known < 0) {
        const char *off = getenv("DLPACK_IO_NO_AVX2");
        int switched_off = off != NULL && off[0] != '\0' && strcmp(off, "0") != 0;
        known = __builtin_cpu_supports("avx2") && !switched_off ? 1 : 0;
    }
    return known;
}
#endif

/* "avx2" or "scalar": the passes resize_run uses in this process. */
const char *resize_isa(void) {
#ifdef HAVE_AVX2_PATH
    return have_avx2() ? "avx2" : "scalar";
#else
    return "scalar";
#endif
}

/* Where the output goes: CHW planes or HWC RGB, flipped as asked. */
typedef struct {
    uint8_t *dst;
    int oh, ow, chw, flip_h, flip_v;
} Out;

/* Scatter a finished RGBX row (output row yy) into the destination. */
static void store_row(const Out *o, int yy, const uint8_t *row) {
    size_t oy = (size_t)(o->flip_v ? o->oh - 1 - yy : yy), plane = (size_t)o->oh * o->ow;
    int x = 0, ow = o->ow;
    if (o->chw) {
        uint8_t *d0 = o->dst + oy * ow, *d1 = d0 + plane, *d2 = d1 + plane;
#ifdef HAVE_AVX2_PATH
        if (have_avx2())
            x = split_row_avx2(row, ow, d0, d1, d2, o->flip_h);
#endif
        for (; x < ow; x++) {
            int t = o->flip_h ? ow - 1 - x : x;
            d0[t] = row[4 * x];
            d1[t] = row[4 * x + 1];
            d2[t] = row[4 * x + 2];
        }
    } else {
        uint8_t *d = o->dst + oy * ow * 3;
        for (; x < ow; x++) {
            int t = o->flip_h ? ow - 1 - x : x;
            d[3 * t] = row[4 * x];
            d[3 * t + 1] = row[4 * x + 1];
            d[3 * t + 2] = row[4 * x + 2];
        }
    }
}

/* The two passes with the vectorised versions where they apply. */
typedef struct {
    const Taps *h, *v;
    int32_t *w8; /* AVX2 pair weights of h, or NULL: scalar horizontal pass */
    int vec;     /* AVX2 vertical pass */
} Passes;

/* The horizontal pass of rows s0 and s1 (the same row twice is fine) into d0 and d1. */
static void pass_h2(const Passes *P, const uint8_t *s0, const uint8_t *s1, int ps, int cols,
                    int ow, uint8_t *d0, uint8_t *d1) {
#ifdef HAVE_AVX2_PATH
    if (P->w8 != NULL && ps == 4) {
        h_rows2_avx2(s0, s1, cols, P->h, P->w8, ow, d0, d1);
        return;
    }
#endif
    h_row(s0, ps, P->h, ow, d0);
    if (s1 != s0)
        h_row(s1, ps, P->h, ow, d1);
}

static void pass_v(const Passes *P, const uint8_t *rows, size_t stride, int yy, size_t nbytes,
                   uint8_t *d) {
#ifdef HAVE_AVX2_PATH
    if (P->vec) {
        v_row_avx2(rows, stride, P->v, yy, nbytes, d);
        return;
    }
#endif
    v_row(rows, stride, P->v, yy, nbytes, d);
}

/* Pillow 13's order: rows first when the height shrinks by more than twice what the width
   does, so the horizontal pass has fewer rows (what Pillow <= 12 always did: columns first). */
static int columns_first(int rows, int cols, int oh, int ow) {
    return !(rows - oh > 0 && rows - oh > (cols - ow) * 2);
}

/* Columns first over the rows the vertical pass reads (tmp: their RGBX rows), then rows. */
static void columns_then_rows(const uint8_t *src, size_t stride, int ps, int cols,
                              const Passes *P, Taps *v, const Out *o, uint8_t *tmp,
                              uint8_t *line) {
    int first = v->bounds[0], y, yy;
    int last = v->bounds[2 * o->oh - 2] + v->bounds[2 * o->oh - 1];
    size_t row = (size_t)o->ow * 4;
    for (y = first; y < last; y += 2) {
        int y1 = y + 1 < last ? y + 1 : y; /* an odd last row: computed twice, same bytes */
        pass_h2(P, src + (size_t)y * stride, src + (size_t)y1 * stride, ps, cols, o->ow,
                tmp + (size_t)(y - first) * row, tmp + (size_t)(y1 - first) * row);
    }
    for (yy = 0; yy < o->oh; yy++) {
        v->bounds[2 * yy] -= first; /* rows of tmp, not of the source */
        pass_v(P, tmp, row, yy, row, line);
        store_row(o, yy, line);
    }
}

/* Rows first, two output rows at a time (tmp: two rows of cols ps-byte pixels; line: two
   RGBX rows), then columns. */
static void rows_then_columns(const uint8_t *src, size_t stride, int ps, int cols,
                              const Passes *P, const Out *o, uint8_t *tmp, uint8_t *line) {
    size_t nbytes = (size_t)cols * ps, row = (size_t)o->ow * 4;
    int yy;
    for (yy = 0; yy < o->oh; yy += 2) {
        int two = yy + 1 < o->oh;
        pass_v(P, src, stride, yy, nbytes, tmp);
        if (two)
            pass_v(P, src, stride, yy + 1, nbytes, tmp + nbytes);
        pass_h2(P, tmp, two ? tmp + nbytes : tmp, ps, cols, o->ow, line, line + row);
        store_row(o, yy, line);
        if (two)
            store_row(o, yy + 1, line + row);
    }
}

/* AVX2 weights of the horizontal taps (see h_rows2_avx2): kmax per output pixel, or NULL. */
static int32_t *pair_weights(const Taps *h, int ow) {
    int pairs = (ow + 1) / 2, j, t, c, n = h->kmax;
    int32_t *w8 = malloc((size_t)pairs * (n > 0 ? n : 1) * 8 * sizeof(int32_t));
    if (w8 == NULL)
        return NULL;
    for (j = 0; j < pairs; j++)
        for (t = 0; t < n; t++)
            for (c = 0; c < 8; c++) {
                int xx = 2 * j + c / 4;
                w8[((size_t)j * n + t) * 8 + c] = xx < ow ? h->kk[(size_t)xx * h->ksize + t] : 0;
            }
    return w8;
}

/* Everything one resize allocates: made before the guarded read (resize_plan), so a bus
   error that siglongjmps out of the passes (resize_run) leaves nothing unfreed: the caller
   calls resize_free after the guard either way. */
struct ResizePlan {
    Taps h, v;
    Passes P;
    uint8_t *tmp, *line;
    int ps, cols, oh, ow, by_columns;
};

void resize_free(ResizePlan *p) {
    if (p == NULL)
        return;
    free(p->line);
    free(p->tmp);
    free(p->P.w8);
    free_taps(&p->h);
    free_taps(&p->v);
    free(p);
}

int resize_plan(ResizePlan **out, int ps, int rows, int cols, const float box[4], int oh,
                int ow) {
    ResizePlan *p = calloc(1, sizeof(ResizePlan));
    int status;
    size_t tmp_bytes;
    *out = NULL;
    if (p == NULL)
        return RESIZE_NO_MEMORY;
    p->P.h = &p->h;
    p->P.v = &p->v;
    p->ps = ps, p->cols = cols, p->oh = oh, p->ow = ow;
    p->by_columns = columns_first(rows, cols, oh, ow);
    if ((status = make_taps(rows, box[1], box[3], oh, &p->v)) != 0 ||
        (status = make_taps(cols, box[0], box[2], ow, &p->h)) != 0)
        goto fail;
    status = RESIZE_NO_MEMORY;
#ifdef HAVE_AVX2_PATH
    if (have_avx2()) {
        p->P.vec = 1;
        if (ps == 4 && (p->P.w8 = pair_weights(&p->h, ow)) == NULL)
            goto fail;
    }
#endif
    tmp_bytes = p->by_columns
        ? (size_t)(p->v.bounds[2 * oh - 2] + p->v.bounds[2 * oh - 1] - p->v.bounds[0]) * ow * 4
        : (size_t)cols * ps * 2;
    p->tmp = malloc(tmp_bytes > 0 ? tmp_bytes : 1);
    p->line = malloc((size_t)ow * 8);
    if (p->tmp == NULL || p->line == NULL)
        goto fail;
    *out = p;
    return 0;
fail:
    resize_free(p);
    return status;
}

void resize_run(ResizePlan *p, const uint8_t *src, size_t stride, uint8_t *dst, int chw,
                int flip_h, int flip_v) {
    Out o = {dst, p->oh, p->ow, chw, flip_h, flip_v};
    if (p->by_columns)
        columns_then_rows(src, stride, p->ps, p->cols, &p->P, &p->v, &o, p->tmp, p->line);
    else
        rows_then_columns(src, stride, p->ps, p->cols, &p->P, &o, p->tmp, p->line);
}
