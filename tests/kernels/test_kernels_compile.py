"""Compile every kernel for an H100 (sm_90) ahead of time, no GPU needed.

The interpreter tests check what the kernels compute; this checks that they also go
through the real GPU compiler (the interpreter accepts code the compiler rejects) and that
the generated code has the shape the design relies on:

* the NCHW stores are vectorised (``st.global.v2/v4``) and nothing spills to local memory;
* no ``ttg.convert_layout`` (a round trip through shared memory plus a barrier) inside any
  loop: the resampling tap loops run on one register layout;
* no 64-bit integer multiply inside the tap loops' PTX (int32 offsets inside a sample);
* the per-batch sizes H, W and the ragged ``total`` are not specialised (a new image size
  or buffer length never recompiles), while OH/OW are (alignment of the stores).

It covers the colour-jitter variants (each op, all four, the contrast statistics pass).
The compile runs in a subprocess without TRITON_INTERPRET (kernels are jitted once per
process, interpreted or compiled). Skipped when triton or its NVIDIA backend (bundled
ptxas) is not installed. ``python tests/kernels/test_kernels_compile.py --facts`` prints the
per-variant facts (the before/after table in docs/kernels.md).
"""

import json
import os
import re
import subprocess
import sys

import pytest

B, C_, S, HUE = 1, 2, 4, 8  # jitter op bits
# (kernel, output type, constexprs): a spread of the variants a training run compiles.
VARIANTS = [
    ("crop", "*u8", dict(C=3, OPS=0, STATS=False, OUT_U8=True)),
    ("crop", "*fp16", dict(C=3, OPS=0, STATS=False, OUT_U8=False)),
    ("crop", "*bf16", dict(C=1, OPS=B | C_, STATS=False, OUT_U8=False)),
    ("crop", "*fp16", dict(C=3, OPS=B | C_ | S | HUE, STATS=False, OUT_U8=False)),
    ("crop", "*fp16", dict(C=3, OPS=B | C_ | S, STATS=True, OUT_U8=False)),
    ("resize", "*fp16", dict(C=3, RAGGED=False, OPS=0, STATS=False, OUT_U8=False)),
    ("resize", "*u8", dict(C=3, RAGGED=True, OPS=B | C_, STATS=False, OUT_U8=True)),
    ("resize", "*u8", dict(C=2, RAGGED=False, OPS=0, STATS=False, OUT_U8=True)),
    ("resize_aa", "*fp32", dict(C=3, RAGGED=False, OPS=0, STATS=False, OUT_U8=False)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=0, STATS=False, OUT_U8=False)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=S, STATS=False, OUT_U8=False)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=HUE, STATS=False, OUT_U8=False)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=B | C_ | S | HUE, STATS=False,
                                OUT_U8=False)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=B | C_ | S | HUE, STATS=True,
                                OUT_U8=False)),
    ("resize_aa", "*bf16", dict(C=4, RAGGED=True, OPS=B | C_, STATS=False, OUT_U8=False)),
    # Triton turns int arguments equal to 1 into constants: 1-pixel-wide outputs.
    ("crop", "*fp16", dict(C=3, OPS=0, STATS=False, OUT_U8=False, OH=1, OW=1, tiles_x=1,
                           tiles_per_sample=1)),
    ("resize_aa", "*fp16", dict(C=3, RAGGED=True, OPS=0, STATS=False, OUT_U8=False, OW=1,
                                tiles_per_sample=1)),
]
POINTER_TYPES = {"in_ptr": "*u8", "rec_ptr": "*i32", "scale_ptr": "*fp32", "bias_ptr": "*fp32",
                 "cmean_ptr": "*fp32", "stats_ptr": "*fp32"}
ALIGNED_INTS = ("OH", "OW")  # 224: divisible by 16, like ImageNet's sizes


def _signature(fn, out_type, constexprs):
    """Argument types and divisibility attributes of one variant."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs or fn.params[i].is_constexpr:
            sig[name] = "constexpr"
            continue
        sig[name] = out_type if name == "out_ptr" else POINTER_TYPES.get(name, "i32")
        if sig[name].startswith("*") or name in ALIGNED_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def loop_bodies(ttgir: str) -> list[str]:
    """The text of every ``scf.for`` body of a TTGIR module (nested ones included)."""
    bodies, open_loops, depth = [], [], 0
    for line in ttgir.splitlines():
        if re.search(r"\bscf\.for\b", line):
            open_loops.append((depth, []))
        for _, body in open_loops:
            body.append(line)
        depth += line.count("{") - line.count("}")
        while open_loops and depth <= open_loops[-1][0]:
            bodies.append("\n".join(open_loops.pop()[1]))
    return bodies


def ptx_loops(ptx: str) -> list[list[str]]:
    """Instructions of every PTX basic block that branches back to itself (loop bodies)."""
    lines = ptx.splitlines()
    starts = [(i, m.group(1)) for i, line in enumerate(lines)
              if (m := re.match(r"^(\$L__BB\w+):", line))]
    loops = []
    for k, (i, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        body = [line.strip() for line in lines[i + 1:end]]
        body = [line for line in body if line and not line.startswith(("//", ".loc", "$L__"))
                and line not in ("{", "}")]
        if any(re.search(r"\bbra(\.uni)?\s+" + re.escape(name) + ";", line) for line in body):
            loops.append(body)
    return loops


def tap_loop(ptx: str) -> dict:
    """Counts in the PTX loop with the most global loads (the resampling tap loop)."""
    loops = ptx_loops(ptx)
    if not loops:
        return {}
    body = max(loops, key=lambda b: sum("ld.global" in line for line in b))

    def count(pattern):
        return sum(bool(re.search(pattern, line)) for line in body)
    return {"instructions": len(body), "ld_global": count(r"ld\.global"),
            "shared": count(r"\.shared"), "barriers": count(r"bar\.sync|barrier\."),
            "int64": count(r"\.[su]64\b"), "int64_mul": count(r"mul\.wide|mad\.wide|m\w+\.lo\.[su]64"),
            "cvt_to_f32": count(r"cvt\.rn\.f32\.[us]")}


def facts(ttgir: str, ptx: str) -> dict:
    """What the tests (and the docs' before/after table) count in one compiled variant."""
    loops = loop_bodies(ttgir)
    return {
        "tap_loop": tap_loop(ptx),
        "convert_layout": ttgir.count("ttg.convert_layout"),
        "convert_layout_in_loops": sum(b.count("ttg.convert_layout") for b in loops),
        "int64_ops_in_loops": sum(len(re.findall(r"(?:\b|x)i64\b", b)) for b in loops),
        "shared_ops_ptx": len(re.findall(r"\b(ld|st)\.shared", ptx)),
        "bar_sync_ptx": len(re.findall(r"\bbar\.sync|barrier\.sync", ptx)),
        "loads": sorted(set(re.findall(r"ld\.global[.\w]*", ptx))),
        "stores": sorted(set(re.findall(r"st\.global[.\w]*", ptx))),
        "mul_wide_ptx": len(re.findall(r"mul\.wide\.[su]32|mul\.lo\.[su]64", ptx)),
        "ptx_lines": len(ptx.splitlines()),
        "local": bool(re.search(r"(ld|st)\.local", ptx)),
    }


def _compile_all():
    """Compile VARIANTS for sm_90; return per-variant facts (runs in the subprocess)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from dlpack_io.kernels import crop, launch, resize
    kernels = {"crop": crop._crop_flip_permute_kernel, "resize": resize._resized_crop_kernel,
               "resize_aa": resize._resized_crop_aa_kernel}
    results = []
    for name, out_type, consts in VARIANTS:
        fn = kernels[name].jitted()
        consts = dict(consts, BLOCK_H=launch.BLOCK_H, BLOCK_W=launch.BLOCK_W)
        sig, attrs = _signature(fn, out_type, consts)
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        out = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": launch.NUM_WARPS, "enable_fp_fusion": False})
        results.append(dict(facts(out.asm["ttgir"], out.asm["ptx"]), kernel=name,
                            variant=f"{name}-{out_type}-{consts}"))
    specialised = {n: [p.name for p in k.jitted().params if p.do_not_specialize]
                   for n, k in kernels.items()}
    return {"variants": results, "not_specialised": specialised}


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


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    return results


def test_kernels_compile_for_h100_with_vector_stores(compiled):
    assert len(compiled["variants"]) == len(VARIANTS)
    for r in compiled["variants"]:
        assert not r["local"], r
        if "STATS': True" not in r["variant"] and "'OW': 1" not in r["variant"]:
            assert any(s.startswith(("st.global.v2", "st.global.v4")) for s in r["stores"]), r


def test_tap_loops_stay_in_registers_with_int32_offsets(compiled):
    for r in compiled["variants"]:
        assert r["convert_layout_in_loops"] == 0, r
        if r["kernel"] == "resize_aa":
            loop = r["tap_loop"]
            assert r["int64_ops_in_loops"] == 0, r
            assert loop["shared"] == loop["barriers"] == 0, r
            assert loop["cvt_to_f32"] <= 1, r  # the tap index; pixels convert without cvt
            assert loop["int64_mul"] == 0, r  # 64-bit maths: only pointer + int32 offset adds


def test_per_batch_sizes_are_not_specialised(compiled):
    spec = compiled["not_specialised"]
    assert spec["crop"] == ["H", "W"]
    assert spec["resize"] == spec["resize_aa"] == ["H", "W", "total"]


if __name__ == "__main__":
    missing = _backend_missing()
    if missing:
        print(json.dumps({"skip": missing}))
    elif "--facts" in sys.argv:
        for r in _compile_all()["variants"]:
            print(json.dumps(r))
    else:
        print(json.dumps(_compile_all()))
