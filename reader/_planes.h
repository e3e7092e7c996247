/* Decoded-planes records (record kind 3): shared by _jpeg.c (which writes and reads them)
 * and _planes.c (which turns them into RGB). The layout is reader/format/spec.py's. */
#ifndef DLPACK_PLANES_H
#define DLPACK_PLANES_H
#include <stddef.h>

#define PLANES_MAGIC "DLYP"
#define PLANES_PLAIN 1   /* version 1: the planes' samples as they are */
#define PLANES_PACKED 2  /* version 2: each plane in 8x8 blocks, frame of reference packed */
#define PLANES_HEADER_SIZE 16
#define PLANES_MAX_SIDE 65535

typedef struct {
    int comps, hf, vf;             /* 1 or 3 components; chroma subsampling 1 or 2 */
    long height, width;            /* the stored image (Y plane) */
    long cheight, cwidth;          /* each chroma plane */
    /* Samples: row y, column x of Y at y[(y - oy) * ystride + x - ox] (chroma likewise with
       coy, cox, cstride): a whole plain record (origins 0), or the window planes_window
       unpacked from a packed one. */
    const unsigned char *y, *cb, *cr;
    long ystride, cstride, oy, ox, coy, cox;
    /* A packed record (version 2): per plane (Y, Cb, Cr), each block's minimum and bit width,
       then the blocks' packed samples; y, cb and cr are NULL until a window is unpacked. */
    int packed;
    const unsigned char *mins[3], *widths[3], *bits[3];
    const unsigned char *end;      /* the payload's end: block reads stay before it */
} PlanesInfo;

void planes_init(void);
int planes_magic(const unsigned char *s, size_t len);
/* height and width as the 16-byte header says them (unchecked: planes_parse checks) */
void planes_header_dims(const unsigned char *head, unsigned long *height, unsigned long *width);
const char *planes_parse(const unsigned char *s, size_t len, PlanesInfo *p);
size_t planes_work_bytes(long cols);
/* Packed records: the scratch a window of rows x cols (any subsampling) can need; unpack
   the blocks that rows y0.., columns x0.. (plus the chroma rows and columns upsampling reads
   around them) touch into scratch, describing them in *win; the packer's writer. */
size_t planes_window_bytes(long rows, long cols);
void planes_window(const PlanesInfo *p, long y0, long x0, long rows, long cols,
                   unsigned char *scratch, PlanesInfo *win);
size_t planes_packed_bound(long height, long width);
size_t planes_pack(const unsigned char *plane, long height, long width, size_t stride,
                   unsigned char *out);
void planes_rgb(const PlanesInfo *p, long y0, long x0, long rows, long cols, int ps,
                unsigned char *out, int *work);
#endif
