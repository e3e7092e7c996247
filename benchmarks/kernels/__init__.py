"""Benchmark the fused Triton kernels on the loader's real cases against copy bandwidth.

    python -m benchmarks.kernels               # GPU: table + bench-out/kernels.json
    python -m benchmarks.kernels --cpu-smoke   # tiny, Triton interpreter, no GPU

(from the repository root; docs/gpu.md's checklist runs it on a lent GPU.)

Cases: (1) raw records: dense 256x256 batch -> random 224 crops (``crop_flip_permute``);
(2) the JPEG loader: ImageNet-like photos (333..500 x 375..500), RandomResizedCrop boxes,
each decoded at the smallest libjpeg scale n/8 that keeps the box >= 224 (so regions are
1-2x the output, or smaller boxes upscaled), rounded out to MCU blocks, packed ragged into
one pinned slot with 64-byte records after the pixels; ``resized_crop_packed`` (antialias)
to 224, with and without ColorJitter. Timings: CUDA events, L2 flushed before each call,
median of ``--repeats``; "loop" = back-to-back calls. Bytes counted = bytes the kernel must
move: box pixels read (twice when contrast needs its mean pass) + records + output written;
the copy row is 2x its size. The end-to-end rows add the pinned host->device copy of the
slot: serial (copy then kernel on one stream) and overlapped (double-buffered side stream).
"""

# Modules: cases (inputs, timed cases, the correctness check), main (the command, the
# table, the verdicts).
