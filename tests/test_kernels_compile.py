"""Compile every kernel for an H100 (sm_90) ahead of time, no GPU needed.

The interpreter tests check what the kernels compute; this checks that they also go
through the real GPU compiler (the interpreter accepts code the compiler rejects), that
the NCHW stores are vectorised (``st.global.v2/v4``: the layout the tiling is designed
for) and that nothing spills to local memory. The compile runs in a subprocess without
TRITON_INTERPRET (kernels are jitted once per process, interpreted or compiled). Skipped
when triton or its NVIDIA backend (bundled ptxas) is not installed. Nothing here imports
triton in the pytest process itself.
"""

import json
import os
import re
import subprocess
import sys

import pytest

# (kernel, output type, constexprs): a spread of the variants a training run compiles.
PTR = "*u8"
VARIANTS = [
    ("crop", "*u8", dict(C=3, CP=4, HAS_JITTER=False, OUT_U8=True)),
    ("crop", "*fp16", dict(C=3, CP=4, HAS_JITTER=False, OUT_U8=False)),
    ("crop", "*bf16", dict(C=1, CP=1, HAS_JITTER=True, OUT_U8=False)),
    ("resize", "*fp16", dict(C=3, CP=4, RAGGED=False, HAS_JITTER=False, OUT_U8=False)),
    ("resize", "*u8", dict(C=3, CP=4, RAGGED=True, HAS_JITTER=True, OUT_U8=True)),
    ("resize_aa", "*fp32", dict(C=3, CP=4, RAGGED=False, HAS_JITTER=False, OUT_U8=False)),
    ("resize_aa", "*bf16", dict(C=4, CP=4, RAGGED=True, HAS_JITTER=True, OUT_U8=False)),
    # Triton turns int arguments equal to 1 into constants: 1-pixel-wide images/outputs.
    ("crop", "*fp16", dict(C=3, CP=4, HAS_JITTER=False, OUT_U8=False, H=1, W=1, OH=1, OW=1,
                           tiles_x=1, tiles_per_sample=1)),
    ("resize", "*u8", dict(C=2, CP=2, RAGGED=False, HAS_JITTER=False, OUT_U8=True, W=1, OH=1,
                           tiles_x=1)),
    ("resize_aa", "*fp16", dict(C=3, CP=4, RAGGED=True, HAS_JITTER=False, OUT_U8=False, H=1,
                                OW=1, total=1, tiles_per_sample=1)),
]


def _signature(name, arg_names, out_type, constexprs):
    """Argument types in launch order; sizes 256/224 are multiples of 16 like ImageNet's."""
    if name == "crop":
        ptrs = [PTR, out_type, "*i64", "*i64", "*u8", "*u8"] + ["*fp32"] * 5
        ints = ["i32"] * 6  # H, W, OH, OW, tiles_x, tiles_per_sample
    else:
        ptrs = [PTR, out_type, "*i64", "*u8", "*u8", "*i64", "*i32", "*i32"] + ["*fp32"] * 5
        ints = ["i32"] * 7  # H, W, OH, OW, total, tiles_x, tiles_per_sample
    types = ptrs + ints + ["constexpr"] * (len(arg_names) - len(ptrs) - len(ints))
    types = ["constexpr" if a in constexprs else t for a, t in zip(arg_names, types)]
    aligned = [i for i in range(len(ptrs) + 4) if types[i] != "constexpr"]
    return dict(zip(arg_names, types)), {(i,): [["tt.divisibility", 16]] for i in aligned}


def _compile_all():
    """Compile VARIANTS for sm_90; return per-variant PTX facts (runs in the subprocess)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from dlpack_io.kernels import _tiling, crop, resize
    kernels = {"crop": crop._crop_flip_permute_kernel, "resize": resize._resized_crop_kernel,
               "resize_aa": resize._resized_crop_aa_kernel}
    results = []
    for name, out_type, consts in VARIANTS:
        fn = kernels[name].jitted()
        consts = dict(consts, BLOCK_H=_tiling.BLOCK_H, BLOCK_W=_tiling.BLOCK_W)
        sig, attrs = _signature(name, fn.arg_names, out_type, consts)
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        out = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": _tiling.NUM_WARPS, "enable_fp_fusion": False})
        ptx = out.asm["ptx"]
        results.append({"variant": f"{name}-{out_type}-{consts}",
                        "stores": sorted(set(re.findall(r"st\.global[.\w]*", ptx))),
                        "local": bool(re.search(r"(ld|st)\.local", ptx))})
    return results


def _backend_missing():
    """Why the NVIDIA backend cannot compile here, or None (runs in the subprocess)."""
    try:
        import triton.backends
        import triton.backends.nvidia.compiler  # noqa: F401  (needs the bundled ptxas)
    except Exception as exc:
        return f"triton's NVIDIA backend is not importable: {exc!r}"
    if "nvidia" not in triton.backends.backends:
        return "triton has no NVIDIA backend"
    return None


def test_kernels_compile_for_h100_with_vector_stores():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(results, dict):
        pytest.skip(results["skip"])
    assert len(results) == len(VARIANTS)
    for r in results:
        assert not r["local"], r
        if "'W': 1" not in r["variant"] and "'OW': 1" not in r["variant"]:
            assert any(s.startswith(("st.global.v2", "st.global.v4")) for s in r["stores"]), r


if __name__ == "__main__":
    missing = _backend_missing()
    print(json.dumps({"skip": missing} if missing else _compile_all()))
