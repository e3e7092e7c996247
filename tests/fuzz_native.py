"""Time-bounded mutation fuzz of every entry point of the native extension ``_jpeg``.

Meant to run against a sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer,
see ``tests/reader/test_native_sanitizers.py``, which builds one and runs this): any out-of-bounds
access or undefined behaviour then aborts the process with a report. Each entry point gets
hostile arguments: mutated JPEGs and decoded-planes records (bit flips, truncations, spliced
and overwritten bytes, SOF sizes and restart intervals rewritten), boxes, strides, offsets
and sizes at and far past their limits, a fixed set of hostile resizes (hostile_resize), and
a source buffer truncated under the read (SIGBUS guard). Every call must return or raise
ValueError (MemoryError for a refused huge buffer).

    python tests/fuzz_native.py --seconds 40 --module-dir BUILD_DIR [--seed 0]
"""
from __future__ import annotations

import argparse
import importlib
import io
import mmap
import os
import random
import struct
import sys
import tempfile
import time

import numpy as np

HUGE = (2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -1, -(2**63))


def corpus(jpeg) -> list[bytes]:
    """Small valid JPEGs of every structure the decoder has a path for."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for (w, h), sub, prog in (((40, 30), 2, False), ((33, 17), 0, False), ((64, 48), 2, True),
                              ((16, 16), 1, False), ((48, 40), 2, False)):
        px = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, "JPEG", subsampling=sub, progressive=prog, quality=80)
        out.append(buf.getvalue())
    gray = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (20, 24), dtype=np.uint8)).save(gray, "JPEG")
    out.append(gray.getvalue())
    out += [r for r in (jpeg.add_restarts(d) for d in out[:2] + out[3:5]) if r]  # RST per MCU
    # decoded-planes records of the same images, packed (version 2) and plain (version 1)
    out += [p for d in out[:6]
            for p in (jpeg.to_planes(d, 1 << 40), jpeg.to_planes(d, 1 << 40, False)) if p]
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four random edits of ``data``."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randrange(len(buf)) if buf else 0
        if op == 0 and buf:
            buf[at] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[at] = rng.choice((0x00, 0xFF, 0xD0, 0xD9, 0xDA, 0xDD, rng.randrange(256)))
        elif op == 2:
            del buf[at:]
        elif op == 3:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 4:
            del buf[at:at + rng.randint(1, 64)]
        elif op == 5:  # rewrite the frame size or the restart interval
            for marker, offset in ((b"\xff\xc0", 5), (b"\xff\xc2", 5), (b"\xff\xdd", 4)):
                pos = buf.find(marker)
                if pos >= 0 and pos + offset + 4 <= len(buf):
                    first = rng.choice((0, 1, 7, 8, 255, 65500, 65535, rng.randrange(65536)))
                    second = rng.choice((0, 1, 16, 65535, rng.randrange(65536)))
                    struct.pack_into(">HH", buf, pos + offset, first, second)
        else:
            j = rng.randrange(len(buf)) if buf else 0
            buf[at:at + 8] = bytes(buf[j:j + 8])
    return bytes(buf)


def _size(rng: random.Random, limit: int) -> int:
    """A size: small, at the limit, just past it, or hostile."""
    return rng.choice((0, 1, 2, 3, limit - 1, limit, limit + 1, rng.randrange(max(limit, 1) + 1),
                       rng.choice(HUGE)))


def _call(fn, *args) -> None:
    try:
        fn(*args)
    except (ValueError, MemoryError, OverflowError):
        pass  # refused: the expected outcome for most hostile calls


def fuzz_decode(jpeg, rng, data) -> None:
    src = mutate(rng, data) if rng.random() < 0.9 else data
    h, w = (rng.randint(1, 80) for _ in range(2))
    out = np.empty(rng.choice((0, 16, h * w * 3, (h + 1) * w * 4 + 64, 65536)), np.uint8)
    box = [rng.choice((0, 1, rng.randrange(64), rng.choice(HUGE))) for _ in range(4)]
    _call(jpeg.decode_region, src, out, *box[:2], max(box[2], 1) if rng.random() < .7 else box[2],
          max(box[3], 1) if rng.random() < .7 else box[3], rng.choice((1, 2, 4, 8, 0, 16, 17)),
          rng.choice((3, 4, 0, 5)))
    _call(jpeg.header, src)


def _outcome(jpeg, src, out):
    """decode_region of the whole of src into out: its result or its error's text."""
    out[:] = 0
    try:
        h, w, _ = jpeg.header(src)
        if h * w > 512 * 512:
            return "too big"
        return jpeg.decode_region(src, out, 0, 0, h, w, 8, 3)
    except (ValueError, MemoryError) as e:
        return str(e)


def fuzz_huffman(jpeg, rng, data) -> None:
    """Our Huffman decoder against libjpeg's on damaged scans: the same pixels and decoded
    planes, the same errors (ours hands every scan it cannot decode exactly back to libjpeg)."""
    src = bytearray(data)
    scan = data.rfind(b"\xff\xda")
    if scan < 0 or len(src) < scan + 16:
        return
    for _ in range(rng.randint(1, 3)):  # damage inside the entropy-coded data
        at = rng.randrange(scan + 12, len(src) - 2)
        src[at] = rng.choice((0xFF, 0x00, rng.randrange(256), src[at] ^ (1 << rng.randrange(8))))
    src = bytes(src)
    a, b = np.empty(512 * 512 * 3, np.uint8), np.empty(512 * 512 * 3, np.uint8)
    outcomes = []
    for ours in (True, False):
        jpeg.fast_huffman(ours)
        outcomes.append((_outcome(jpeg, src, a if ours else b), _planes(jpeg, src)))
    jpeg.fast_huffman(True)
    if outcomes[0] != outcomes[1] or not np.array_equal(a, b):
        raise AssertionError(f"our Huffman decoder differs from libjpeg's: {outcomes!r}")


def _planes(jpeg, src):
    """to_planes of src: the record, or its error's text."""
    try:
        return jpeg.to_planes(src, 512 * 512)
    except (ValueError, MemoryError) as e:
        return str(e)


def fuzz_restarts(jpeg, rng, data) -> None:
    src = mutate(rng, data)
    try:
        h, w, _ = jpeg.header(src)
    except ValueError:
        h = w = 0
    if h * w <= 2048 * 2048:  # bigger claims are bounded by libjpeg's memory limit: slow
        _call(jpeg.add_restarts, src, rng.choice((0, 1, 2, 3, 7, -1, 2**40)))


def fuzz_copies(jpeg, rng) -> None:
    src = np.frombuffer(rng.randbytes(rng.randrange(1, 4096)), np.uint8)
    dst = np.empty(rng.randrange(1, 4096), np.uint8)
    n = src.size
    h, w, ps = rng.randint(1, 40), rng.randint(1, 40), rng.choice((3, 4, 0, 5))
    _call(jpeg.to_chw, src, _size(rng, n), _size(rng, w * 3), _size(rng, h) or 1,
          _size(rng, w) or 1, dst, _size(rng, dst.size), rng.random() < .5, rng.random() < .5, ps)
    params = np.array([[_size(rng, n), _size(rng, w * 3), rng.choice((0, 1, 2**40)),
                        rng.choice((0, 1)), _size(rng, dst.size)] for _ in range(rng.randint(0, 4))],
                      np.int64).reshape(-1, 5)
    _call(jpeg.crop_chw, src, params, _size(rng, h), _size(rng, w), dst)
    _fuzz_resize(jpeg, rng, src, dst, h, w, ps)
    k = rng.randint(0, 4)
    arrays = [np.array([_size(rng, lim) for _ in range(k)], np.int64) for lim in (n, n, dst.size)]
    _call(jpeg.gather, src, arrays[0], arrays[1], dst, arrays[2])


def _fuzz_resize(jpeg, rng, src, dst, h, w, ps) -> None:
    """resize with sizes, offsets and a float box near and past every limit."""
    edge = (0.0, -0.0, 0.5, float(w), w + 1e-3, -1e-3, float("nan"), float("inf"), 1e30)
    box = [rng.choice(edge) if rng.random() < .3 else rng.uniform(0, max(w, h)) for _ in range(4)]
    if rng.random() < .5:
        box = [min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])]
    _call(jpeg.resize, src, _size(rng, src.size), _size(rng, w * 4), _size(rng, h) or 1,
          _size(rng, w) or 1, ps, *box, _size(rng, 20), _size(rng, 20), dst,
          _size(rng, dst.size), rng.random() < .5, rng.random() < .5, rng.random() < .5)


def hostile_resize(jpeg) -> int:
    """resize on exact-size sources (any over-read is past the allocation) with boxes at,
    on and beyond the edges, zero-width boxes, 1-px outputs, upscales, odd widths around
    the AVX2 groups of 8, both flips, CHW and HWC; and filters past Pillow's coefficient
    limit (a 2**30 + 1 pixel row of a sparse map: the tap count overflowed int). Returns
    the number of calls."""
    rng, calls = np.random.default_rng(1), 0
    for rows, cols, ps in ((1, 1, 4), (2, 9, 4), (3, 17, 3), (9, 8, 4), (17, 33, 4), (5, 7, 3)):
        src = rng.integers(0, 256, rows * cols * ps, dtype=np.uint8)
        w, h = float(cols), float(rows)
        for box in ((0, 0, w, h), (w, h, w, h), (0, 0, 0, 0), (w - 1e-6, h - 1e-6, w, h),
                    (0, 0, 1e-30, 1e-45), (0.5, 0.5, w - 0.5, h - 0.5), (w / 3, h / 3, w / 2, h)):
            for oh, ow in ((1, 1), (1, 9), (9, 1), (3, 17), (33, 7), (2, 65), (rows, cols)):
                for chw, fh, fv in ((1, 0, 0), (1, 1, 1), (0, 1, 0)):
                    dst = np.empty(3 * oh * ow, np.uint8)
                    _call(jpeg.resize, src, 0, cols * ps, rows, cols, ps, *map(float, box), oh,
                          ow, dst, 0, fh, fv, chw)
                    calls += 1
    cols = 2**30 + 1
    with tempfile.NamedTemporaryFile() as f:
        f.truncate(cols * 4)
        f.flush()
        wide = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for oh, ow in ((1, 1), (1, 3)):
            _call(jpeg.resize, wide, 0, cols * 4, 1, cols, 4, 0.0, 0.0, float(cols), 1.0, oh, ow,
                  np.empty(3 * ow, np.uint8), 0, False, False)
            calls += 1
        wide.close()
    _call(jpeg.resize, np.zeros(4, np.uint8), 0, 4, 1, 1, 4, 0.0, 0.0, 1.0, 1.0, 1, 2**27,
          np.empty(3 * 2**27, np.uint8), 0, False, False)  # refused before ~10 GB of tables
    return calls + 1


def fuzz_many(jpeg, rng, data) -> None:
    """decode_resized_many: mutated records in up to three views, table rows (slot, offset,
    length, box, scale, output size, destination offset, orientation) near and past every
    limit, and tables, targets and progress of the wrong sizes."""
    views = [mutate(rng, data) if rng.random() < 0.7 else data for _ in range(rng.randint(1, 3))]
    oh, ow, n = rng.randint(1, 24), rng.randint(1, 24), rng.randint(0, 4)
    dst = np.empty(rng.choice((0, 3 * oh * ow, 4 * 3 * oh * ow)), np.uint8)
    rows = []
    for i in range(n):
        v = rng.randrange(len(views))
        box = [rng.choice((0, 1, rng.randrange(64), rng.choice(HUGE))) for _ in range(4)]
        rows.append([rng.choice((v, v, v, -1, len(views), rng.choice(HUGE))),
                     0 if rng.random() < .7 else _size(rng, len(views[v])),
                     len(views[v]) if rng.random() < .7 else _size(rng, len(views[v])),
                     box[0], box[1], max(box[2], 1) if rng.random() < .7 else box[2],
                     max(box[3], 1) if rng.random() < .7 else box[3],
                     rng.choice((1, 2, 4, 8, 0, 16, 17)), rng.choice((0, 1)),
                     oh if rng.random() < .8 else _size(rng, oh),
                     ow if rng.random() < .8 else _size(rng, ow),
                     i * 3 * oh * ow if rng.random() < .8 else _size(rng, dst.size),
                     rng.choice((0, 1)), rng.choice((0, 1)), rng.choice((1, 1, 2, 5, 8, 0, 9)),
                     i, int(rng.random() < .1)])
    table = np.array(rows, np.int64).reshape(-1, 17)
    targets = np.array([rng.choice((0.0, 1.5, 63.0, -2.0, 1e300)) for _ in range(4 * n)],
                       np.float64)
    progress = np.zeros(1, np.int64)
    if rng.random() < .1:  # the wrong shapes
        table, targets, progress = rng.choice(((table[:, :16].copy(), targets, progress),
                                               (table, targets[:-1], progress),
                                               (table, targets, progress[:0])))
    scratch = np.empty(rng.choice((0, 64, 65536, 1 << 20)), np.uint8)
    _call(jpeg.decode_resized_many, views, table, targets, scratch, dst, progress)


def fuzz_truncated_map(jpeg, rng, data) -> None:
    """A mapped source truncated under the read: every entry point raises, none dies."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(data + bytes(8192))
        f.flush()
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        os.truncate(f.name, 0)
        out = np.empty(65536, np.uint8)
        calls = (lambda: jpeg.gather(mm, np.array([0], np.int64), np.array([len(mm)], np.int64),
                                     out, np.array([0], np.int64)),
                 lambda: jpeg.to_chw(mm, 0, 30, 10, 10, out, 0, False, True),
                 lambda: jpeg.crop_chw(mm, np.array([[0, 30, 1, 0, 0]], np.int64), 10, 10, out),
                 lambda: jpeg.resize(mm, 0, 40, 10, 10, 4, 0.5, 0.0, 9.5, 10.0, 7, 7, out, 0,
                                     True, False),
                 lambda: jpeg.decode_region(mm, out, 0, 0, 8, 8, 8),
                 lambda: jpeg.decode_resized(mm, out, 0, 0, 8, 8, 0.0, 0.0, 8.0, 8.0, 8, True,
                                             4, 4, out, 0, False, False, 1),
                 lambda: jpeg.header(mm))
        for call in calls:
            try:
                call()
                raise AssertionError("a read of a truncated map returned")
            except jpeg.MappedFileError:
                pass
        # the many-record call stops at the record it could not read (its caller then reads
        # that one alone, which raises as above)
        table = np.array([[0, 0, len(data), 0, 0, 8, 8, 8, 1, 4, 4, 0, 0, 0, 1, 0, 0]], np.int64)
        done = jpeg.decode_resized_many([mm], table, np.array([0.0, 0.0, 8.0, 8.0]), out, out,
                                        np.zeros(1, np.int64))
        assert done == 0, done
        mm.close()


def run(module_dir: str, seconds: float, seed: int) -> dict:
    """Fuzz the ``_jpeg`` found in ``module_dir`` for ``seconds``; return call counts."""
    sys.path.insert(0, module_dir)
    jpeg = importlib.import_module("_jpeg")
    rng, data = random.Random(seed), corpus(jpeg)
    counts = {"decode": 0, "restarts": 0, "copies": 0, "many": 0, "sigbus": 0,
              "hostile_resize": hostile_resize(jpeg)}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sample = rng.choice(data)
        fuzz_decode(jpeg, rng, sample)
        fuzz_restarts(jpeg, rng, sample)
        fuzz_copies(jpeg, rng)
        fuzz_many(jpeg, rng, sample)
        fuzz_huffman(jpeg, rng, sample)
        counts["decode"] += 1
        counts["restarts"] += 1
        counts["copies"] += 1
        counts["many"] += 1
        if counts["decode"] % 500 == 1:
            fuzz_truncated_map(jpeg, rng, sample)
            counts["sigbus"] += 1
    counts["huffman_taken"], counts["huffman_refused"] = jpeg.fast_huffman_counts()
    return counts


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module-dir", required=True, help="folder holding the _jpeg build")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = run(args.module_dir, args.seconds, args.seed)
    print("fuzz_native: ok", " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


if __name__ == "__main__":
    main()
