/* dlpack_io.reader._jpeg: decode the part of a JPEG a crop needs, at a reduced DCT scale.
 *
 * Optional extension (the reader falls back to PIL when it is missing). Built against the
 * libjpeg API of libjpeg-turbo >= 1.5 (jpeg_crop_scanline, jpeg_skip_scanlines, M/8 DCT
 * scaling). Every entry point releases the GIL while it works and writes into a buffer the
 * caller owns, so decoder threads run in parallel and no pixel is copied twice.
 *
 *   decode_region(src, out, top, left, height, width, scale_num, pixel_size=3)
 *       Decode the rows/columns covering the box (top, left, height, width) of the
 *       full-size image, at scale scale_num/8, as RGB (pixel_size 3) or RGBX (4) into
 *       `out` (row stride = cols * pixel_size).
 *       Returns (y0, x0, rows, cols, scaled_height, scaled_width): the decoded block is
 *       rows x cols pixels whose top-left is (y0, x0) in the scaled image.
 *   header(src) -> (height, width, components)
 *   to_chw(src, offset, row_stride, height, width, dst, dst_offset, flip_h, flip_v,
 *          pixel_size=3)
 *       Copy a height x width RGB (or RGBX) block (HWC, rows `row_stride` bytes apart,
 *       starting at byte `offset` of src) into dst at `dst_offset` as 3 CHW planes, flipped.
 *   crop_chw(src, params, height, width, dst)
 *       to_chw for a whole batch of blocks of one source (params: int64 rows of
 *       src_offset, row_stride, flip_h, flip_v, dst_offset).
 *   gather(src, src_offsets, lengths, dst, dst_offsets)
 *       memcpy many byte ranges (int64 arrays) of src into dst, e.g. whole raw records of
 *       a memory-mapped shard into a pinned batch buffer.
 *
 * libjpeg errors become ValueError through error_exit + longjmp; a premature end of data
 * (which libjpeg only warns about, filling the rest with grey) is an error too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char *message; /* JMSG_LENGTH_MAX bytes owned by the caller */
    int truncated;
} ErrorMgr;

static void on_error_exit(j_common_ptr cinfo) {
    ErrorMgr *err = (ErrorMgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_emit_message(j_common_ptr cinfo, int level) {
    ErrorMgr *err = (ErrorMgr *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF && !err->truncated) {
        err->truncated = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

static void on_output_message(j_common_ptr cinfo) { (void)cinfo; }

enum { OK = 0, ERR_JPEG = 1, ERR_OUT = 2, ERR_BOX = 3, ERR_TRUNCATED = 4 };

typedef struct {
    long top, left, height, width; /* requested box, full-size pixel coordinates */
    int scale_num;                  /* decode at scale_num / 8 */
    int pixel_size;                 /* 3: RGB, 4: RGBX (PIL's own layout, shared without copy) */
    unsigned char *out;
    Py_ssize_t out_size;
    long y0, x0, rows, cols, scaled_h, scaled_w, image_h, image_w;
    int status;
    char message[JMSG_LENGTH_MAX];
} Region;

static void setup_errors(struct jpeg_decompress_struct *cinfo, ErrorMgr *err, char *message) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error_exit;
    err->pub.emit_message = on_emit_message;
    err->pub.output_message = on_output_message;
    err->truncated = 0;
    err->message = message;
    message[0] = 0;
}

static int box_ok(const Region *r) {
    return r->top >= 0 && r->left >= 0 && r->height >= 1 && r->width >= 1 &&
           r->top + r->height <= r->image_h && r->left + r->width <= r->image_w;
}

/* Map the box into the scaled image, ask libjpeg for that column range; 0 if it fits. */
static int plan_region(struct jpeg_decompress_struct *cinfo, Region *r) {
    long n = r->scale_num, sy1, sx0, sx1;
    JDIMENSION xoff, cw;
    r->scaled_h = cinfo->output_height;
    r->scaled_w = cinfo->output_width;
    /* original coordinate x maps to x * n / 8 (exact per 8x8 block) */
    r->y0 = r->top * n / 8;
    sy1 = ((r->top + r->height) * n + 7) / 8;
    sx0 = r->left * n / 8;
    sx1 = ((r->left + r->width) * n + 7) / 8;
    /* one extra column each side: libjpeg replicates the edge column of a cropped decode
       instead of upsampling chroma from its neighbour, so the edges are not box pixels */
    if (sx0 > 0) sx0--;
    sx1++;
    if (sy1 > r->scaled_h) sy1 = r->scaled_h;
    if (sx1 > r->scaled_w) sx1 = r->scaled_w;
    xoff = (JDIMENSION)sx0;
    cw = (JDIMENSION)(sx1 - sx0);
    if (xoff != 0 || cw != cinfo->output_width)
        jpeg_crop_scanline(cinfo, &xoff, &cw); /* widens to iMCU boundaries */
    r->x0 = xoff;
    r->cols = cw;
    r->rows = sy1 - r->y0;
    return (Py_ssize_t)r->rows * r->cols * r->pixel_size > r->out_size;
}

/* Runs without the GIL. */
static void decode_region_nogil(const unsigned char *src, size_t len, Region *r) {
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    long i;
    setup_errors(&cinfo, &err, r->message);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_JPEG;
        return;
    }
    jpeg_mem_src(&cinfo, (unsigned char *)src, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    r->image_h = cinfo.image_height;
    r->image_w = cinfo.image_width;
    if (!box_ok(r)) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_BOX;
        return;
    }
    cinfo.out_color_space = r->pixel_size == 4 ? JCS_EXT_RGBX : JCS_RGB;
    cinfo.scale_num = r->scale_num;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    if (plan_region(&cinfo, r)) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_OUT;
        return;
    }
    if (r->y0 > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)r->y0);
    for (i = 0; i < r->rows;) {
        JSAMPROW row = r->out + (size_t)i * r->cols * r->pixel_size;
        JDIMENSION got = jpeg_read_scanlines(&cinfo, &row, 1);
        if (got == 0) break;
        i += got;
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    r->status = err.truncated ? ERR_TRUNCATED : OK;
}

static PyObject *region_error(const Region *r) {
    switch (r->status) {
    case ERR_JPEG:
        return PyErr_Format(PyExc_ValueError, "JPEG decode error: %s", r->message);
    case ERR_TRUNCATED:
        return PyErr_Format(PyExc_ValueError, "truncated JPEG data: %s", r->message);
    case ERR_OUT:
        return PyErr_Format(PyExc_ValueError,
                            "output buffer of %zd bytes is smaller than the %ld x %ld x %d "
                            "decoded region", r->out_size, r->rows, r->cols, r->pixel_size);
    default:
        return PyErr_Format(PyExc_ValueError,
                            "crop box (top=%ld, left=%ld, height=%ld, width=%ld) is not "
                            "inside the %ld x %ld image", r->top, r->left, r->height,
                            r->width, r->image_h, r->image_w);
    }
}

static PyObject *py_decode_region(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    Region r;
    (void)self;
    memset(&r, 0, sizeof(r));
    r.pixel_size = 3;
    if (!PyArg_ParseTuple(args, "y*w*lllli|i", &src, &out, &r.top, &r.left, &r.height,
                          &r.width, &r.scale_num, &r.pixel_size))
        return NULL;
    if (r.scale_num < 1 || r.scale_num > 16 || (r.pixel_size != 3 && r.pixel_size != 4)) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "scale_num %d not in 1..16 or pixel_size %d "
                            "not 3 or 4", r.scale_num, r.pixel_size);
    }
    r.out = (unsigned char *)out.buf;
    r.out_size = out.len;
    Py_BEGIN_ALLOW_THREADS
    decode_region_nogil((const unsigned char *)src.buf, (size_t)src.len, &r);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (r.status != OK)
        return region_error(&r);
    return Py_BuildValue("llllll", r.y0, r.x0, r.rows, r.cols, r.scaled_h, r.scaled_w);
}

static PyObject *py_header(PyObject *self, PyObject *args) {
    Py_buffer src;
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    char message[JMSG_LENGTH_MAX];
    long h, w, c;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &src))
        return NULL;
    setup_errors(&cinfo, &err, message);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&src);
        return PyErr_Format(PyExc_ValueError, "JPEG header error: %s", message);
    }
    jpeg_mem_src(&cinfo, (unsigned char *)src.buf, (unsigned long)src.len);
    jpeg_read_header(&cinfo, TRUE);
    h = cinfo.image_height;
    w = cinfo.image_width;
    c = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&src);
    return Py_BuildValue("lll", h, w, c);
}

/* HWC (3 channels) -> CHW planes, optional flips. Runs without the GIL. Each source row
   is first copied (wide loads, many cache misses in flight) into a small buffer that
   stays in L1; de-interleaving straight from DRAM with byte loads is ~5x slower. With
   SSSE3 (checked at run time) 16 pixels at a time are split with byte shuffles. */
#define ROW_CHUNK 4096
#define PREFETCH_ROWS 4

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define HAVE_SSSE3_PATH 1
static int have_ssse3 = -1;

__attribute__((target("ssse3")))
static long split16_ssse3(const unsigned char *t, long n, unsigned char *d0, unsigned char *d1,
                          unsigned char *d2, int flip, long w) {
    const __m128i ra = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i rb = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i rc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i ga = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i gb = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i gc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i ba = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i bb = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i bc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
    const __m128i rev = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    long x;
    for (x = 0; x + 16 <= n; x += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(t + 3 * x));
        __m128i b = _mm_loadu_si128((const __m128i *)(t + 3 * x + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(t + 3 * x + 32));
        __m128i r = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ra), _mm_shuffle_epi8(b, rb)),
                                 _mm_shuffle_epi8(c, rc));
        __m128i g = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ga), _mm_shuffle_epi8(b, gb)),
                                 _mm_shuffle_epi8(c, gc));
        __m128i bl = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ba), _mm_shuffle_epi8(b, bb)),
                                  _mm_shuffle_epi8(c, bc));
        long o = x;
        if (flip) {
            r = _mm_shuffle_epi8(r, rev); g = _mm_shuffle_epi8(g, rev);
            bl = _mm_shuffle_epi8(bl, rev);
            o = w - x - 16;
        }
        _mm_storeu_si128((__m128i *)(d0 + o), r);
        _mm_storeu_si128((__m128i *)(d1 + o), g);
        _mm_storeu_si128((__m128i *)(d2 + o), bl);
    }
    return x;
}

__attribute__((target("ssse3")))
static long split16x4_ssse3(const unsigned char *t, long n, unsigned char *d0, unsigned char *d1,
                            unsigned char *d2, int flip, long w) {
    const __m128i m = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m128i rev = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    long x;
    for (x = 0; x + 16 <= n; x += 16) {
        __m128i v0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(t + 4 * x)), m);
        __m128i v1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(t + 4 * x + 16)), m);
        __m128i v2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(t + 4 * x + 32)), m);
        __m128i v3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(t + 4 * x + 48)), m);
        __m128i lo01 = _mm_unpacklo_epi32(v0, v1), lo23 = _mm_unpacklo_epi32(v2, v3);
        __m128i hi01 = _mm_unpackhi_epi32(v0, v1), hi23 = _mm_unpackhi_epi32(v2, v3);
        __m128i r = _mm_unpacklo_epi64(lo01, lo23);
        __m128i g = _mm_unpackhi_epi64(lo01, lo23);
        __m128i b = _mm_unpacklo_epi64(hi01, hi23);
        long o = x;
        if (flip) {
            r = _mm_shuffle_epi8(r, rev); g = _mm_shuffle_epi8(g, rev);
            b = _mm_shuffle_epi8(b, rev);
            o = w - x - 16;
        }
        _mm_storeu_si128((__m128i *)(d0 + o), r);
        _mm_storeu_si128((__m128i *)(d1 + o), g);
        _mm_storeu_si128((__m128i *)(d2 + o), b);
    }
    return x;
}
#endif

/* Split n pixels (ps bytes each) of the L1-resident row copy t into three planes. */
static void split_row(const unsigned char *t, long n, int ps, unsigned char *d0,
                      unsigned char *d1, unsigned char *d2, int flip, long w) {
    long x = 0;
#ifdef HAVE_SSSE3_PATH
    if (have_ssse3 < 0) have_ssse3 = __builtin_cpu_supports("ssse3") ? 1 : 0;
    if (have_ssse3)
        x = ps == 3 ? split16_ssse3(t, n, d0, d1, d2, flip, w)
                    : split16x4_ssse3(t, n, d0, d1, d2, flip, w);
#endif
    for (; x < n; x++) {
        long o = flip ? w - 1 - x : x;
        d0[o] = t[ps * x]; d1[o] = t[ps * x + 1]; d2[o] = t[ps * x + 2];
    }
}

static void to_chw_nogil(const unsigned char *src, Py_ssize_t row_stride, long h, long w,
                         int ps, unsigned char *dst, int flip_h, int flip_v) {
    unsigned char tmp[4 * ROW_CHUNK + 64];
    size_t plane = (size_t)h * w;
    long y;
    for (y = 0; y < h; y++) {
        const unsigned char *s = src + (size_t)(flip_v ? h - 1 - y : y) * row_stride;
        unsigned char *d0 = dst + (size_t)y * w;
#if defined(__GNUC__)
        if (y + PREFETCH_ROWS < h) { /* the row PREFETCH_ROWS ahead: keep DRAM busy */
            const unsigned char *ahead =
                src + (size_t)(flip_v ? h - 1 - y - PREFETCH_ROWS : y + PREFETCH_ROWS) * row_stride;
            size_t off;
            for (off = 0; off < (size_t)ps * w; off += 64)
                __builtin_prefetch(ahead + off, 0, 0);
        }
#endif
        if (w <= ROW_CHUNK) { /* stage the row in L1 (wide loads); very wide rows skip it */
            memcpy(tmp, s, (size_t)ps * w);
            s = tmp;
        }
        split_row(s, w, ps, d0, d0 + plane, d0 + 2 * plane, flip_h, w);
    }
}

static PyObject *py_to_chw(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t offset, row_stride, dst_offset;
    long h, w;
    int flip_h, flip_v, ps = 3;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnllw*npp|i", &src, &offset, &row_stride, &h, &w, &dst,
                          &dst_offset, &flip_h, &flip_v, &ps))
        return NULL;
    if (h < 1 || w < 1 || (ps != 3 && ps != 4) || offset < 0 || dst_offset < 0 ||
        row_stride < ps * w || offset + (h - 1) * row_stride + ps * w > src.len ||
        dst_offset + 3 * h * w > dst.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError,
                            "to_chw: block %ld x %ld x %d (offset %zd, row stride %zd) does not "
                            "fit a %zd-byte source or a %zd-byte destination at %zd",
                            h, w, ps, offset, row_stride, src.len, dst.len, dst_offset);
    }
    Py_BEGIN_ALLOW_THREADS
    to_chw_nogil((const unsigned char *)src.buf + offset, row_stride, h, w, ps,
                 (unsigned char *)dst.buf + dst_offset, flip_h, flip_v);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

/* gather(src, src_offsets, lengths, dst, dst_offsets): memcpy n byte ranges of src into
   dst (offsets/lengths: contiguous int64 buffers of one length). All ranges are checked
   first; the copies run without the GIL. */
static PyObject *py_gather(PyObject *self, PyObject *args) {
    Py_buffer src, so, ln, dst, dof;
    Py_ssize_t n, i;
    const long long *s_off, *len, *d_off;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*w*y*", &src, &so, &ln, &dst, &dof))
        return NULL;
    n = so.len / 8;
    s_off = (const long long *)so.buf;
    len = (const long long *)ln.buf;
    d_off = (const long long *)dof.buf;
    if (so.len % 8 || ln.len != so.len || dof.len != so.len) {
        PyErr_SetString(PyExc_ValueError, "gather: offsets and lengths must be int64 arrays "
                                          "of one length");
        goto fail;
    }
    for (i = 0; i < n; i++) {
        if (s_off[i] < 0 || len[i] < 0 || d_off[i] < 0 || s_off[i] + len[i] > src.len ||
            d_off[i] + len[i] > dst.len) {
            PyErr_Format(PyExc_ValueError, "gather: range %zd (%lld bytes from %lld to %lld) "
                         "does not fit a %zd-byte source and %zd-byte destination", i, len[i],
                         s_off[i], d_off[i], src.len, dst.len);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++)
        memcpy((char *)dst.buf + d_off[i], (const char *)src.buf + s_off[i], (size_t)len[i]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src); PyBuffer_Release(&so); PyBuffer_Release(&ln);
    PyBuffer_Release(&dst); PyBuffer_Release(&dof);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&so); PyBuffer_Release(&ln);
    PyBuffer_Release(&dst); PyBuffer_Release(&dof);
    return NULL;
}

/* crop_chw(src, params, height, width, dst): for each row (src_offset, row_stride, flip_h,
   flip_v, dst_offset) of the int64 (n, 5) array `params`, copy the height x width RGB
   block at src_offset into dst at dst_offset as CHW planes. Checked first, then run
   without the GIL: a whole batch of raw crops in one call. */
static PyObject *py_crop_chw(PyObject *self, PyObject *args) {
    Py_buffer src, prm, dst;
    long h, w;
    Py_ssize_t n, i;
    const long long *p;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*llw*", &src, &prm, &h, &w, &dst))
        return NULL;
    n = prm.len / (5 * 8);
    p = (const long long *)prm.buf;
    if (prm.len % 40 || h < 1 || w < 1) {
        PyErr_SetString(PyExc_ValueError, "crop_chw: params must be an int64 (n, 5) array "
                                          "and height, width >= 1");
        goto fail;
    }
    for (i = 0; i < n; i++) {
        const long long *q = p + 5 * i;
        if (q[0] < 0 || q[1] < 3 * w || q[4] < 0 || q[0] + (h - 1) * q[1] + 3 * w > src.len ||
            q[4] + 3 * h * w > dst.len) {
            PyErr_Format(PyExc_ValueError, "crop_chw: block %zd (%ld x %ld at %lld, stride %lld "
                         "-> %lld) does not fit a %zd-byte source / %zd-byte destination",
                         i, h, w, q[0], q[1], q[4], src.len, dst.len);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++) {
        const long long *q = p + 5 * i;
        to_chw_nogil((const unsigned char *)src.buf + q[0], (Py_ssize_t)q[1], h, w, 3,
                     (unsigned char *)dst.buf + q[4], (int)q[2], (int)q[3]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src); PyBuffer_Release(&prm); PyBuffer_Release(&dst);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&prm); PyBuffer_Release(&dst);
    return NULL;
}

static PyMethodDef methods[] = {
    {"crop_chw", py_crop_chw, METH_VARARGS,
     "crop_chw(src, params_int64_nx5, height, width, dst): batch of HWC crops -> CHW"},
    {"gather", py_gather, METH_VARARGS,
     "gather(src, src_offsets, lengths, dst, dst_offsets): copy int64-described byte ranges"},
    {"decode_region", py_decode_region, METH_VARARGS,
     "decode_region(src, out, top, left, height, width, scale_num, pixel_size=3) -> "
     "(y0, x0, rows, cols, scaled_height, scaled_width)"},
    {"header", py_header, METH_VARARGS, "header(src) -> (height, width, components)"},
    {"to_chw", py_to_chw, METH_VARARGS,
     "to_chw(src, offset, row_stride, height, width, dst, dst_offset, flip_h, flip_v, "
     "pixel_size=3)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg",
                                    "Region JPEG decoding with DCT scaling (libjpeg-turbo).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
                            LIBJPEG_TURBO_VERSION_NUMBER
#else
                            0
#endif
    );
    return m;
}
