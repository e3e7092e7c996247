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
 *       A JPEG with a restart interval that divides its MCU row (`dlpack convert
 *       --restart-markers`) is entered at the restart intervals around the box: the rest
 *       is never Huffman-decoded (see "Restart-marker fast path" below).
 *   decode_resized(src, scratch, top, left, height, width, t_top, t_left, t_height, t_width,
 *                  scale_num, within_box, out_h, out_w, dst, dst_offset, flip_h, flip_v,
 *                  orientation)
 *       decode_region + the C resize of the float box t_* into dst as CHW, one call.
 *   decode_resized_many(views, table, targets, scratch, dst, progress) -> done
 *       decode_resized for many records of mapped shards, one GIL release; stops at the
 *       first record it cannot make and returns its position (the batch path's common case).
 *   add_restarts(src, interval=0) -> bytes or None
 *       The lossless rewrite the packer's --restart-markers does (below).
 *   header(src) -> (height, width, components)
 *   to_chw(src, offset, row_stride, height, width, dst, dst_offset, flip_h, flip_v,
 *          pixel_size=3)
 *       Copy a height x width RGB (or RGBX) block (HWC, rows `row_stride` bytes apart,
 *       starting at byte `offset` of src) into dst at `dst_offset` as 3 CHW planes, flipped.
 *   crop_chw(src, params, height, width, dst)
 *       to_chw for a whole batch of blocks of one source (params: int64 rows of
 *       src_offset, row_stride, flip_h, flip_v, dst_offset).
 *   resize(src, offset, row_stride, rows, cols, pixel_size, x0, y0, x1, y1, out_h, out_w,
 *          dst, dst_offset, flip_h, flip_v, chw=True)
 *       Pillow's antialiased BILINEAR resample of the float box of a block (_resize.c),
 *       bit-identical to plain Pillow, straight into dst as CHW planes (or HWC RGB), flipped.
 *   resize_isa() -> "avx2" or "scalar": the passes resize runs in this process (AVX2 where
 *       the CPU has it, unless DLPACK_IO_NO_AVX2 is set to anything but "" or "0").
 *   gather(src, src_offsets, lengths, dst, dst_offsets)
 *       memcpy many byte ranges (int64 arrays) of src into dst, e.g. whole raw records of
 *       a memory-mapped shard into a pinned batch buffer.
 *
 *   fast_huffman([on]) -> bool, fast_huffman_counts() -> (taken, refused)
 *       Our Huffman decoder (_huffman.c) takes every baseline scan over from libjpeg's
 *       (same coefficients, ~0.55x the time of a whole decode); these switch it and count its scans.
 *
 * libjpeg errors become ValueError through error_exit + longjmp; a premature end of data
 * (which libjpeg only warns about, filling the rest with grey) is an error too.
 *
 * Hostile arguments: every size, offset and stride is checked with overflow-checked
 * unsigned arithmetic before any byte is touched, so a direct call with hostile values
 * raises ValueError and never reads or writes outside the buffers or loops for long.
 * Sources are often memory-mapped shard files: if one is truncated or rewritten under us,
 * reading it raises SIGBUS. Reads of the source run under a per-thread guard (a SIGBUS
 * handler that siglongjmps back to the entry point), so the call raises MappedFileError
 * (a ValueError) instead of killing the process; JPEG decoding first copies the source
 * under that guard, so libjpeg never sees mapped memory. A SIGBUS outside a guarded read
 * is handed back to the previous handler (the process dies as it would have without us).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "_huffman.h"
#include "_planes.h"

/* ---- SIGBUS guard ----------------------------------------------------------------------
 * A thread inside a guarded read points tls_bus at its BusGuard; the handler jumps back to
 * it. initial-exec TLS: reading it in the handler never allocates. */
typedef struct {
    sigjmp_buf env;
    const char *volatile addr; /* faulting address, set by the handler */
} BusGuard;

static __thread BusGuard *volatile tls_bus __attribute__((tls_model("initial-exec")));
static struct sigaction bus_previous;
static PyObject *MappedFileError;

static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
    BusGuard *g = tls_bus;
    (void)ctx;
    if (g != NULL) {
        tls_bus = NULL;
        g->addr = info != NULL ? (const char *)info->si_addr : NULL;
        siglongjmp(g->env, 1);
    }
    /* Not ours: restore the previous disposition. A fault then repeats on return and goes
       there; a signal sent with kill() is sent again. */
    sigaction(SIGBUS, &bus_previous, NULL);
    if (info == NULL || info->si_code <= 0)
        raise(sig);
}

static int install_sigbus_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &bus_previous);
}

/* Someone may have replaced our handler since import (Ray's driver installs its own crash
   handler at ray.init and leaves the default after ray.shutdown; faulthandler.enable puts
   its own in front): put ours back in front before every guarded read, or a truncated
   shard would kill the process. Called with the GIL held, so Python threads do this one at
   a time; the handler found becomes the one a fault that is not ours goes to. */
static void keep_sigbus_handler(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0)
        return;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)
        return;
    install_sigbus_handler();
}

/* Raise MappedFileError for a fault at `addr` while reading the `len`-byte buffer `src`. */
static PyObject *bus_error(const char *what, const void *src, Py_ssize_t len, const char *addr) {
    const char *base = (const char *)src;
    if (addr >= base && addr < base + len)
        return PyErr_Format(MappedFileError, "%s: bus error reading byte %zd of a %zd-byte "
                            "memory-mapped source: the file under it was truncated or changed "
                            "on disk", what, (Py_ssize_t)(addr - base), len);
    return PyErr_Format(MappedFileError, "%s: bus error reading a %zd-byte memory-mapped "
                        "source: the file under it was truncated or changed on disk", what, len);
}

/* Copy n bytes of src into dst under the guard; NULL or the faulting address. */
static const char *copy_guarded(unsigned char *dst, const unsigned char *src, size_t n) {
    BusGuard g;
    g.addr = NULL;
    if (sigsetjmp(g.env, 1) != 0)
        return g.addr != NULL ? g.addr : (const char *)src;
    tls_bus = &g;
    memcpy(dst, src, n);
    tls_bus = NULL;
    return NULL;
}

/* ---- overflow-checked extents -------------------------------------------------------- */
/* 1 when rows of row_bytes bytes, `stride` apart, starting at `offset` lie inside a buffer
   of `len` bytes; every step is checked for overflow, so hostile values give 0. */
static int block_fits(long long offset, long long rows, long long stride, long long row_bytes,
                      Py_ssize_t len) {
    unsigned long long last, end;
    if (offset < 0 || rows < 1 || stride < 0 || row_bytes < 0 || len < 0)
        return 0;
    if (__builtin_mul_overflow((unsigned long long)(rows - 1), (unsigned long long)stride, &last) ||
        __builtin_add_overflow(last, (unsigned long long)offset, &last) ||
        __builtin_add_overflow(last, (unsigned long long)row_bytes, &end))
        return 0;
    return end <= (unsigned long long)len;
}

/* a * b into *out, 0 on overflow or a negative factor */
static int mul_ok(long long a, long long b, long long *out) {
    return a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, out);
}

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

enum { OK = 0, ERR_JPEG = 1, ERR_OUT = 2, ERR_BOX = 3, ERR_TRUNCATED = 4, ERR_BOMB = 5,
       ERR_PLANES = 6 };

typedef struct {
    long top, left, height, width; /* requested box, full-size pixel coordinates */
    int scale_num;                  /* decode at scale_num / 8 */
    int pixel_size;                 /* 3: RGB, 4: RGBX (PIL's own layout, shared without copy) */
    unsigned char *out;
    Py_ssize_t out_size;
    Py_ssize_t limit;               /* the caller's buffer: a full-size decode must fit (bomb
                                       check; decode_oriented decodes into a smaller block) */
    long y0, x0, rows, cols, scaled_h, scaled_w, image_h, image_w;
    int status;
    char message[JMSG_LENGTH_MAX];
    /* Set by a caller that decodes a planes record straight from (mapped) memory under the
       SIGBUS guard: buffers allocated before the guard, so a fault leaks nothing. */
    void *work;                     /* planes_work_bytes of the widest row, or NULL */
    unsigned char *win;             /* a packed record's unpacked window, or NULL */
    size_t win_size;
    unsigned char *tmp;             /* decode_oriented's stored block, or NULL */
    size_t tmp_size;
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
    /* at least 3 iMCUs wide: libjpeg-turbo upsamples chroma with the fancy (triangle)
       filter only when the cropped, downsampled width is > 2 (a 1-pixel box at the left
       edge of a 4:2:0 image decoded differently from the whole image without this) */
    if (sx1 - sx0 < 3L * cinfo->max_h_samp_factor * n) {
        sx1 = sx0 + 3L * cinfo->max_h_samp_factor * n;
        if (sx1 > r->scaled_w) {
            sx1 = r->scaled_w;
            sx0 = sx1 - 3L * cinfo->max_h_samp_factor * n;
            if (sx0 < 0) sx0 = 0;
        }
    }
    xoff = (JDIMENSION)sx0;
    cw = (JDIMENSION)(sx1 - sx0);
    if (xoff != 0 || cw != cinfo->output_width)
        jpeg_crop_scanline(cinfo, &xoff, &cw); /* widens to iMCU boundaries */
    r->x0 = xoff;
    r->cols = cw;
    r->rows = sy1 - r->y0;
    return (Py_ssize_t)r->rows * r->cols * r->pixel_size > r->out_size;
}


/* ---- Restart-marker fast path ---------------------------------------------------------
 * A baseline JPEG whose restart interval divides its MCU row (what `dlpack convert
 * --restart-markers` writes: a restart marker after every MCU) can be
 * entered at any restart interval: the entropy decoder resets at every RSTn marker. For a
 * box we build a small stream = the original header segments (SOF height and width
 * reduced to the rows and columns still needed) + the entropy data of the intervals of
 * MCU rows first..end-1 that cover MCU columns c0..c1-1 (RST markers renumbered from RST0)
 * + EOI. Where a box edge falls on an MCU boundary one more MCU row / column is kept
 * beyond it (the chroma sample fancy upsampling reads there), so the box's pixels decode
 * exactly as in the whole image; the other intervals are never Huffman-decoded. */
typedef struct {
    size_t sof_h;          /* offset of the SOF height field (the width follows) */
    size_t scan;           /* offset of the first entropy-coded byte */
    long width, height, mcu_w, mcu_h, rows, cols; /* cols: MCUs per row */
    long ri;               /* restart interval, MCUs */
} Layout;

/* Fill L for a single-scan Huffman sequential 8-bit 3-component JPEG; 1 when it also has
   a restart interval that divides its MCU row. */
static int parse_layout(const unsigned char *s, size_t len, Layout *L) {
    size_t p = 2;
    long hmax = 1, vmax = 1;
    int ncomp = 0, i;
    memset(L, 0, sizeof(*L));
    if (len < 4 || s[0] != 0xFF || s[1] != 0xD8) return 0;
    for (;;) {
        unsigned m;
        size_t seglen;
        const unsigned char *seg;
        while (p + 1 < len && s[p] == 0xFF && s[p + 1] == 0xFF) p++; /* fill bytes */
        if (p + 4 > len || s[p] != 0xFF) return 0;
        m = s[p + 1];
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { p += 2; continue; }
        if (m == 0xD9) return 0;
        seglen = ((size_t)s[p + 2] << 8) | s[p + 3];
        if (seglen < 2 || p + 2 + seglen > len) return 0;
        seg = s + p + 4;
        if (m == 0xC0 || m == 0xC1) {
            if (ncomp || seglen < 8 || seg[0] != 8) return 0;
            L->sof_h = p + 5;
            L->height = ((long)seg[1] << 8) | seg[2];
            L->width = ((long)seg[3] << 8) | seg[4];
            ncomp = seg[5];
            if (ncomp != 3 || seglen < 8 + 3 * (size_t)ncomp) return 0;
            for (i = 0; i < ncomp; i++) {
                long h = seg[7 + 3 * i] >> 4, v = seg[7 + 3 * i] & 15;
                if (h < 1 || v < 1) return 0;
                if (h > hmax) hmax = h;
                if (v > vmax) vmax = v;
            }
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            return 0; /* progressive, lossless, arithmetic, hierarchical */
        } else if (m == 0xDD) {
            if (seglen != 4) return 0;
            L->ri = ((long)seg[0] << 8) | seg[1];
        } else if (m == 0xDA) {
            if (!ncomp || seg[0] != ncomp) return 0; /* one interleaved scan only */
            L->scan = p + 2 + seglen;
            break;
        }
        p += 2 + seglen;
    }
    if (L->height < 1 || L->width < 1) return 0; /* DNL-defined heights: not handled */
    L->mcu_w = 8 * hmax;
    L->mcu_h = 8 * vmax;
    L->rows = (L->height + L->mcu_h - 1) / L->mcu_h;
    L->cols = (L->width + L->mcu_w - 1) / L->mcu_w;
    return L->ri > 0 && L->cols % L->ri == 0;
}

#define IS_RST(b) ((b) >= 0xD0 && (b) <= 0xD7)

/* The stream of MCU rows [first, end) x restart intervals [i0, i1) of each row, in a
   malloc'ed buffer; NULL when the data lacks the expected markers (the caller then
   decodes the whole stream, which reports the damage). */
static unsigned char *sub_stream(const unsigned char *s, size_t len, const Layout *L,
                                 long first, long end, long i0, long i1, size_t *out_len) {
    long q = L->cols / L->ri, total = L->rows * q;
    long g_first = first * q + i0, g_last = (end - 1) * q + i1 - 1, g, j = 0;
    long sub_h, sub_w;
    size_t p = L->scan, head = L->scan, o = 0; /* set with b: 0 keeps gcc from warning */
    unsigned char *b = NULL;
    for (g = 0; g <= g_last; g++) {
        size_t start = p, m = scan_next_marker(s, p, len);
        long col = g % q;
        if (m >= len || (g < total - 1) != IS_RST(s[m + 1])) {
            free(b);
            return NULL;
        }
        p = m + 2;
        if (g < g_first || col < i0 || col >= i1) continue;
        if (b == NULL) {
            b = (unsigned char *)malloc(head + (len - start) + 2);
            if (b == NULL) return NULL;
            memcpy(b, s, head);
            o = head;
        }
        if (j > 0) { /* the marker ending the previous interval, renumbered */
            b[o++] = 0xFF;
            b[o++] = (unsigned char)(0xD0 + ((j - 1) & 7));
        }
        memcpy(b + o, s + start, m - start);
        o += m - start;
        j++;
    }
    if (b == NULL) return NULL;
    sub_h = (end * L->mcu_h < L->height ? end * L->mcu_h : L->height) - first * L->mcu_h;
    sub_w = (i1 * L->ri * L->mcu_w < L->width ? i1 * L->ri * L->mcu_w : L->width) -
            i0 * L->ri * L->mcu_w;
    b[L->sof_h] = (unsigned char)(sub_h >> 8);
    b[L->sof_h + 1] = (unsigned char)(sub_h & 0xFF);
    b[L->sof_h + 2] = (unsigned char)(sub_w >> 8);
    b[L->sof_h + 3] = (unsigned char)(sub_w & 0xFF);
    b[o++] = 0xFF;
    b[o++] = 0xD9;
    *out_len = o;
    return b;
}

/* Runs without the GIL. fast: our Huffman decoder may take the scan (_huffman.c). */
static void decode_stream(const unsigned char *src, size_t len, Region *r, int fast);

/* The box of a decoded-planes record (_planes.c), at full scale only; the same contract
   as a JPEG's (the caller's buffer holds the whole image, or it is a bomb). */
static void planes_region(const unsigned char *src, size_t len, Region *r) {
    PlanesInfo p;
    const char *why = planes_parse(src, len, &p);
    int *work;
    unsigned char *win;
    if (why == NULL && r->scale_num != 8)
        why = "planes records decode at full scale only (scale_num 8)";
    if (why != NULL) {
        snprintf(r->message, sizeof(r->message), "%s", why);
        r->status = ERR_PLANES;
        return;
    }
    r->image_h = r->scaled_h = p.height;
    r->image_w = r->scaled_w = p.width;
    if (!box_ok(r)) {
        r->status = ERR_BOX;
        return;
    }
    if ((unsigned long long)p.height * p.width * r->pixel_size > (unsigned long long)r->limit) {
        r->status = ERR_BOMB;
        return;
    }
    /* The columns a JPEG region decode of this box returns (plan_region, then
       jpeg_crop_scanline's alignment to the iMCU: 8 pixels, 16 for 2:1 chroma): a filter
       allowed to read around the box (Resize + crop) then sees the same block with the
       same origin, so its arithmetic is the JPEG record's to the bit. */
    {
        long align = 8L * (p.comps == 3 ? p.hf : 1), sx0 = r->left, sx1 = r->left + r->width;
        if (sx0 > 0) sx0--;
        if (++sx1 > p.width) sx1 = p.width;
        if (sx1 - sx0 < 3 * align) {
            sx1 = sx0 + 3 * align;
            if (sx1 > p.width) {
                sx1 = p.width;
                sx0 = sx1 - 3 * align;
                if (sx0 < 0) sx0 = 0;
            }
        }
        if (sx0 != 0 || sx1 != p.width)
            sx0 = sx0 / align * align;
        r->x0 = sx0;
        r->cols = sx1 - sx0;
    }
    r->y0 = r->top;
    r->rows = r->height;
    if ((unsigned long long)r->rows * r->cols * r->pixel_size > (unsigned long long)r->out_size) {
        r->status = ERR_OUT;
        return;
    }
    work = (int *)r->work;
    win = r->win;
    if (p.packed && win != NULL && planes_window_bytes(r->rows, r->cols) > r->win_size) {
        /* planes_in_place sized it for every region of the box: never, but no malloc here,
           under its SIGBUS guard */
        strcpy(r->message, "the window buffer is smaller than the region (a bug: report it)");
        r->status = ERR_PLANES;
        return;
    }
    if (p.packed && win == NULL)
        win = (unsigned char *)malloc(planes_window_bytes(r->rows, r->cols));
    if (work == NULL)
        work = (int *)malloc(planes_work_bytes(r->cols));
    if (work == NULL || (p.packed && win == NULL)) {
        if (work != r->work) free(work);
        if (win != r->win) free(win);
        strcpy(r->message, "out of memory");
        r->status = ERR_PLANES;
        return;
    }
    if (p.packed) { /* the blocks the box touches, unpacked; then as a plain record */
        PlanesInfo w;
        planes_window(&p, r->y0, r->x0, r->rows, r->cols, win, &w);
        planes_rgb(&w, r->y0, r->x0, r->rows, r->cols, r->pixel_size, r->out, work);
    } else {
        planes_rgb(&p, r->y0, r->x0, r->rows, r->cols, r->pixel_size, r->out, work);
    }
    if (work != r->work)
        free(work);
    if (win != r->win)
        free(win);
    r->status = OK;
}

static void decode_region_nogil(const unsigned char *src, size_t len, Region *r) {
    Layout L;
    if (planes_magic(src, len)) {
        planes_region(src, len, r);
        return;
    }
    if (parse_layout(src, len, &L) && r->top >= 0 && r->height >= 1 && r->left >= 0 &&
        r->width >= 1 && r->top + r->height <= L.height && r->left + r->width <= L.width) {
        /* In scaled pixels (n/8): the box is rows ys..ye-1, columns xs..xe-1; an MCU is
           hs x ws. The upsampler reads one chroma sample beyond a box edge, which lies in
           the neighbouring MCU only when the edge falls on an MCU boundary. */
        long n = r->scale_num, q = L.cols / L.ri;
        long hs = L.mcu_h * n / 8, ws = L.mcu_w * n / 8;
        long ys = r->top * n / 8, ye = ((r->top + r->height) * n + 7) / 8;
        long xs = r->left * n / 8, xe = ((r->left + r->width) * n + 7) / 8;
        long first = ys / hs - (ys % hs == 0), end = (ye - 1) / hs + 1 + (ye % hs == 0);
        long c0 = xs / ws - (xs % ws == 0), c1 = (xe - 1) / ws + 1 + (xe % ws == 0);
        long i0, i1;
        if (first < 0) first = 0;
        if (end > L.rows) end = L.rows;
        if (c0 < 0) c0 = 0;
        if (c1 > L.cols) c1 = L.cols;
        /* libjpeg-turbo upsamples chroma 2:1 horizontally with the fancy (triangle)
           filter only when the downsampled width is > 2: keep >= 3 MCUs */
        while (c1 - c0 < 3 && (c0 > 0 || c1 < L.cols)) {
            if (c1 < L.cols) c1++;
            else c0--;
        }
        i0 = c0 / L.ri;
        i1 = (c1 + L.ri - 1) / L.ri;
        if (first > 0 || i0 > 0 || i1 < q) {
            long dy = first * L.mcu_h, dx = i0 * L.ri * L.mcu_w;
            size_t n = 0;
            unsigned char *b = sub_stream(src, len, &L, first, end, i0, i1, &n);
            if (b != NULL) {
                r->top -= dy;
                r->left -= dx;
                decode_stream(b, n, r, 1);
                free(b);
                r->top += dy;
                r->left += dx;
                r->y0 += dy * r->scale_num / 8;
                r->x0 += dx * r->scale_num / 8;
                r->scaled_h = (L.height * r->scale_num + 7) / 8;
                r->scaled_w = (L.width * r->scale_num + 7) / 8;
                r->image_h = L.height;
                r->image_w = L.width;
                return;
            }
        }
    }
    decode_stream(src, len, r, 1);
}

/* Pillow's CMYK -> RGB for a four-component JPEG, on libjpeg's CMYK output (YCCK already
   converted to CMYK by libjpeg): Pillow reads every 4-component JPEG as inverted ("CMYK;I",
   Adobe's convention), then R = (255 - K') - round(C' * (255 - K') / 255) with C' = 255 - C,
   K' = 255 - K, i.e. with nk = K: R = nk - round((255 - C) * nk / 255). The rounding
   division is (t + (t >> 8)) >> 8 with t = a * b + 128, exact for a, b in 0..255. */
static void cmyk_row(const unsigned char *in, unsigned char *out, long n, int ps) {
    long x;
    for (x = 0; x < n; x++, in += 4, out += ps) {
        int nk = in[3], c;
        for (c = 0; c < 3; c++) {
            int t = (255 - in[c]) * nk + 128;
            out[c] = (unsigned char)(nk - ((t + (t >> 8)) >> 8));
        }
        if (ps == 4) out[3] = 255;
    }
}

static void decode_stream(const unsigned char *src, size_t len, Region *r, int fast) {
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    long i;
    int cmyk;
    unsigned char *volatile row_tmp = NULL; /* CMYK scanline, freed on every exit */
    FastScan *volatile scan = NULL;         /* our Huffman decoder's state, when it decodes */
    setup_errors(&cinfo, &err, r->message);
    jpeg_create_decompress(&cinfo);
    cinfo.client_data = NULL; /* kept by jpeg_create_decompress: ours to set */
    if (setjmp(err.jump)) {
        int again = fast_scan_refused(scan);
        jpeg_destroy_decompress(&cinfo);
        free(row_tmp);
        fast_scan_free(scan);
        if (again) /* damaged entropy data: libjpeg alone decodes (or conceals) it as ever */
            decode_stream(src, len, r, 0);
        else
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
    /* The caller's buffer holds a whole-image decode at the requested scale (documented
       contract): a header that claims more pixels than that (a decompression bomb, or an
       index entry that does not match the record) is refused before jpeg_start_decompress
       sizes anything from it. */
    if ((((unsigned long long)r->image_h * r->scale_num + 7) / 8) *
        (((unsigned long long)r->image_w * r->scale_num + 7) / 8) * r->pixel_size >
        (unsigned long long)r->limit) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_BOMB;
        return;
    }
    /* grayscale, YCbCr and RGB JPEGs: libjpeg converts to RGB(X) itself (grey replicated,
       as PIL's L -> RGB); CMYK and YCCK: CMYK out, converted per row as Pillow does */
    cmyk = cinfo.num_components == 4;
    cinfo.out_color_space = cmyk ? JCS_CMYK : r->pixel_size == 4 ? JCS_EXT_RGBX : JCS_RGB;
    cinfo.scale_num = r->scale_num;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    if (plan_region(&cinfo, r)) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_OUT;
        return;
    }
    if (cmyk && (row_tmp = (unsigned char *)malloc((size_t)r->cols * 4)) == NULL) {
        jpeg_destroy_decompress(&cinfo);
        strcpy(r->message, "out of memory");
        r->status = ERR_JPEG;
        return;
    }
    if (fast)
        scan = fast_scan_start(&cinfo, src, len);
    if (r->y0 > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)r->y0);
    for (i = 0; i < r->rows;) {
        JSAMPROW dst = r->out + (size_t)i * r->cols * r->pixel_size;
        JSAMPROW row = cmyk ? row_tmp : dst;
        JDIMENSION got = jpeg_read_scanlines(&cinfo, &row, 1);
        if (got == 0) break;
        if (cmyk) cmyk_row(row_tmp, dst, r->cols, r->pixel_size);
        i += got;
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row_tmp);
    fast_scan_free(scan);
    r->status = err.truncated ? ERR_TRUNCATED : OK;
}

/* ---- EXIF orientation -----------------------------------------------------------------
 * Records keep the original bytes; the index says which EXIF orientation (1..8) makes the
 * stored image upright, and boxes are given in the upright ("displayed") image. Displayed
 * pixel (y, x) is stored pixel (sy, sx) with (u, v) = transpose ? (x, y) : (y, x),
 * sy = flip_y ? H - 1 - u : u, sx = flip_x ? W - 1 - v : v: Pillow's exif_transpose
 * (2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270,
 * 7 TRANSVERSE, 8 ROTATE_90). The stored box is decoded (restart fast path included) into
 * a temporary block, which is then permuted into the caller's buffer. */
static const int ORIENT_T[9] = {0, 0, 0, 0, 0, 1, 1, 1, 1};
static const int ORIENT_FY[9] = {0, 0, 0, 1, 1, 0, 1, 1, 0};
static const int ORIENT_FX[9] = {0, 0, 1, 1, 0, 0, 0, 1, 1};

/* Image height and width from the header; 0 with r->status set on failure. */
static int stored_dims(const unsigned char *src, size_t len, Region *r, long *h, long *w) {
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    if (planes_magic(src, len)) {
        PlanesInfo p;
        const char *why = planes_parse(src, len, &p);
        if (why != NULL) {
            snprintf(r->message, sizeof(r->message), "%s", why);
            r->status = ERR_PLANES;
            return 0;
        }
        *h = p.height;
        *w = p.width;
        return 1;
    }
    setup_errors(&cinfo, &err, r->message);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        r->status = ERR_JPEG;
        return 0;
    }
    jpeg_mem_src(&cinfo, (unsigned char *)src, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    *h = cinfo.image_height;
    *w = cinfo.image_width;
    jpeg_destroy_decompress(&cinfo);
    return 1;
}

/* One pixel of PS bytes: a constant-size memcpy the compiler turns into plain moves. */
#define COPY_PX(PS, d, s) memcpy((d), (s), PS)

#define PERMUTE_BODY(PS)                                                                   \
    for (y = 0; y < out_rows; y++) {                                                       \
        unsigned char *d = dst + (size_t)y * out_cols * PS;                               \
        if (!t) {                                                                          \
            const unsigned char *srow = src + (size_t)(fy ? rows - 1 - y : y) * cols * PS; \
            if (!fx) { memcpy(d, srow, (size_t)cols * PS); continue; }                     \
            for (x = 0; x < out_cols; x++) COPY_PX(PS, d + x * PS, srow + (cols - 1 - x) * PS); \
        } else { /* output row y = source column y (mirrored by fx), read down the rows */ \
            const unsigned char *scol = src + (size_t)(fx ? cols - 1 - y : y) * PS;       \
            if (!fy)                                                                       \
                for (x = 0; x < out_cols; x++) COPY_PX(PS, d + x * PS, scol + (size_t)x * cols * PS); \
            else                                                                           \
                for (x = 0; x < out_cols; x++)                                             \
                    COPY_PX(PS, d + x * PS, scol + (size_t)(rows - 1 - x) * cols * PS);    \
        }                                                                                  \
    }

static void permute(const unsigned char *src, long rows, long cols, int ps, int t, int fy,
                    int fx, unsigned char *dst) {
    long out_rows = t ? cols : rows, out_cols = t ? rows : cols, y, x;
    if (ps == 4) { PERMUTE_BODY(4) } else { PERMUTE_BODY(3) }
}

static void decode_oriented(const unsigned char *src, size_t len, Region *r, int orient) {
    int t = ORIENT_T[orient], fy = ORIENT_FY[orient], fx = ORIENT_FX[orient];
    long hs, ws, hd, wd;
    size_t need;
    Region s;
    if (orient == 1) {
        decode_region_nogil(src, len, r);
        return;
    }
    if (!stored_dims(src, len, r, &hs, &ws)) return;
    hd = t ? ws : hs;
    wd = t ? hs : ws;
    r->image_h = hd;
    r->image_w = wd;
    if (!box_ok(r)) {
        r->status = ERR_BOX;
        return;
    }
    s = *r;
    if (t) { s.top = r->left; s.left = r->top; s.height = r->width; s.width = r->height; }
    if (fy) s.top = hs - s.top - s.height;
    if (fx) s.left = ws - s.left - s.width;
    /* the stored block: its rows <= box rows at scale + 2, its columns <= the scaled width */
    need = (size_t)(s.height * s.scale_num / 8 + 2) * (size_t)((ws * s.scale_num + 7) / 8 + 1) *
           (size_t)s.pixel_size;
    if (need > (size_t)r->out_size) need = (size_t)r->out_size;
    s.out_size = (Py_ssize_t)need;
    s.out = r->tmp != NULL && need <= r->tmp_size ? r->tmp
                                                   : (unsigned char *)malloc(need ? need : 1);
    if (s.out == NULL) {
        strcpy(r->message, "out of memory");
        r->status = ERR_JPEG;
        return;
    }
    decode_region_nogil(src, len, &s);
    if (s.status == OK || s.status == ERR_TRUNCATED) {
        long u0 = fy ? s.scaled_h - s.y0 - s.rows : s.y0;
        long v0 = fx ? s.scaled_w - s.x0 - s.cols : s.x0;
        r->y0 = t ? v0 : u0;
        r->x0 = t ? u0 : v0;
        r->rows = t ? s.cols : s.rows;
        r->cols = t ? s.rows : s.cols;
        r->scaled_h = t ? s.scaled_w : s.scaled_h;
        r->scaled_w = t ? s.scaled_h : s.scaled_w;
        permute(s.out, s.rows, s.cols, s.pixel_size, t, fy, fx, r->out);
    } else if (s.status == ERR_OUT) {
        r->rows = t ? s.cols : s.rows;
        r->cols = t ? s.rows : s.cols;
    }
    if (s.out != r->tmp)
        free(s.out);
    memcpy(r->message, s.message, sizeof(r->message));
    r->status = s.status;
}

static void planes_buffers_free(Region *r) {
    free(r->work);
    free(r->tmp);
    free(r->win);
    r->work = NULL;
    r->tmp = NULL;
    r->win = NULL;
}

/* A planes record is decoded straight from the caller's (possibly mapped) memory, with
   no copy: every read runs under the SIGBUS guard, and the buffers are allocated before
   it (sized from the 16-byte header copy `head`), so a fault leaks nothing. NULL, or the
   faulting address. */
static const char *planes_in_place(const unsigned char *src, size_t len,
                                   const unsigned char *head, Region *r, int orient) {
    BusGuard g;
    unsigned long h, w, side, box = r->height > r->width ? r->height : r->width;
    planes_header_dims(head, &h, &w);
    side = h > w ? h : w;
    if (side > PLANES_MAX_SIDE) side = 1; /* refused by planes_parse inside */
    r->work = malloc(planes_work_bytes((long)side));
    if (orient != 1) { /* decode_oriented's block: box rows + 2 by stored width + 1 */
        r->tmp_size = (size_t)(box + 2) * (size_t)(side + 1) * (size_t)r->pixel_size;
        if (r->tmp_size > (size_t)r->out_size) r->tmp_size = (size_t)r->out_size;
        r->tmp = (unsigned char *)malloc(r->tmp_size ? r->tmp_size : 1);
    }
    if (head[4] == PLANES_PACKED) {
        /* any region planes_region makes of the box, either way round: rows <= box, columns
           <= box + 2 widened to 3 iMCUs (48) and aligned down (15) */
        unsigned long rows = box < side ? box : side, cols = box + 65 < side ? box + 65 : side;
        r->win_size = planes_window_bytes((long)rows, (long)cols);
        r->win = (unsigned char *)malloc(r->win_size);
    }
    if (r->work == NULL || (orient != 1 && r->tmp == NULL) ||
        (head[4] == PLANES_PACKED && r->win == NULL)) {
        planes_buffers_free(r);
        strcpy(r->message, "out of memory");
        r->status = ERR_PLANES;
        return NULL;
    }
    g.addr = NULL;
    if (sigsetjmp(g.env, 1) != 0) {
        planes_buffers_free(r);
        return g.addr != NULL ? g.addr : (const char *)src;
    }
    tls_bus = &g;
    decode_oriented(src, len, r, orient);
    tls_bus = NULL;
    planes_buffers_free(r);
    return NULL;
}

static PyObject *region_error(const Region *r) {
    switch (r->status) {
    case ERR_JPEG:
        return PyErr_Format(PyExc_ValueError, "JPEG decode error: %s", r->message);
    case ERR_TRUNCATED:
        return PyErr_Format(PyExc_ValueError, "truncated JPEG data: %s", r->message);
    case ERR_PLANES:
        return PyErr_Format(PyExc_ValueError, "decoded-planes record: %s", r->message);
    case ERR_BOMB:
        return PyErr_Format(PyExc_ValueError,
                            "the record header claims %ld x %ld pixels: the %zd-byte output "
                            "buffer is smaller than the whole image at the decode scale (a "
                            "decompression bomb, or "
                            "an index entry that does not match the record)",
                            r->image_h, r->image_w, r->limit);
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

#define MAX_JPEG_SIDE 65535

/* Decode r's box of src (a JPEG or a planes record, possibly memory-mapped), the GIL
   released by the caller: a JPEG from a private copy (libjpeg never reads mapped memory),
   a planes record in place under the guard. NULL, or the address of a SIGBUS. */
static const char *decode_any_nogil(const unsigned char *src, size_t len, Region *r,
                                    int orientation) {
    unsigned char head[PLANES_HEADER_SIZE], *copy;
    const char *fault;
    if (len >= PLANES_HEADER_SIZE) {
        if ((fault = copy_guarded(head, src, sizeof(head))) != NULL)
            return fault;
        if (planes_magic(head, sizeof(head)))
            return planes_in_place(src, len, head, r, orientation);
    }
    if ((copy = (unsigned char *)malloc(len > 0 ? len : 1)) == NULL) {
        strcpy(r->message, "out of memory");
        r->status = ERR_JPEG;
        return NULL;
    }
    fault = copy_guarded(copy, src, len);
    if (fault == NULL)
        decode_oriented(copy, len, r, orientation);
    free(copy);
    return fault;
}

/* The checks decode_region and decode_resized share; 0 with a ValueError set. */
static int region_args_ok(const Region *r, int orientation) {
    if (r->scale_num < 1 || r->scale_num > 16 || (r->pixel_size != 3 && r->pixel_size != 4) ||
        orientation < 1 || orientation > 8) {
        PyErr_Format(PyExc_ValueError, "scale_num %d not in 1..16, pixel_size %d not 3 or 4, "
                     "or EXIF orientation %d not in 1..8", r->scale_num, r->pixel_size,
                     orientation);
        return 0;
    }
    if (r->top < 0 || r->left < 0 || r->height < 1 || r->width < 1 || r->top > MAX_JPEG_SIDE ||
        r->left > MAX_JPEG_SIDE || r->height > MAX_JPEG_SIDE || r->width > MAX_JPEG_SIDE) {
        PyErr_Format(PyExc_ValueError, "crop box (top=%ld, left=%ld, height=%ld, width=%ld) "
                     "is not inside any JPEG (sides are 1..%d pixels)", r->top, r->left,
                     r->height, r->width, MAX_JPEG_SIDE);
        return 0;
    }
    return 1;
}

static PyObject *py_decode_region(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    Region r;
    const char *fault;
    int orientation = 1;
    (void)self;
    memset(&r, 0, sizeof(r));
    r.pixel_size = 3;
    if (!PyArg_ParseTuple(args, "y*w*lllli|ii", &src, &out, &r.top, &r.left, &r.height,
                          &r.width, &r.scale_num, &r.pixel_size, &orientation))
        return NULL;
    if (!region_args_ok(&r, orientation)) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return NULL;
    }
    r.out = (unsigned char *)out.buf;
    r.out_size = r.limit = out.len;
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    fault = decode_any_nogil((const unsigned char *)src.buf, (size_t)src.len, &r, orientation);
    Py_END_ALLOW_THREADS
    if (fault != NULL)
        bus_error("decode_region", src.buf, src.len, fault);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (fault != NULL)
        return NULL;
    if (r.status != OK)
        return region_error(&r);
    return Py_BuildValue("llllllll", r.y0, r.x0, r.rows, r.cols, r.scaled_h, r.scaled_w,
                         r.image_h, r.image_w);
}

static PyObject *py_header(PyObject *self, PyObject *args) {
    Py_buffer src;
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    char message[JMSG_LENGTH_MAX];
    long h, w, c;
    unsigned char *volatile copy;
    const char *fault;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &src))
        return NULL;
    copy = (unsigned char *)malloc(src.len > 0 ? (size_t)src.len : 1);
    if (copy == NULL) {
        PyBuffer_Release(&src);
        return PyErr_NoMemory();
    }
    keep_sigbus_handler();
    fault = copy_guarded(copy, (const unsigned char *)src.buf, (size_t)src.len);
    if (fault != NULL) {
        bus_error("header", src.buf, src.len, fault);
        free(copy);
        PyBuffer_Release(&src);
        return NULL;
    }
    setup_errors(&cinfo, &err, message);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(copy);
        PyBuffer_Release(&src);
        return PyErr_Format(PyExc_ValueError, "JPEG header error: %s", message);
    }
    jpeg_mem_src(&cinfo, copy, (unsigned long)src.len);
    jpeg_read_header(&cinfo, TRUE);
    h = cinfo.image_height;
    w = cinfo.image_width;
    c = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    free(copy);
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
    long long row_bytes, plane, planes;
    int flip_h, flip_v, ps = 3;
    BusGuard g;
    const char *volatile fault = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnllw*npp|i", &src, &offset, &row_stride, &h, &w, &dst,
                          &dst_offset, &flip_h, &flip_v, &ps))
        return NULL;
    if (h < 1 || w < 1 || (ps != 3 && ps != 4) || !mul_ok(ps, w, &row_bytes) ||
        row_stride < row_bytes || !block_fits(offset, h, row_stride, row_bytes, src.len) ||
        !mul_ok(h, w, &plane) || !mul_ok(3, plane, &planes) ||
        !block_fits(dst_offset, 1, 0, planes, dst.len)) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError,
                            "to_chw: block %ld x %ld x %d (offset %zd, row stride %zd) does not "
                            "fit a %zd-byte source or a %zd-byte destination at %zd",
                            h, w, ps, offset, row_stride, src.len, dst.len, dst_offset);
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    g.addr = NULL;
    if (sigsetjmp(g.env, 1) == 0) {
        tls_bus = &g;
        to_chw_nogil((const unsigned char *)src.buf + offset, row_stride, h, w, ps,
                     (unsigned char *)dst.buf + dst_offset, flip_h, flip_v);
        tls_bus = NULL;
    } else {
        fault = g.addr != NULL ? g.addr : (const char *)src.buf;
    }
    Py_END_ALLOW_THREADS
    if (fault != NULL)
        bus_error("to_chw", src.buf, src.len, fault);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (fault != NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* gather(src, src_offsets, lengths, dst, dst_offsets): memcpy n byte ranges of src into
   dst (offsets/lengths: contiguous int64 buffers of one length). All ranges are checked
   first (overflow-checked); the copies run without the GIL, under the SIGBUS guard. */
static PyObject *py_gather(PyObject *self, PyObject *args) {
    Py_buffer src, so, ln, dst, dof;
    Py_ssize_t n, i;
    const long long *s_off, *len, *d_off;
    BusGuard g;
    const char *volatile fault = NULL;
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
        if (!block_fits(s_off[i], 1, 0, len[i], src.len) ||
            !block_fits(d_off[i], 1, 0, len[i], dst.len)) {
            PyErr_Format(PyExc_ValueError, "gather: range %zd (%lld bytes from %lld to %lld) "
                         "does not fit a %zd-byte source and %zd-byte destination", i, len[i],
                         s_off[i], d_off[i], src.len, dst.len);
            goto fail;
        }
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    g.addr = NULL;
    if (sigsetjmp(g.env, 1) == 0) {
        tls_bus = &g;
        for (i = 0; i < n; i++)
            memcpy((char *)dst.buf + d_off[i], (const char *)src.buf + s_off[i], (size_t)len[i]);
        tls_bus = NULL;
    } else {
        fault = g.addr != NULL ? g.addr : (const char *)src.buf;
    }
    Py_END_ALLOW_THREADS
    if (fault != NULL) {
        bus_error("gather", src.buf, src.len, fault);
        goto fail;
    }
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
   block at src_offset into dst at dst_offset as CHW planes. Checked first (overflow-
   checked), then run without the GIL under the SIGBUS guard: a batch of raw crops in one
   call. */
static PyObject *py_crop_chw(PyObject *self, PyObject *args) {
    Py_buffer src, prm, dst;
    long h, w;
    long long row_bytes, plane, planes;
    Py_ssize_t n, i;
    const long long *p;
    BusGuard g;
    const char *volatile fault = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*llw*", &src, &prm, &h, &w, &dst))
        return NULL;
    n = prm.len / (5 * 8);
    p = (const long long *)prm.buf;
    if (prm.len % 40 || h < 1 || w < 1 || !mul_ok(3, w, &row_bytes) || !mul_ok(h, w, &plane) ||
        !mul_ok(3, plane, &planes)) {
        PyErr_SetString(PyExc_ValueError, "crop_chw: params must be an int64 (n, 5) array "
                                          "and height, width >= 1 (and not absurdly large)");
        goto fail;
    }
    for (i = 0; i < n; i++) {
        const long long *q = p + 5 * i;
        if (q[1] < row_bytes || !block_fits(q[0], h, q[1], row_bytes, src.len) ||
            !block_fits(q[4], 1, 0, planes, dst.len)) {
            PyErr_Format(PyExc_ValueError, "crop_chw: block %zd (%ld x %ld at %lld, stride %lld "
                         "-> %lld) does not fit a %zd-byte source / %zd-byte destination",
                         i, h, w, q[0], q[1], q[4], src.len, dst.len);
            goto fail;
        }
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    g.addr = NULL;
    if (sigsetjmp(g.env, 1) == 0) {
        tls_bus = &g;
        for (i = 0; i < n; i++) {
            const long long *q = p + 5 * i;
            to_chw_nogil((const unsigned char *)src.buf + q[0], (Py_ssize_t)q[1], h, w, 3,
                         (unsigned char *)dst.buf + q[4], q[2] != 0, q[3] != 0);
        }
        tls_bus = NULL;
    } else {
        fault = g.addr != NULL ? g.addr : (const char *)src.buf;
    }
    Py_END_ALLOW_THREADS
    if (fault != NULL) {
        bus_error("crop_chw", src.buf, src.len, fault);
        goto fail;
    }
    PyBuffer_Release(&src); PyBuffer_Release(&prm); PyBuffer_Release(&dst);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&prm); PyBuffer_Release(&dst);
    return NULL;
}

/* add_restarts(src, interval=0) -> bytes or None: losslessly rewrite a sequential
   (baseline) JPEG with a restart marker every `interval` MCUs (0: every MCU; an interval
   that does not divide the MCU row gives a file the region decoder cannot enter midway)
   (jpeg_read_coefficients -> jpeg_write_coefficients with optimized Huffman tables; the DCT
   coefficients, hence the decoded pixels, are unchanged; APPn/COM segments are copied).
   None when there is nothing to do: progressive or arithmetic-coded files, files that are
   not 3-component, files that already have that restart interval. Every coefficient is
   entropy-decoded, so corrupt or truncated data raises ValueError. */
#define RESTART_MCUS 1
#define TRANSCODE_MAX_MEMORY (2048L * 1024 * 1024) /* ~200 Mpixel of 4:4:4 coefficients */

typedef struct {
    const unsigned char *src;
    size_t len;
    unsigned char *out;
    unsigned long out_len;
    long interval; /* MCUs per restart interval; 0: RESTART_MCUS */
    int fast;      /* try the bit-copying rewrite first (same tables) */
    int status; /* OK, ERR_JPEG, ERR_TRUNCATED, or -1: nothing to do */
    char message[JMSG_LENGTH_MAX];
} Transcode;

int fast_restarts(const unsigned char *s, size_t len, long interval, unsigned char **out,
                  size_t *out_len); /* _restarts.c */

static void add_restarts_nogil(Transcode *t) {
    struct jpeg_decompress_struct in;
    struct jpeg_compress_struct out;
    ErrorMgr err_in;
    jvirt_barray_ptr *coefs;
    jpeg_saved_marker_ptr mk;
    Layout L;
    int i;
    if (t->fast) { /* the bit-copying rewrite (_restarts.c); libjpeg below for the rest */
        unsigned char *o;
        size_t olen;
        if (fast_restarts(t->src, t->len, t->interval != 0 ? t->interval : RESTART_MCUS, &o,
                          &olen) == 1) {
            t->out = o;
            t->out_len = (unsigned long)olen;
            t->status = OK;
            return;
        }
    }
    setup_errors(&in, &err_in, t->message);
    out.err = &err_in.pub; /* one error manager: the compressor's errors jump too */
    jpeg_create_decompress(&in);
    jpeg_create_compress(&out);
    /* The rewrite buffers every coefficient of the image: a header claiming a huge image
       (a few hundred bytes can claim 65500 x 65500, 25 GB of coefficients) must fail
       with "insufficient memory", not allocate and zero it all. */
    in.mem->max_memory_to_use = TRANSCODE_MAX_MEMORY;
    t->out = NULL;
    t->out_len = 0;
    if (setjmp(err_in.jump)) {
        /* decoding errors come before jpeg_mem_dest; an error while writing (out of
           memory only) would leak its buffer: jpeg_mem_dest's *outbuffer may already be
           freed by a reallocation, so it must not be freed here */
        jpeg_destroy_compress(&out);
        jpeg_destroy_decompress(&in);
        t->out = NULL;
        t->status = ERR_JPEG;
        return;
    }
    jpeg_mem_src(&in, (unsigned char *)t->src, (unsigned long)t->len);
    jpeg_save_markers(&in, JPEG_COM, 0xFFFF);
    for (i = 0; i < 16; i++)
        jpeg_save_markers(&in, JPEG_APP0 + i, 0xFFFF);
    jpeg_read_header(&in, TRUE);
    if (!in.progressive_mode && !in.arith_code && in.num_components == 3 &&
        in.data_precision == 8) {
        long cols;
        parse_layout(t->src, t->len, &L);
        cols = L.cols > 0 ? L.cols : 1;
        if (t->interval <= 0 || t->interval > cols)
            for (t->interval = RESTART_MCUS < cols ? RESTART_MCUS : cols;
                 cols % t->interval; t->interval--) {}
    }
    if (in.progressive_mode || in.arith_code || in.num_components != 3 ||
        in.data_precision != 8 || L.cols < 1 || L.ri == t->interval) {
        /* still prove the data decodes */
        coefs = jpeg_read_coefficients(&in);
        (void)coefs;
        t->status = err_in.truncated ? ERR_TRUNCATED : -1;
        jpeg_destroy_compress(&out);
        jpeg_destroy_decompress(&in);
        return;
    }
    coefs = jpeg_read_coefficients(&in);
    if (err_in.truncated) {
        jpeg_destroy_compress(&out);
        jpeg_destroy_decompress(&in);
        t->status = ERR_TRUNCATED;
        return;
    }
    jpeg_copy_critical_parameters(&in, &out);
    out.restart_in_rows = 0;
    out.restart_interval = (unsigned int)t->interval;
    out.optimize_coding = TRUE;
    jpeg_mem_dest(&out, &t->out, &t->out_len);
    jpeg_write_coefficients(&out, coefs);
    for (mk = in.marker_list; mk != NULL; mk = mk->next) {
        if (out.write_JFIF_header && mk->marker == JPEG_APP0 && mk->data_length >= 5 &&
            memcmp(mk->data, "JFIF", 5) == 0)
            continue; /* written by the compressor */
        if (out.write_Adobe_marker && mk->marker == JPEG_APP0 + 14 && mk->data_length >= 5 &&
            memcmp(mk->data, "Adobe", 5) == 0)
            continue;
        jpeg_write_marker(&out, mk->marker, mk->data, mk->data_length);
    }
    jpeg_finish_compress(&out);
    jpeg_finish_decompress(&in);
    jpeg_destroy_compress(&out);
    jpeg_destroy_decompress(&in);
    t->status = OK;
}

static PyObject *py_add_restarts(PyObject *self, PyObject *args) {
    Py_buffer src;
    Transcode t;
    PyObject *res;
    (void)self;
    long interval = 0;
    int fast = 1;
    if (!PyArg_ParseTuple(args, "y*|lp", &src, &interval, &fast))
        return NULL;
    memset(&t, 0, sizeof(t));
    t.interval = interval;
    t.fast = fast;
    t.src = (const unsigned char *)src.buf;
    t.len = (size_t)src.len;
    Py_BEGIN_ALLOW_THREADS
    add_restarts_nogil(&t);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (t.status == -1)
        Py_RETURN_NONE;
    if (t.status == ERR_JPEG) {
        free(t.out);
        return PyErr_Format(PyExc_ValueError, "JPEG decode error: %s", t.message);
    }
    if (t.status == ERR_TRUNCATED) {
        free(t.out);
        return PyErr_Format(PyExc_ValueError, "truncated JPEG data: %s", t.message);
    }
    res = PyBytes_FromStringAndSize((const char *)t.out, (Py_ssize_t)t.out_len);
    free(t.out);
    return res;
}

typedef struct ResizePlan ResizePlan; /* _resize.c */
int resize_plan(ResizePlan **out, int ps, int rows, int cols, const float box[4], int oh,
                int ow); /* 0, -1: no memory, -2: past Pillow's coefficient limit */
void resize_run(ResizePlan *p, const unsigned char *src, size_t stride, unsigned char *dst,
                int chw, int flip_h, int flip_v);
void resize_free(ResizePlan *p);
const char *resize_isa(void);

/* fast_huffman([on]) -> bool: the switch before the call (on sets it) */
static PyObject *py_fast_huffman(PyObject *self, PyObject *args) {
    int on = -1, was = __atomic_load_n(&fast_scan_enabled, __ATOMIC_RELAXED);
    (void)self;
    if (!PyArg_ParseTuple(args, "|p", &on)) return NULL;
    if (on >= 0) __atomic_store_n(&fast_scan_enabled, on, __ATOMIC_RELAXED);
    return PyBool_FromLong(was);
}

static PyObject *py_fast_huffman_counts(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(kk)", __atomic_load_n(&fast_scan_taken, __ATOMIC_RELAXED),
                         __atomic_load_n(&fast_scan_refusals, __ATOMIC_RELAXED));
}

/* resize_isa() -> "avx2" or "scalar": which passes resize runs in this process. */
static PyObject *py_resize_isa(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(resize_isa());
}

/* The MemoryError of a resize whose plan could not be made (status -1 or -2). */
static PyObject *resize_refused(int status, int rows, int cols, const float box[4], int oh,
                                int ow) {
    char msg[512]; /* PyErr_Format has no %g */
    if (status != -2)
        return PyErr_NoMemory();
    snprintf(msg, sizeof msg,
             "resize: %d -> %d columns, %d -> %d rows (box %g, %g, %g, %g): the filter's "
             "coefficient tables pass Pillow's limit (output pixels x taps x 8 bytes <= "
             "2147483647 per axis), as Pillow refuses; resize in two steps or decode at a "
             "reduced scale first", cols, ow, rows, oh, box[0], box[1], box[2], box[3]);
    PyErr_SetString(PyExc_MemoryError, msg);
    return NULL;
}

/* resize(src, offset, row_stride, rows, cols, pixel_size, x0, y0, x1, y1, out_h, out_w, dst,
   dst_offset, flip_h, flip_v, chw=True): Pillow's antialiased BILINEAR resample of the
   float box (x0, y0, x1, y1) of a rows x cols RGB/RGBX block (see _resize.c), written into
   dst at dst_offset as CHW planes or HWC RGB, flipped. Without the GIL, reads guarded. */
static PyObject *py_resize(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t offset, row_stride, dst_offset;
    int rows, cols, ps, oh, ow, flip_h, flip_v, chw = 1, status = 0;
    float box[4];
    long long row_bytes, out_bytes;
    BusGuard g;
    const char *volatile fault = NULL;
    ResizePlan *plan = NULL; /* set before the sigsetjmp, never after */
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nniiiffffiiw*npp|p", &src, &offset, &row_stride, &rows,
                          &cols, &ps, &box[0], &box[1], &box[2], &box[3], &oh, &ow, &dst,
                          &dst_offset, &flip_h, &flip_v, &chw))
        return NULL;
    if (rows < 1 || cols < 1 || oh < 1 || ow < 1 || (ps != 3 && ps != 4) ||
        !mul_ok(ps, cols, &row_bytes) || row_stride < row_bytes ||
        !block_fits(offset, rows, row_stride, row_bytes, src.len) ||
        !mul_ok(oh, ow, &out_bytes) || !mul_ok(3, out_bytes, &out_bytes) ||
        !block_fits(dst_offset, 1, 0, out_bytes, dst.len) ||
        !(box[0] >= 0.0f && box[1] >= 0.0f && box[2] <= (float)cols && box[3] <= (float)rows &&
          box[2] >= box[0] && box[3] >= box[1])) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        char msg[512]; /* PyErr_Format has no %g */
        snprintf(msg, sizeof msg,
                 "resize: box (%g, %g, %g, %g) of a %d x %d x %d block (offset %zd, row stride "
                 "%zd, %zd-byte source) to %d x %d at %zd of a %zd-byte destination: expected a "
                 "box inside the block and both inside their buffers", box[0], box[1], box[2],
                 box[3], rows, cols, ps, offset, row_stride, src.len, oh, ow, dst_offset,
                 dst.len);
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    status = resize_plan(&plan, ps, rows, cols, box, oh, ow); /* outside the guard */
    g.addr = NULL;
    if (status != 0) {
        /* nothing to read */
    } else if (sigsetjmp(g.env, 1) == 0) {
        tls_bus = &g;
        resize_run(plan, (const unsigned char *)src.buf + offset, row_stride,
                   (unsigned char *)dst.buf + dst_offset, chw, flip_h, flip_v);
        tls_bus = NULL;
    } else {
        fault = g.addr != NULL ? g.addr : (const char *)src.buf;
    }
    resize_free(plan);
    Py_END_ALLOW_THREADS
    if (fault != NULL)
        bus_error("resize", src.buf, src.len, fault);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (fault != NULL)
        return NULL;
    if (status != 0)
        return resize_refused(status, rows, cols, box, oh, ow);
    Py_RETURN_NONE;
}

/* decode_resized(src, scratch, top, left, height, width, t_top, t_left, t_height, t_width,
 *                scale_num, within_box, out_h, out_w, dst, dst_offset, flip_h, flip_v,
 *                orientation) -> None
 * jpegdecode.decode_resized with `into`, in one call and one release of the GIL: the box
 * (top, left, height, width) of a JPEG or planes record decoded as RGBX into `scratch` at
 * scale_num / 8, the target box (floats; the same box unless an exact one) mapped into the
 * decoded block as Region.box does, the resize window chosen as jpegdecode._window does,
 * and the C resize written into dst as CHW planes. The arithmetic is the Python path's, in
 * the same double precision, so the pixels are the same (tests/reader/test_jpegdecode.py). */
/* Where decode_resized's resize reads: the float box in the decoded block (bx0..by1, its
   origin the block's), the window of the block it may read (ix0..iy1), and status: 0,
   BOX_OUTSIDE, or resize_plan's refusal. */
#define BOX_OUTSIDE (-100)
typedef struct {
    double bx0, by0, bx1, by1;
    long ix0, iy0, ix1, iy1;
    float box[4];
    int status;
} ResizeStep;

/* (The GIL released) r's box of src decoded into r->out (a scratch of r->out_size bytes),
   then the C resize of `target` (the float box, full-size upright pixels) to oh x ow CHW
   at dst, flipped. The address of a SIGBUS, or NULL: r->status and st->status say the
   rest. The caller checked the arguments (region_args_ok, the destination's extent). */
static const char *decode_resized_nogil(const unsigned char *src, size_t len, Region *r,
                                        const double target[4], int within_box, int oh, int ow,
                                        unsigned char *dst, int flip_h, int flip_v,
                                        int orientation, ResizeStep *st) {
    double f, oy, ox, dy = 0.0, dx = 0.0;
    ResizePlan *plan = NULL;
    const char *fault = decode_any_nogil(src, len, r, orientation);
    memset(st, 0, sizeof(*st));
    if (fault != NULL || r->status != OK)
        return fault;
    /* Region.box: full-size c -> c * n / 8 + d in the scaled image, minus the block's
       origin; d is non-zero only at reduced scale along an axis orientation mirrors */
    f = r->scale_num / 8.0;
    if (r->scale_num < 8) {
        int t = ORIENT_T[orientation], fy = ORIENT_FY[orientation], fx = ORIENT_FX[orientation];
        int flip_rows = t ? fx : fy, flip_cols = t ? fy : fx;
        if (flip_rows) dy = (double)r->scaled_h - (double)r->image_h * f;
        if (flip_cols) dx = (double)r->scaled_w - (double)r->image_w * f;
    }
    oy = (double)r->y0 - dy;
    ox = (double)r->x0 - dx;
    st->bx0 = target[1] * f - ox;
    st->by0 = target[0] * f - oy;
    st->bx1 = (target[1] + target[3]) * f - ox;
    st->by1 = (target[0] + target[2]) * f - oy;
    if (st->bx0 < 0.0) st->bx0 = 0.0;
    if (st->by0 < 0.0) st->by0 = 0.0;
    if (st->bx1 > (double)r->cols) st->bx1 = (double)r->cols;
    if (st->by1 > (double)r->rows) st->by1 = (double)r->rows;
    /* jpegdecode._window */
    st->ix0 = (long)floor(st->bx0);
    st->iy0 = (long)floor(st->by0);
    st->ix1 = (long)ceil(st->bx1);
    st->iy1 = (long)ceil(st->by1);
    if (st->ix0 < 0) st->ix0 = 0;
    if (st->iy0 < 0) st->iy0 = 0;
    if (st->ix1 > r->cols) st->ix1 = r->cols;
    if (st->iy1 > r->rows) st->iy1 = r->rows;
    if (!within_box && st->ix1 > st->ix0 && st->iy1 > st->iy0) {
        st->ix0 = st->iy0 = 0;
        st->ix1 = r->cols;
        st->iy1 = r->rows;
    }
    if (st->ix1 <= st->ix0 || st->iy1 <= st->iy0) {
        st->status = BOX_OUTSIDE;
        return NULL;
    }
    st->box[0] = (float)(st->bx0 - st->ix0);
    st->box[1] = (float)(st->by0 - st->iy0);
    st->box[2] = (float)(st->bx1 - st->ix0);
    st->box[3] = (float)(st->by1 - st->iy0);
    if (!(st->box[0] >= 0.0f && st->box[1] >= 0.0f && st->box[2] <= (float)(st->ix1 - st->ix0) &&
          st->box[3] <= (float)(st->iy1 - st->iy0) && st->box[2] >= st->box[0] &&
          st->box[3] >= st->box[1])) {
        st->status = BOX_OUTSIDE;
        return NULL;
    }
    st->status = resize_plan(&plan, 4, (int)(st->iy1 - st->iy0), (int)(st->ix1 - st->ix0),
                             st->box, oh, ow);
    if (st->status == 0)
        resize_run(plan, r->out + ((size_t)st->iy0 * (size_t)r->cols + (size_t)st->ix0) * 4,
                   (size_t)r->cols * 4, dst, 1, flip_h, flip_v);
    resize_free(plan);
    return NULL;
}

/* 1 when an oh x ow CHW output at dst_offset fits a dst_len-byte destination. */
static int chw_fits(int oh, int ow, Py_ssize_t dst_offset, Py_ssize_t dst_len) {
    long long out_bytes;
    return oh >= 1 && ow >= 1 && mul_ok(oh, ow, &out_bytes) && mul_ok(3, out_bytes, &out_bytes) &&
           block_fits(dst_offset, 1, 0, out_bytes, dst_len);
}

static PyObject *py_decode_resized(PyObject *self, PyObject *args) {
    Py_buffer src, scratch, dst;
    Region r;
    ResizeStep st;
    double target[4];
    Py_ssize_t dst_offset;
    int within_box, oh, ow, flip_h, flip_v, orientation;
    const char *fault;
    (void)self;
    memset(&r, 0, sizeof(r));
    r.pixel_size = 4;
    if (!PyArg_ParseTuple(args, "y*w*lllldddd" "ipiiw*nppi", &src, &scratch, &r.top, &r.left,
                          &r.height, &r.width, &target[0], &target[1], &target[2], &target[3],
                          &r.scale_num, &within_box, &oh, &ow, &dst, &dst_offset, &flip_h,
                          &flip_v, &orientation))
        return NULL;
    if (!region_args_ok(&r, orientation) || !chw_fits(oh, ow, dst_offset, dst.len)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "decode_resized: a %d x %d output at %zd of a "
                         "%zd-byte destination does not fit", oh, ow, dst_offset, dst.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&scratch);
        PyBuffer_Release(&dst);
        return NULL;
    }
    r.out = (unsigned char *)scratch.buf;
    r.out_size = r.limit = scratch.len;
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    fault = decode_resized_nogil((const unsigned char *)src.buf, (size_t)src.len, &r, target,
                                 within_box, oh, ow, (unsigned char *)dst.buf + dst_offset,
                                 flip_h, flip_v, orientation, &st);
    Py_END_ALLOW_THREADS
    if (fault != NULL)
        bus_error("decode_resized", src.buf, src.len, fault);
    PyBuffer_Release(&src);
    PyBuffer_Release(&scratch);
    PyBuffer_Release(&dst);
    if (fault != NULL)
        return NULL;
    if (r.status != OK)
        return region_error(&r);
    if (st.status == BOX_OUTSIDE) {
        char msg[256];
        snprintf(msg, sizeof msg, "resize: box (%g, %g, %g, %g) outside a %ldx%ld image",
                 st.bx0, st.by0, st.bx1, st.by1, r.rows, r.cols);
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    if (st.status != 0)
        return resize_refused(st.status, (int)(st.iy1 - st.iy0), (int)(st.ix1 - st.ix0), st.box,
                              oh, ow);
    Py_RETURN_NONE;
}

/* decode_resized_many(views, table, targets, scratch, dst, progress) -> done
   decode_resized for many records in one call (one GIL release): record i is bytes
   [offset, offset + length) of views[slot]; table is int64, MANY_COLUMNS per record (below),
   targets float64, 4 per record (the float box). Before each record, progress[0] (int64)
   gets its index. Stops at the first record that is flagged, whose arguments do not hold,
   or whose decode or resize fails, and returns its position (len: all done): the caller
   makes that one alone, which raises the error that names what is wrong with it. */
enum { M_SLOT, M_OFFSET, M_LENGTH, M_TOP, M_LEFT, M_HEIGHT, M_WIDTH, M_SCALE, M_WITHIN, M_OH,
       M_OW, M_DST, M_FLIP_H, M_FLIP_V, M_ORIENTATION, M_INDEX, M_FLAGGED, MANY_COLUMNS };

/* The Region (RGBX) of a table row's box and scale; a scale out of 1..16 becomes 0, which
   region_args_ok refuses. */
static void many_region(const long long *row, Region *r) {
    memset(r, 0, sizeof(*r));
    r->pixel_size = 4;
    r->top = (long)row[M_TOP];
    r->left = (long)row[M_LEFT];
    r->height = (long)row[M_HEIGHT];
    r->width = (long)row[M_WIDTH];
    r->scale_num = row[M_SCALE] < 1 || row[M_SCALE] > 16 ? 0 : (int)row[M_SCALE];
}

static PyObject *py_decode_resized_many(PyObject *self, PyObject *args) {
    PyObject *views, *seq = NULL;
    Py_buffer table, targets, scratch, dst, progress, *bufs = NULL;
    Py_ssize_t n = 0, nviews = 0, held = 0, i, ready;
    const long long *t;
    const double *g;
    long long *prog;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*y*w*w*w*", &views, &table, &targets, &scratch, &dst,
                          &progress))
        return NULL;
    if (table.len % (Py_ssize_t)(MANY_COLUMNS * sizeof(long long)) != 0 ||
        targets.len != table.len / MANY_COLUMNS / (Py_ssize_t)sizeof(long long) * 4 *
                       (Py_ssize_t)sizeof(double) ||
        progress.len < (Py_ssize_t)sizeof(long long) ||
        (seq = PySequence_Fast(views, "decode_resized_many: views must be a sequence")) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "decode_resized_many: table, targets or progress "
                            "has the wrong size");
        goto done;
    }
    n = table.len / MANY_COLUMNS / (Py_ssize_t)sizeof(long long);
    nviews = PySequence_Fast_GET_SIZE(seq);
    if ((bufs = (Py_buffer *)calloc(nviews > 0 ? (size_t)nviews : 1, sizeof(Py_buffer))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (held = 0; held < nviews; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &bufs[held], PyBUF_SIMPLE) < 0)
            goto done;
    t = (const long long *)table.buf; /* int64 columns (the caller's numpy array) */
    g = (const double *)targets.buf;
    prog = (long long *)progress.buf;
    /* the arguments of every record, checked with the GIL held (region_args_ok sets errors,
       cleared here: the record is then left to the caller) */
    for (ready = 0; ready < n; ready++) {
        const long long *row = t + ready * MANY_COLUMNS;
        Region r;
        many_region(row, &r);
        if (row[M_FLAGGED] || row[M_SLOT] < 0 || row[M_SLOT] >= nviews ||
            !block_fits(row[M_OFFSET], 1, 0, row[M_LENGTH], bufs[row[M_SLOT]].len) ||
            row[M_ORIENTATION] < 1 || row[M_ORIENTATION] > 8 ||
            row[M_OH] < 1 || row[M_OH] > INT_MAX || row[M_OW] < 1 || row[M_OW] > INT_MAX ||
            row[M_DST] < 0 || row[M_DST] > PY_SSIZE_T_MAX) /* before any cast below */
            break;
        if (!region_args_ok(&r, (int)row[M_ORIENTATION])) {
            PyErr_Clear();
            break;
        }
        if (!chw_fits((int)row[M_OH], (int)row[M_OW], (Py_ssize_t)row[M_DST], dst.len))
            break;
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < ready; i++) {
        const long long *row = t + i * MANY_COLUMNS;
        const Py_buffer *v = &bufs[row[M_SLOT]];
        Region r;
        ResizeStep st;
        const char *fault;
        prog[0] = row[M_INDEX];
        many_region(row, &r);
        r.out = (unsigned char *)scratch.buf;
        r.out_size = r.limit = scratch.len;
        fault = decode_resized_nogil((const unsigned char *)v->buf + row[M_OFFSET],
                                     (size_t)row[M_LENGTH], &r, g + 4 * i, (int)row[M_WITHIN],
                                     (int)row[M_OH], (int)row[M_OW],
                                     (unsigned char *)dst.buf + row[M_DST], (int)row[M_FLIP_H],
                                     (int)row[M_FLIP_V], (int)row[M_ORIENTATION], &st);
        if (fault != NULL || r.status != OK || st.status != 0)
            break;
    }
    Py_END_ALLOW_THREADS
    n = i;
done:
    while (held > 0)
        PyBuffer_Release(&bufs[--held]);
    free(bufs);
    Py_XDECREF(seq);
    PyBuffer_Release(&table);
    PyBuffer_Release(&targets);
    PyBuffer_Release(&scratch);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&progress);
    return PyErr_Occurred() ? NULL : PyLong_FromSsize_t(n);
}

/* ---- Decoded planes (the packer's --mode planes) ----------------------------------------
 * to_planes(src, max_pixels, packed=True) -> bytes or None: the record payload of _planes.h
 * (header + Y, Cb, Cr planes; packed in 8x8 blocks, or as they are) read with libjpeg's raw
 * data output (after the IDCT, before upsampling and colour conversion), or None for a JPEG
 * whose layout the planes reader does not reproduce (CMYK/YCCK, Adobe RGB, chroma sampled
 * other than 1x1 against Y's 1 or 2, a subsampled width libjpeg would not upsample with its
 * fancy filter). */
typedef struct {
    const unsigned char *src;
    size_t len;
    unsigned long long max_pixels;
    int packed;         /* write version 2 (planes_pack) rather than 1 */
    unsigned char *out; /* malloc'd payload */
    size_t out_len;
    int status;         /* OK, ERR_JPEG, ERR_TRUNCATED, ERR_BOMB, or -1: not supported */
    long height, width;
    char message[JMSG_LENGTH_MAX];
} PlanesJob;

static int planes_layout_ok(const struct jpeg_decompress_struct *c) {
    const jpeg_component_info *y = &c->comp_info[0];
    if (c->num_components == 1)
        return c->jpeg_color_space == JCS_GRAYSCALE;
    if (c->num_components != 3 || c->jpeg_color_space != JCS_YCbCr)
        return 0;
    if (y->h_samp_factor < 1 || y->h_samp_factor > 2 || y->v_samp_factor < 1 ||
        y->v_samp_factor > 2)
        return 0;
    if (c->comp_info[1].h_samp_factor != 1 || c->comp_info[1].v_samp_factor != 1 ||
        c->comp_info[2].h_samp_factor != 1 || c->comp_info[2].v_samp_factor != 1)
        return 0;
    /* libjpeg upsamples 2:1 horizontally with the fancy filter only beyond 2 samples */
    return y->h_samp_factor == 1 || (c->image_width + 1) / 2 > 2;
}

/* fast: our Huffman decoder may take the scan (_huffman.c), as in decode_stream */
static void to_planes_run(PlanesJob *j, int fast) {
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    unsigned char *volatile plane[3] = {NULL, NULL, NULL}; /* padded component buffers */
    JSAMPROW *volatile ptrs = NULL;
    FastScan *volatile scan = NULL;
    size_t stride[3], prows[3];
    long rows_per[3], dh[3], dw[3];
    int c, ncomp;
    setup_errors(&cinfo, &err, j->message);
    jpeg_create_decompress(&cinfo);
    cinfo.client_data = NULL; /* kept by jpeg_create_decompress: ours to set */
    if (setjmp(err.jump)) {
        int again = fast_scan_refused(scan);
        jpeg_destroy_decompress(&cinfo);
        for (c = 0; c < 3; c++) free(plane[c]);
        free(ptrs);
        free(j->out);
        fast_scan_free(scan);
        j->out = NULL;
        if (again) /* damaged entropy data: libjpeg alone decodes (or conceals) it as ever */
            to_planes_run(j, 0);
        else if (j->status == OK)
            j->status = ERR_JPEG;
        return;
    }
    jpeg_mem_src(&cinfo, (unsigned char *)j->src, (unsigned long)j->len);
    jpeg_read_header(&cinfo, TRUE);
    j->height = cinfo.image_height;
    j->width = cinfo.image_width;
    if ((unsigned long long)j->height * j->width > j->max_pixels) {
        jpeg_destroy_decompress(&cinfo);
        j->status = ERR_BOMB;
        return;
    }
    if (!planes_layout_ok(&cinfo)) {
        jpeg_destroy_decompress(&cinfo);
        j->status = -1;
        return;
    }
    ncomp = cinfo.num_components;
    cinfo.raw_data_out = TRUE;
    jpeg_start_decompress(&cinfo);
    if (fast)
        scan = fast_scan_start(&cinfo, j->src, j->len);
    j->out_len = PLANES_HEADER_SIZE;
    for (c = 0; c < ncomp; c++) {
        jpeg_component_info *ci = &cinfo.comp_info[c];
        long blocks_w = (long)(ci->width_in_blocks + ci->h_samp_factor - 1) /
                        ci->h_samp_factor * ci->h_samp_factor;
        rows_per[c] = (long)ci->v_samp_factor * DCTSIZE;
        stride[c] = (size_t)blocks_w * DCTSIZE;
        prows[c] = (size_t)cinfo.total_iMCU_rows * (size_t)rows_per[c];
        dh[c] = (long)ci->downsampled_height;
        dw[c] = (long)ci->downsampled_width;
        if ((plane[c] = (unsigned char *)malloc(stride[c] * prows[c])) == NULL)
            ERREXIT1(&cinfo, JERR_OUT_OF_MEMORY, 1);
        j->out_len += j->packed ? planes_packed_bound(dh[c], dw[c]) : (size_t)dh[c] * (size_t)dw[c];
    }
    if ((ptrs = (JSAMPROW *)malloc(sizeof(JSAMPROW) * 3 * 2 * DCTSIZE)) == NULL ||
        (j->out = (unsigned char *)malloc(j->out_len)) == NULL)
        ERREXIT1(&cinfo, JERR_OUT_OF_MEMORY, 2);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPARRAY arrays[3];
        size_t imcu = cinfo.output_scanline / ((size_t)cinfo.max_v_samp_factor * DCTSIZE);
        for (c = 0; c < ncomp; c++) {
            long k;
            arrays[c] = ptrs + c * 2 * DCTSIZE;
            for (k = 0; k < rows_per[c]; k++)
                arrays[c][k] = plane[c] + (imcu * (size_t)rows_per[c] + (size_t)k) * stride[c];
        }
        if (jpeg_read_raw_data(&cinfo, arrays, (JDIMENSION)(cinfo.max_v_samp_factor * DCTSIZE)) == 0)
            break; /* suspended: cannot happen with a memory source, which never suspends */
    }
    {
        unsigned char *o = j->out;
        memcpy(o, PLANES_MAGIC, 4);
        o[4] = j->packed ? PLANES_PACKED : PLANES_PLAIN;
        o[5] = (unsigned char)ncomp;
        o[6] = (unsigned char)(ncomp == 3 ? cinfo.comp_info[0].h_samp_factor : 1);
        o[7] = (unsigned char)(ncomp == 3 ? cinfo.comp_info[0].v_samp_factor : 1);
        for (c = 0; c < 4; c++) {
            o[8 + c] = (unsigned char)((unsigned long)j->height >> (8 * c));
            o[12 + c] = (unsigned char)((unsigned long)j->width >> (8 * c));
        }
        o += PLANES_HEADER_SIZE;
        for (c = 0; c < ncomp; c++) {
            long y;
            if (j->packed)
                o += planes_pack(plane[c], dh[c], dw[c], stride[c], o);
            else
                for (y = 0; y < dh[c]; y++, o += dw[c])
                    memcpy(o, plane[c] + (size_t)y * stride[c], (size_t)dw[c]);
        }
        j->out_len = (size_t)(o - j->out);
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    for (c = 0; c < 3; c++) free(plane[c]);
    free(ptrs);
    fast_scan_free(scan);
    j->status = err.truncated ? ERR_TRUNCATED : OK;
    if (j->status != OK) {
        free(j->out);
        j->out = NULL;
    }
}

static void to_planes_nogil(PlanesJob *j) { to_planes_run(j, 1); }

static PyObject *py_to_planes(PyObject *self, PyObject *args) {
    Py_buffer src;
    PlanesJob j;
    unsigned long long max_pixels;
    unsigned char *copy;
    const char *fault;
    PyObject *result;
    int packed = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*K|p", &src, &max_pixels, &packed))
        return NULL;
    memset(&j, 0, sizeof(j));
    j.packed = packed;
    j.len = (size_t)src.len;
    j.max_pixels = max_pixels;
    copy = (unsigned char *)malloc(src.len > 0 ? (size_t)src.len : 1);
    if (copy == NULL) {
        PyBuffer_Release(&src);
        return PyErr_NoMemory();
    }
    keep_sigbus_handler();
    Py_BEGIN_ALLOW_THREADS
    fault = copy_guarded(copy, (const unsigned char *)src.buf, (size_t)src.len);
    if (fault == NULL) {
        j.src = copy;
        to_planes_nogil(&j);
    }
    Py_END_ALLOW_THREADS
    free(copy);
    if (fault != NULL) {
        bus_error("to_planes", src.buf, src.len, fault);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyBuffer_Release(&src);
    switch (j.status) {
    case OK:
        result = PyBytes_FromStringAndSize((const char *)j.out, (Py_ssize_t)j.out_len);
        free(j.out);
        return result;
    case -1:
        Py_RETURN_NONE;
    case ERR_BOMB:
        return PyErr_Format(PyExc_ValueError, "the JPEG header claims %ld x %ld pixels, more "
                            "than the %llu allowed", j.height, j.width, j.max_pixels);
    case ERR_TRUNCATED:
        return PyErr_Format(PyExc_ValueError, "truncated JPEG data: %s", j.message);
    default:
        return PyErr_Format(PyExc_ValueError, "JPEG decode error: %s", j.message);
    }
}

static PyMethodDef methods[] = {
    {"add_restarts", py_add_restarts, METH_VARARGS,
     "add_restarts(src, interval=0) -> bytes or None: lossless rewrite with a restart marker "
     "every `interval` MCUs (0: every MCU)"},
    {"crop_chw", py_crop_chw, METH_VARARGS,
     "crop_chw(src, params_int64_nx5, height, width, dst): batch of HWC crops -> CHW"},
    {"gather", py_gather, METH_VARARGS,
     "gather(src, src_offsets, lengths, dst, dst_offsets): copy int64-described byte ranges"},
    {"decode_region", py_decode_region, METH_VARARGS,
     "decode_region(src, out, top, left, height, width, scale_num, pixel_size=3, "
     "orientation=1) -> (y0, x0, rows, cols, scaled_height, scaled_width, height, width), "
     "all in the upright image"},
    {"decode_resized_many", py_decode_resized_many, METH_VARARGS,
     "decode_resized_many(views, table, targets, scratch, dst, progress) -> done: "
     "decode_resized for many records, one GIL release; stops at the first it cannot make"},
    {"decode_resized", py_decode_resized, METH_VARARGS,
     "decode_resized(src, scratch, top, left, height, width, t_top, t_left, t_height, "
     "t_width, scale_num, within_box, out_h, out_w, dst, dst_offset, flip_h, flip_v, "
     "orientation): decode_region + the C resize into CHW, one call"},
    {"header", py_header, METH_VARARGS, "header(src) -> (height, width, components)"},
    {"resize", py_resize, METH_VARARGS,
     "resize(src, offset, row_stride, rows, cols, pixel_size, x0, y0, x1, y1, out_h, out_w, "
     "dst, dst_offset, flip_h, flip_v, chw=True): Pillow's antialiased BILINEAR of a box"},
    {"fast_huffman", py_fast_huffman, METH_VARARGS,
     "fast_huffman([on]) -> bool: whether our Huffman decoder takes baseline scans from "
     "libjpeg's (the state before the call; on sets it; DLPACK_IO_LIBJPEG_HUFFMAN=1 at "
     "import: off)"},
    {"fast_huffman_counts", py_fast_huffman_counts, METH_NOARGS,
     "fast_huffman_counts() -> (taken, refused): scans our Huffman decoder took from libjpeg "
     "in this process, and those it handed back as damaged"},
    {"resize_isa", py_resize_isa, METH_NOARGS,
     "resize_isa() -> 'avx2' or 'scalar': the passes resize runs (DLPACK_IO_NO_AVX2=1: scalar)"},
    {"to_planes", py_to_planes, METH_VARARGS,
     "to_planes(src, max_pixels, packed=True) -> bytes or None: a JPEG's Y/Cb/Cr planes as "
     "libjpeg leaves them before upsampling (a decoded-planes record: version 2, packed in "
     "8x8 blocks, or version 1 as they are), None where the layout is not kept"},
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
    if (MappedFileError == NULL) {
        MappedFileError = PyErr_NewExceptionWithDoc(
            "dlpack_io.reader._jpeg.MappedFileError",
            "A memory-mapped source changed under a read (SIGBUS): truncated or rewritten.",
            PyExc_ValueError, NULL);
        if (MappedFileError == NULL || install_sigbus_handler() != 0) {
            Py_DECREF(m);
            return MappedFileError == NULL ? NULL : PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    planes_init();
    {
        const char *off = getenv("DLPACK_IO_LIBJPEG_HUFFMAN");
        __atomic_store_n(&fast_scan_enabled, off == NULL || off[0] == 0 || strcmp(off, "0") == 0,
                         __ATOMIC_RELAXED);
    }
    Py_INCREF(MappedFileError);
    if (PyModule_AddObject(m, "MappedFileError", MappedFileError) < 0) {
        Py_DECREF(MappedFileError);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
                            LIBJPEG_TURBO_VERSION_NUMBER
#else
                            0
#endif
    );
    return m;
}
