"""mask_gather: the Triton kernel (Triton's CPU interpreter) and the torch reference against
a plain numpy reference: exact, uint8 and uint16, odd sizes across tiles, flips, padding."""

import sys

import numpy as np
import pytest
import torch

from dlpack_io.kernels import mask_gather, reference
from dlpack_io.kernels.launch import use_triton

pytestmark = pytest.mark.usefixtures("triton_interpret")


def _numpy(masks, rows, cols, fill, dtype):
    out = np.full((len(masks), rows.shape[1], cols.shape[1]), fill, dtype)
    for n, m in enumerate(masks):
        for y, r in enumerate(rows[n]):
            for x, c in enumerate(cols[n]):
                if r >= 0 and c >= 0:
                    out[n, y, x] = m[r, c]
    return out


def _tables(rng, shapes, oh, ow):
    """Random nearest tables: a crop-resize (increasing), some flipped, some padded."""
    rows = np.full((len(shapes), oh), -1, np.int32)
    cols = np.full((len(shapes), ow), -1, np.int32)
    for n, (h, w) in enumerate(shapes):
        th, tw = rng.integers(1, oh + 1), rng.integers(1, ow + 1)
        r = np.sort(rng.integers(0, h, th)).astype(np.int32)
        c = np.sort(rng.integers(0, w, tw)).astype(np.int32)
        rows[n, :th] = r[::-1] if n % 2 else r
        cols[n, :tw] = c[::-1] if n % 3 == 0 else c
    return rows, cols


def _batch(dtype, seed, shapes, oh, ow):
    rng = np.random.default_rng(seed)
    top = 256 if dtype == np.uint8 else 65536
    masks = [rng.integers(0, top, size=s).astype(dtype) for s in shapes]
    rows, cols = _tables(rng, shapes, oh, ow)
    flat = torch.from_numpy(np.concatenate([m.reshape(-1) for m in masks]))
    sizes = np.array(shapes, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes[:, 0] * sizes[:, 1])[:-1]]).astype(np.int64)
    return masks, flat, torch.from_numpy(offsets), torch.from_numpy(sizes), rows, cols


@pytest.mark.parametrize("dtype,fill", [(np.uint8, 255), (np.uint8, 0), (np.uint16, 65535),
                                        (np.uint16, 255)])
def test_kernel_and_reference_equal_numpy(dtype, fill):
    shapes = [(37, 50), (5, 3), (64, 33), (1, 1)]
    oh, ow = 45, 70  # two tiles down, three across, partial tiles at the edges
    masks, flat, offsets, sizes, rows, cols = _batch(dtype, 7, shapes, oh, ow)
    want = _numpy(masks, rows, cols, fill, dtype)
    args = (flat, offsets, sizes, torch.from_numpy(rows), torch.from_numpy(cols), fill)
    assert use_triton(flat.device)  # the interpreter runs the kernel itself
    got = mask_gather(*args)
    ref = reference.mask_gather(*args)
    assert got.dtype == ref.dtype == flat.dtype and got.shape == (4, oh, ow)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(ref.numpy(), want)


def test_empty_batch_and_tiny_output():
    _, flat, offsets, sizes, rows, cols = _batch(np.uint8, 1, [(4, 4)], 1, 1)
    out = mask_gather(flat, offsets[:0], sizes[:0], torch.from_numpy(rows[:0]),
                      torch.from_numpy(cols[:0]))
    assert out.shape == (0, 1, 1)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(src=a["src"].float()), "uint8 or uint16"),
    (lambda a: a.update(rows=a["rows"].long()), "rows"),
    (lambda a: a.update(offsets=a["offsets"][:1]), "shapes"),
    (lambda a: a["rows"].__setitem__((0, 0), 37), "sample 0"),      # row 37 of a 37-row mask
    (lambda a: a["cols"].__setitem__((1, 0), -2), "sample 1"),
    (lambda a: a["offsets"].__setitem__(3, 10**6), "sample 3"),     # past the buffer
    (lambda a: a.update(fill=256), "fill 256"),
])
def test_bad_arguments_are_refused_before_launch(change, match):
    _, flat, offsets, sizes, rows, cols = _batch(np.uint8, 3, [(37, 50), (5, 3), (6, 6),
                                                              (2, 2)], 8, 8)
    a = dict(src=flat, offsets=offsets, shapes=sizes, rows=torch.from_numpy(rows),
             cols=torch.from_numpy(cols), fill=255)
    change(a)
    with pytest.raises((TypeError, ValueError), match=match):
        mask_gather(a["src"], a["offsets"], a["shapes"], a["rows"], a["cols"], a["fill"])


def _compile_for_h100() -> list:
    """Compile the kernel for sm_90, uint8 and uint16 (runs in a subprocess, no GPU)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget

    from dlpack_io.kernels import launch, masks

    fn = masks._mask_gather_kernel.jitted()
    consts = {"BLOCK_H": launch.BLOCK_H, "BLOCK_W": launch.BLOCK_W}
    facts = []
    for t in ("*u8", "*u16"):
        types = {"src_ptr": t, "out_ptr": t, "off_ptr": "*i64", "shape_ptr": "*i64",
                 "rows_ptr": "*i32", "cols_ptr": "*i32"}
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
        out = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts),
                             target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": launch.NUM_WARPS, "enable_fp_fusion": False})
        facts.append({"type": t, "local": bool(re.search(r"(ld|st)\.local", out.asm["ptx"])),
                      "stores": sorted(set(re.findall(r"st\.global[.\w]*", out.asm["ptx"])))})
    return facts


def test_kernel_compiles_for_h100():
    """The interpreter accepts code the GPU compiler rejects: compile it too (no GPU)."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600)
    last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
    if proc.returncode != 0 and "NVIDIA backend" in proc.stderr:
        pytest.skip(proc.stderr[-300:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = json.loads(last)
    assert [f["type"] for f in facts] == ["*u8", "*u16"]
    assert not any(f["local"] for f in facts)
    assert facts[0]["stores"] == ["st.global.b8"] and facts[1]["stores"] == ["st.global.b16"]


if __name__ == "__main__":
    try:
        import triton.backends.nvidia.compiler  # noqa: F401  (needs the bundled ptxas)
    except Exception as exc:
        sys.exit(f"triton's NVIDIA backend is not importable: {exc!r}")
    print(__import__("json").dumps(_compile_for_h100()))
