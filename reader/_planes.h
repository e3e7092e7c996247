/* Decoded-planes records (record kind 3): shared by _jpeg.c (which writes and reads them)
 * and _planes.c (which turns them into RGB). The layout is reader/format/spec.py's. */
#ifndef DLPACK_PLANES_H
#define DLPACK_PLANES_H
#include <stddef.h>

#define PLANES_MAGIC "DLYP"
#define PLANES_VERSION 1
#define PLANES_HEADER_SIZE 16
#define PLANES_MAX_SIDE 65535

typedef struct {
    int comps, hf, vf;             /* 1 or 3 components; chroma subsampling 1 or 2 */
    long height, width;            /* the stored image (Y plane) */
    long cheight, cwidth;          /* each chroma plane */
    const unsigned char *y, *cb, *cr;
} PlanesInfo;

void planes_init(void);
int planes_magic(const unsigned char *s, size_t len);
/* height and width as the 16-byte header says them (unchecked: planes_parse checks) */
void planes_header_dims(const unsigned char *head, unsigned long *height, unsigned long *width);
const char *planes_parse(const unsigned char *s, size_t len, PlanesInfo *p);
size_t planes_work_bytes(long cols);
void planes_rgb(const PlanesInfo *p, long y0, long x0, long rows, long cols, int ps,
                unsigned char *out, int *work);
#endif
