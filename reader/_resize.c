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
 * Pure C, no Python: the caller (py_resize in _jpeg.c) checks every size and the box,
 * releases the GIL and guards the reads against SIGBUS. Returns 0, or -1 when memory for
 * the coefficients or the intermediate rows cannot be allocated.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22 /* 32 - 8 - 2, as Pillow */

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
   [in0, in1) of an axis of `in_size` pixels. in0 and in1 are floats as Pillow's box is. */
static int make_taps(int in_size, float in0, float in1, int out, Taps *t) {
    double scale, filterscale, support, center, ww, ss, *w;
    int xx, x, xmin, xmax;
    filterscale = scale = (double)(in1 - in0) / out;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = 1.0 * filterscale;
    t->ksize = (int)ceil(support) * 2 + 1;
    t->bounds = malloc((size_t)out * 2 * sizeof(int));
    t->kk = malloc((size_t)out * t->ksize * sizeof(int32_t));
    w = malloc((size_t)t->ksize * sizeof(double));
    if (t->bounds == NULL || t->kk == NULL || w == NULL) {
        free(w);
        return -1;
    }
    ss = 1.0 / filterscale;
    for (xx = 0; xx < out; xx++) {
        int32_t *k = t->kk + (size_t)xx * t->ksize;
        center = in0 + (xx + 0.5) * scale;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
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

/* Horizontal pass of one row (ps bytes a pixel) into `ow` pixels: channel c of output
   pixel xx goes to dc[xx * step] (step may be negative: a flipped store). */
static void horizontal_row(const uint8_t *s, int ps, const Taps *h, int ow, uint8_t *d0,
                           uint8_t *d1, uint8_t *d2, ptrdiff_t step) {
    int xx, x;
    for (xx = 0; xx < ow; xx++) {
        const int32_t *k = h->kk + (size_t)xx * h->ksize;
        const uint8_t *p = s + (size_t)h->bounds[2 * xx] * ps;
        int n = h->bounds[2 * xx + 1];
        int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
        for (x = 0; x < n; x++, p += ps) {
            s0 += p[0] * k[x];
            s1 += p[1] * k[x];
            s2 += p[2] * k[x];
        }
        d0[xx * step] = clip8(s0);
        d1[xx * step] = clip8(s1);
        d2[xx * step] = clip8(s2);
    }
}

/* Vertical pass of output row yy over `nbytes` bytes of rows `stride` apart: sums in acc
   (whole rows at once, a loop the compiler vectorises). */
static void vertical_sum(const uint8_t *rows, size_t stride, const Taps *v, int yy,
                         size_t nbytes, int32_t *acc) {
    const int32_t *k = v->kk + (size_t)yy * v->ksize;
    const uint8_t *r = rows + (size_t)v->bounds[2 * yy] * stride;
    int n = v->bounds[2 * yy + 1], y;
    size_t i;
    for (i = 0; i < nbytes; i++)
        acc[i] = 1 << (PRECISION_BITS - 1);
    for (y = 0; y < n; y++, r += stride) {
        int32_t w = k[y];
        for (i = 0; i < nbytes; i++)
            acc[i] += r[i] * w;
    }
}

/* Where output row oy's channel c starts, and the step between its pixels (flipped). */
typedef struct {
    uint8_t *dst;
    int oh, ow, chw, flip_h, flip_v;
} Out;

static uint8_t *out_row(const Out *o, int yy, int c, ptrdiff_t *step) {
    size_t oy = (size_t)(o->flip_v ? o->oh - 1 - yy : yy), plane = (size_t)o->oh * o->ow;
    uint8_t *row = o->chw ? o->dst + c * plane + oy * o->ow : o->dst + oy * o->ow * 3 + c;
    ptrdiff_t one = o->chw ? 1 : 3;
    *step = o->flip_h ? -one : one;
    return o->flip_h ? row + (o->ow - 1) * one : row;
}

/* Pillow 13's order: rows first when the height shrinks by more than twice what the width
   does, so the horizontal pass has fewer rows (what Pillow <= 12 always did: columns first). */
static int columns_first(int rows, int cols, int oh, int ow) {
    return !(rows - oh > 0 && rows - oh > (cols - ow) * 2);
}

static void columns_then_rows(const uint8_t *src, size_t stride, int ps, const Taps *h,
                              Taps *v, const Out *o, uint8_t *tmp, int32_t *acc) {
    int first = v->bounds[0], y, yy, x, c;
    int last = v->bounds[2 * o->oh - 2] + v->bounds[2 * o->oh - 1];
    size_t row = (size_t)o->ow * 4;
    for (y = first; y < last; y++) {
        uint8_t *t = tmp + (size_t)(y - first) * row;
        horizontal_row(src + (size_t)y * stride, ps, h, o->ow, t, t + 1, t + 2, 4);
    }
    for (yy = 0; yy < o->oh; yy++) {
        v->bounds[2 * yy] -= first; /* rows of tmp, not of the source */
        vertical_sum(tmp, row, v, yy, row, acc);
        for (c = 0; c < 3; c++) {
            ptrdiff_t step;
            uint8_t *d = out_row(o, yy, c, &step);
            for (x = 0; x < o->ow; x++)
                d[x * step] = clip8(acc[4 * x + c]);
        }
    }
}

static void rows_then_columns(const uint8_t *src, size_t stride, int ps, int cols,
                              const Taps *h, const Taps *v, const Out *o, uint8_t *tmp,
                              int32_t *acc) {
    size_t i, nbytes = (size_t)cols * ps;
    int yy;
    for (yy = 0; yy < o->oh; yy++) {
        ptrdiff_t step;
        uint8_t *d0 = out_row(o, yy, 0, &step), *d1 = out_row(o, yy, 1, &step);
        uint8_t *d2 = out_row(o, yy, 2, &step);
        vertical_sum(src, stride, v, yy, nbytes, acc);
        for (i = 0; i < nbytes; i++)
            tmp[i] = clip8(acc[i]);
        horizontal_row(tmp, ps, h, o->ow, d0, d1, d2, step);
    }
}

int resize_aa_bilinear(const uint8_t *src, size_t stride, int ps, int rows, int cols,
                       const float box[4], int oh, int ow, uint8_t *dst, int chw, int flip_h,
                       int flip_v) {
    Taps h = {0, NULL, NULL}, v = {0, NULL, NULL};
    Out o = {dst, oh, ow, chw, flip_h, flip_v};
    uint8_t *tmp = NULL;
    int32_t *acc = NULL;
    int status = -1, by_columns = columns_first(rows, cols, oh, ow);
    size_t tmp_bytes, acc_len;
    if (make_taps(rows, box[1], box[3], oh, &v) != 0 ||
        make_taps(cols, box[0], box[2], ow, &h) != 0)
        goto done;
    if (by_columns) {
        tmp_bytes = (size_t)(v.bounds[2 * oh - 2] + v.bounds[2 * oh - 1] - v.bounds[0]) * ow * 4;
        acc_len = (size_t)ow * 4;
    } else {
        tmp_bytes = acc_len = (size_t)cols * ps;
    }
    tmp = malloc(tmp_bytes);
    acc = malloc(acc_len * sizeof(int32_t));
    if (tmp == NULL || acc == NULL)
        goto done;
    if (by_columns)
        columns_then_rows(src, stride, ps, &h, &v, &o, tmp, acc);
    else
        rows_then_columns(src, stride, ps, cols, &h, &v, &o, tmp, acc);
    status = 0;
done:
    free(acc);
    free(tmp);
    free_taps(&h);
    free_taps(&v);
    return status;
}
