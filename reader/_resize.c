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

/* One row's horizontal pass: ow RGBX pixels from a row of ps-byte pixels. */
static void h_row(const uint8_t *s, int ps, const Taps *h, int ow, uint8_t *d) {
    int xx, x;
    for (xx = 0; xx < ow; xx++, d += 4) {
        const int32_t *k = h->kk + (size_t)xx * h->ksize;
        const uint8_t *p = s + (size_t)h->bounds[2 * xx] * ps;
        int n = h->bounds[2 * xx + 1];
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

/* h_row for two RGBX rows sharing the taps: two taps (8 channels) per multiply; weights
   pre-broadcast in pairs (w8: per output pixel, (ksize + 1) / 2 groups of k[x] x4,
   k[x+1] x4). The loads of weights and bounds and the packing are shared by the rows. */
__attribute__((target("avx2")))
static void h_rows2_avx2(const uint8_t *s0, const uint8_t *s1, int cols, const Taps *h,
                         const int32_t *w8, int ow, uint8_t *d0, uint8_t *d1) {
    int pairs = (h->ksize + 1) / 2, xx, x;
    const __m128i half = _mm_set1_epi32(HALF);
    for (xx = 0; xx < ow; xx++) {
        size_t at = (size_t)h->bounds[2 * xx] * 4;
        const uint8_t *p = s0 + at, *q = s1 + at;
        const int32_t *w = w8 + (size_t)xx * pairs * 8;
        int n = h->bounds[2 * xx + 1], even = (n + 1) & ~1;
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        if (h->bounds[2 * xx] + even <= cols)
            n = even; /* the odd tap's partner lies in the row and weighs 0: no tail */
        __m128i r0, r1, packed;
        int32_t v;
        for (x = 0; x + 1 < n; x += 2, p += 8, q += 8, w += 8) {
            __m256i wk = _mm256_loadu_si256((const __m256i *)w);
            __m256i pp = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
            __m256i qq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(pp, wk));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(qq, wk));
        }
        r0 = _mm_add_epi32(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1));
        r1 = _mm_add_epi32(_mm256_castsi256_si128(a1), _mm256_extracti128_si256(a1, 1));
        if (x < n) {
            int32_t one0, one1;
            __m128i wk = _mm_set1_epi32(w[0]);
            memcpy(&one0, p, 4);
            memcpy(&one1, q, 4);
            r0 = _mm_add_epi32(r0, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(one0)), wk));
            r1 = _mm_add_epi32(r1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(one1)), wk));
        }
        r0 = _mm_srai_epi32(_mm_add_epi32(r0, half), PRECISION_BITS);
        r1 = _mm_srai_epi32(_mm_add_epi32(r1, half), PRECISION_BITS);
        packed = _mm_packs_epi32(r0, r1);
        packed = _mm_packus_epi16(packed, packed);
        v = _mm_cvtsi128_si32(packed);
        memcpy(d0 + 4 * (size_t)xx, &v, 4);
        v = _mm_extract_epi32(packed, 1);
        memcpy(d1 + 4 * (size_t)xx, &v, 4);
    }
}

/* v_row, 8 bytes at a time with the sums in registers (nbytes: whole groups of 8 first,
   the rest by the scalar loop). */
__attribute__((target("avx2")))
static void v_row_avx2(const uint8_t *rows, size_t stride, const Taps *v, int yy,
                       size_t nbytes, uint8_t *d) {
    const int32_t *k = v->kk + (size_t)yy * v->ksize;
    const uint8_t *r = rows + (size_t)v->bounds[2 * yy] * stride;
    int n = v->bounds[2 * yy + 1], y;
    size_t i;
    for (i = 0; i + 8 <= nbytes; i += 8) {
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

/* Eight RGBX pixels -> 8 bytes in each of three planes, in order or reversed (flip). */
__attribute__((target("avx2")))
static void split8_avx2(const uint8_t *row, uint8_t *d0, uint8_t *d1, uint8_t *d2, int flip) {
    const __m256i fwd = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i rev = _mm256_setr_epi8(12, 8, 4, 0, 13, 9, 5, 1, 14, 10, 6, 2, 15, 11, 7, 3,
                                         12, 8, 4, 0, 13, 9, 5, 1, 14, 10, 6, 2, 15, 11, 7, 3);
    __m256i px = _mm256_loadu_si256((const __m256i *)row);
    __m256i order = flip ? _mm256_setr_epi32(4, 0, 5, 1, 6, 2, 7, 3)
                         : _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    px = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(px, flip ? rev : fwd), order);
    _mm_storel_epi64((__m128i *)d0, _mm256_castsi256_si128(px));
    _mm_storel_epi64((__m128i *)d1, _mm_unpackhi_epi64(_mm256_castsi256_si128(px),
                                                       _mm256_castsi256_si128(px)));
    _mm_storel_epi64((__m128i *)d2, _mm256_extracti128_si256(px, 1));
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
            for (; x + 8 <= ow; x += 8) {
                int t = o->flip_h ? ow - 8 - x : x;
                split8_avx2(row + 4 * x, d0 + t, d1 + t, d2 + t, o->flip_h);
            }
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

/* AVX2 pair weights of the horizontal taps (see h_row_avx2), or NULL. */
static int32_t *pair_weights(const Taps *h, int ow) {
    int pairs = (h->ksize + 1) / 2, xx, x, c;
    int32_t *w8 = malloc((size_t)ow * pairs * 8 * sizeof(int32_t));
    if (w8 == NULL)
        return NULL;
    for (xx = 0; xx < ow; xx++)
        for (x = 0; x < 2 * pairs; x++)
            for (c = 0; c < 4; c++)
                w8[((size_t)xx * pairs * 2 + x) * 4 + c] =
                    x < h->ksize ? h->kk[(size_t)xx * h->ksize + x] : 0;
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
