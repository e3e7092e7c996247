"""Inputs, timed cases and the correctness check of the kernel benchmark
(benchmarks/kernels): the raw-records crop, the JPEG loader's ragged batch (regions decoded
at reduced scale, packed with 64-byte records in one slot), their torch eager baselines,
and the end-to-end rows."""
from __future__ import annotations

import math
import statistics
import time

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
JPEG_SCALES = (1, 2, 4, 8)  # libjpeg-turbo's SIMD scales n/8 (reader.jpegdecode.SCALES)
RECORD_BYTES = 64

# ----------------------------------------------------------------------------- timing

def time_call(fn, device, warmup: int, repeats: int, flush: bool = True) -> tuple[float, float]:
    """(median seconds per call, L2 flushed first unless ``flush`` is False; back to back)."""
    import torch
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), statistics.median(times)
    scrub = torch.empty(256 << 20, dtype=torch.uint8, device=device) if flush else None
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats + 1)]
    torch.cuda.synchronize()
    for start, end in events[:-1]:
        if scrub is not None:
            scrub.zero_()  # evict inputs from L2; also hides this call's launch latency
        start.record()
        fn()
        end.record()
    start, end = events[-1]
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    cold = statistics.median(s.elapsed_time(e) for s, e in events[:-1]) / 1e3
    return cold, start.elapsed_time(end) / 1e3 / repeats


# ----------------------------------------------------------------------------- inputs

def rrc_box(g, h: int, w: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)) box (top, left, h, w)."""
    import torch
    for _ in range(10):
        area = h * w * (0.08 + 0.92 * float(torch.rand(1, generator=g)))
        ratio = math.exp(math.log(3 / 4) + math.log(16 / 9) * float(torch.rand(1, generator=g)))
        bw, bh = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < bw <= w and 0 < bh <= h:
            return (int(torch.randint(0, h - bh + 1, (1,), generator=g)),
                    int(torch.randint(0, w - bw + 1, (1,), generator=g)), bh, bw)
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


def decoded_region(box, h: int, w: int, out: int) -> tuple:
    """What the JPEG loader stores for ``box``: ``(rows, cols, (top, left, bh, bw))`` of the
    region decoded at the smallest scale n/8 keeping the box >= ``out`` (else n = 8),
    rounded out to 4:2:0 MCUs (16 px at full scale), and the box inside it."""
    top, left, bh, bw = box
    n = next((s for s in JPEG_SCALES if bh * s >= out * 8 and bw * s >= out * 8), 8)
    f, mcu = n / 8, 2 * n
    sh, sw = math.ceil(h * f), math.ceil(w * f)
    y0, x0 = int(top * f) // mcu * mcu, int(left * f) // mcu * mcu
    y1 = min(-(-math.ceil((top + bh) * f) // mcu) * mcu, sh)
    x1 = min(-(-math.ceil((left + bw) * f) // mcu) * mcu, sw)
    btop, bleft = min(round(top * f) - y0, y1 - y0 - 1), min(round(left * f) - x0, x1 - x0 - 1)
    bbh = max(1, min(round((top + bh) * f) - y0, y1 - y0) - btop)
    bbw = max(1, min(round((left + bw) * f) - x0, x1 - x0) - bleft)
    return y1 - y0, x1 - x0, (btop, bleft, bbh, bbw)


def loader_case(args, device) -> dict:
    """The JPEG loader's batch: one host slot (pinned on CUDA) = ragged regions + records."""
    import torch
    from dlpack_io.kernels import records as R
    g = torch.Generator().manual_seed(args.seed + 1)
    n, out = args.batch, args.out_size
    (lo_h, hi_h), (lo_w, hi_w) = (tuple(int(v) for v in a.split(",")) for a in (args.src_h,
                                                                                  args.src_w))
    regions, boxes, pos, offsets = [], [], 0, []
    for _ in range(n):
        h = int(torch.randint(lo_h, hi_h + 1, (1,), generator=g))
        w = int(torch.randint(lo_w, hi_w + 1, (1,), generator=g))
        rows, cols, box = decoded_region(rrc_box(g, h, w), h, w, out)
        regions.append((rows, cols))
        boxes.append(box)
        offsets.append(pos)
        pos += rows * cols * 3
    rec_at = -(-pos // 64) * 64
    slot = torch.randint(0, 256, (rec_at + n * RECORD_BYTES,), dtype=torch.uint8, generator=g)
    if device.type == "cuda":
        slot = slot.pin_memory()
    rec = R.host_records(slot, rec_at, n)
    rec["top"], rec["left"], rec["box_height"], rec["box_width"] = zip(*boxes)
    rec["height"], rec["width"] = zip(*regions)
    rec["offset"], rec["label"] = offsets, range(n)
    rec["flags"] = (torch.rand(n, generator=g) < 0.5).int().numpy()
    rec["order"] = R.encode_order(torch.stack([torch.randperm(4, generator=g)
                                               for _ in range(n)])).numpy()
    for name in ("brightness", "contrast", "saturation"):
        rec[name] = (0.6 + 0.8 * torch.rand(n, generator=g)).numpy()
    rec["hue"] = (0.2 * torch.rand(n, generator=g) - 0.1).numpy()
    box_bytes = sum(b[2] * b[3] * 3 for b in boxes)
    return {"slot": slot, "rec_at": rec_at, "n": n, "box_bytes": box_bytes, "data_bytes": pos,
            "device_slot": slot.to(device)}


def crop_case(args, device):
    """Raw records: a dense (N, S, S, 3) batch, random crop corners and flips."""
    import torch
    g = torch.Generator().manual_seed(args.seed)
    n, s, o = args.batch, args.in_size, args.out_size
    images = torch.randint(0, 256, (n, s, s, 3), dtype=torch.uint8, generator=g)
    top = torch.randint(0, s - o + 1, (n,), generator=g)
    left = torch.randint(0, s - o + 1, (n,), generator=g)
    fh = torch.rand(n, generator=g) < 0.5
    return [t.to(device) for t in (images, top, left, fh)]


def eager_crop(images, top, left, size, fh, dtype):
    """What one writes in torch: gather rows/cols (with flips), permute, float, normalise."""
    import torch
    ar = torch.arange(size, device=images.device)
    ys = (top[:, None] + ar)[:, :, None]
    xs = left[:, None] + torch.where(fh[:, None], size - 1 - ar, ar)
    batch = torch.arange(images.shape[0], device=images.device)[:, None, None]
    x = images[batch, ys, xs[:, None, :]].permute(0, 3, 1, 2)
    if dtype == torch.uint8:
        return x.contiguous()
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return ((x.float() / 255 - mean) / std).to(dtype).contiguous()


# ----------------------------------------------------------------------------- cases

def cases(args, device, jpeg):
    """Yield (op, dtype name, variant, fn, bytes moved) for every timed case."""
    import torch
    from dlpack_io.kernels import crop_flip_permute, records as R, reference, resized_crop_packed
    images, top, left, fh = crop_case(args, device)
    n, o = args.batch, args.out_size
    src = torch.empty(args.copy_mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    yield "copy", "uint8", "device-to-device copy_", lambda: dst.copy_(src), 2 * src.numel()
    slot, recs = jpeg["device_slot"], R.records_view(jpeg["device_slot"], jpeg["rec_at"], n)
    jit3, jit4 = ("brightness", "contrast", "saturation"), R.JITTER_OPS
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        norm = {} if dt == torch.uint8 else {"mean": MEAN, "std": STD}
        out_bytes = n * 3 * o * o * dt.itemsize
        crop_bytes = n * o * o * 3 + out_bytes
        yield "crop_flip_permute", name, "triton", lambda dt=dt, norm=norm: crop_flip_permute(
            images, top, left, o, o, fh, False, out_dtype=dt, validate=False, **norm), crop_bytes
        resize_bytes = jpeg["box_bytes"] + n * RECORD_BYTES + out_bytes
        for variant, aa, jit in (("triton antialias", True, ()), ("triton", False, ()),
                                 ("triton antialias jitter(b,c,s)", True, jit3),
                                 ("triton antialias jitter(b,c,s,h)", True, jit4)):
            if jit and name != "float16":
                continue
            extra = jpeg["box_bytes"] if "contrast" in jit else 0  # the contrast-mean pass
            yield ("resized_crop", name, variant,
                   lambda dt=dt, norm=norm, aa=aa, jit=jit: resized_crop_packed(
                       slot, recs, o, out_dtype=dt, antialias=aa, jitter=jit, validate=False,
                       **norm), resize_bytes + extra)
        if name == "float16":
            yield "crop_flip_permute", name, "triton validate=True", lambda: crop_flip_permute(
                images, top, left, o, o, fh, False, out_dtype=dt, **norm), crop_bytes
        if not args.skip_eager:
            yield "crop_flip_permute", name, "eager gather", lambda dt=dt: eager_crop(
                images, top, left, o, fh, dt), crop_bytes
            yield "resized_crop", name, "eager per-box interpolate", \
                lambda dt=dt, norm=norm: reference.resized_crop_packed(
                    slot, recs, o, out_dtype=dt, antialias=True, validate=False, **norm), \
                resize_bytes


def end_to_end(args, device, jpeg) -> list[dict]:
    """Pinned host slot -> device copy + packed resize kernel (float16, antialias), per batch:
    copy alone, serial (one stream), overlapped (copy of batch k+1 on a side stream while
    the kernel of batch k runs; two device buffers)."""
    import torch
    from dlpack_io.kernels import records as R, resized_crop_packed
    host, n, at = jpeg["slot"], jpeg["n"], jpeg["rec_at"]
    bufs = [torch.empty_like(jpeg["device_slot"]) for _ in range(2)]

    def kernel(buf):
        return resized_crop_packed(buf, R.records_view(buf, at, n), args.out_size,
                                   out_dtype=torch.float16, mean=MEAN, std=STD, antialias=True,
                                   validate=False)

    def serial():
        bufs[0].copy_(host, non_blocking=True)
        kernel(bufs[0])

    rows = [("h2d pinned copy", lambda: bufs[0].copy_(host, non_blocking=True)),
            ("h2d copy + kernel, serial", serial)]
    if device.type == "cuda":
        rows.append(("h2d copy + kernel, overlapped", _overlapped(host, bufs, kernel)))
    out = []
    for variant, fn in rows:
        sec, loop = time_call(fn, device, args.warmup, args.repeats, flush=False)
        moved = host.numel()
        out.append({"op": "end_to_end", "dtype": "float16", "variant": variant,
                    "bytes": moved, "us": sec * 1e6, "loop_us": loop * 1e6,
                    "GBps": moved / sec / 1e9, "images_per_s": n / loop})
    return out


def _overlapped(host, bufs, kernel):
    """One step of a double-buffered pipeline: copy into the spare buffer on a side stream,
    run the kernel on the buffer copied last step (its copy event waited for)."""
    import torch
    side = torch.cuda.Stream()
    state = {"k": 0, "ready": [None, None], "free": [None, None]}

    def step():
        k = state["k"]
        nxt = (k + 1) % 2
        with torch.cuda.stream(side):
            if state["free"][nxt] is not None:
                side.wait_event(state["free"][nxt])
            bufs[nxt].copy_(host, non_blocking=True)
            state["ready"][nxt] = side.record_event()
        if state["ready"][k % 2] is not None:
            torch.cuda.current_stream().wait_event(state["ready"][k % 2])
            kernel(bufs[k % 2])
            state["free"][k % 2] = torch.cuda.current_stream().record_event()
        state["k"] = nxt
    return step


def verify(args, device, jpeg) -> list[str]:
    """Every kernel variant timed here against the torch reference, on the bench inputs."""
    import torch
    from dlpack_io.kernels import crop_flip_permute, records as R, reference, resized_crop_packed
    images, top, left, fh = crop_case(args, device)
    o, n, problems = args.out_size, jpeg["n"], []
    slot, recs = jpeg["device_slot"], R.records_view(jpeg["device_slot"], jpeg["rec_at"], n)
    kw = dict(out_dtype=torch.float16, mean=MEAN, std=STD)
    checks = [("crop_flip_permute uint8", 0, crop_flip_permute, reference.crop_flip_permute,
               (images, top, left, o, o, fh, False), {})]
    for aa, jit in ((True, ()), (False, ()), (True, R.JITTER_OPS)):
        checks.append((f"resized_crop_packed antialias={aa} jitter={jit} float16", 2**-9,
                       resized_crop_packed, reference.resized_crop_packed, (slot, recs, o),
                       dict(kw, antialias=aa, jitter=jit)))
    for what, tol, fn, ref, call, kwargs in checks:
        err = float((fn(*call, **kwargs).float() - ref(*call, **kwargs).float()).abs().max())
        if err > tol:
            problems.append(f"{what}: max |kernel - reference| = {err:g} > {tol:g}")
    return problems
