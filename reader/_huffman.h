/* Our Huffman decoder for baseline JPEG scans, in place of libjpeg's (_huffman.c). */
#ifndef DLPACK_HUFFMAN_H
#define DLPACK_HUFFMAN_H
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

typedef struct FastScan FastScan;

/* After jpeg_start_decompress: when the scan is one we decode (baseline Huffman, 8-bit, one
   interleaved scan, every restart interval present and in order, the scan ended by a marker),
   take over libjpeg's entropy decoding of it (cinfo->client_data and the entropy module's
   decode_mcu) and return the state, to give to fast_scan_free after the decode; else NULL
   and libjpeg decodes as it would have. src/len: the whole stream cinfo reads (jpeg_mem_src).
   Data that turns out to be damaged while decoding is refused: fast_scan_refused() is then
   1 and libjpeg's error_exit has been called (the caller decodes again with libjpeg, which
   reports or conceals the damage as it always did). */
FastScan *fast_scan_start(struct jpeg_decompress_struct *cinfo, const unsigned char *src,
                          size_t len);
int fast_scan_refused(const FastScan *fs);
void fast_scan_free(FastScan *fs);

/* Offset of the next marker's last 0xFF at or after p in entropy-coded data s[0..len)
   (0xFF00 is a stuffed byte, a run of 0xFF is fill before a marker), or len. */
size_t scan_next_marker(const unsigned char *s, size_t p, size_t len);

/* Process-wide switch (tests, and DLPACK_IO_LIBJPEG_HUFFMAN=1 at import): 0 leaves every
   scan to libjpeg. */
extern int fast_scan_enabled;
/* Scans taken from libjpeg, and those of them refused as damaged (process-wide, atomic). */
extern unsigned long fast_scan_taken, fast_scan_refusals;

#endif
