"""Importing dlpack_io.kernels (and the CPU fallback path) must not import triton."""

import os
import subprocess
import sys
import textwrap


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_import_does_not_import_triton():
    out = _run("""
        import sys
        import dlpack_io.kernels
        print("triton" in sys.modules, "dlpack_io.kernels.crop" in sys.modules)
    """)
    assert out == "False False"


def test_public_names_and_cpu_fallback_do_not_import_triton():
    out = _run("""
        import sys, torch
        from dlpack_io.kernels import crop_flip_permute, resized_crop, reference
        images = torch.zeros((2, 4, 5, 3), dtype=torch.uint8)
        zeros = torch.zeros(2, dtype=torch.int64)
        a = crop_flip_permute(images, zeros, zeros, 2, 3, False, False)
        boxes = torch.tensor([[0, 0, 4, 5], [1, 1, 2, 2]])
        b = resized_crop(images, boxes, 3, True, False, out_dtype=torch.float32)
        print("triton" in sys.modules, tuple(a.shape), tuple(b.shape))
    """)
    assert out == "False (2, 3, 2, 3) (2, 3, 3, 3)"


def test_public_functions_are_the_functions_not_modules():
    out = _run("""
        import dlpack_io.kernels.crop, dlpack_io.kernels.resize
        from dlpack_io.kernels import crop_flip_permute, resized_crop
        print(callable(crop_flip_permute), callable(resized_crop),
              crop_flip_permute.__name__, resized_crop.__name__)
    """)
    assert out == "True True crop_flip_permute resized_crop"


def test_kernels_interpret_when_triton_was_imported_before_TRITON_INTERPRET():
    """Since triton 3.9, its standard-library ``@jit`` functions (``tl.sum``, ``tl.zeros``)
    can be interpreted only if triton was first imported with TRITON_INTERPRET=1 set. This
    suite (and a notebook) may import triton earlier; the kernels use builtins only, so
    they still run under the interpreter and agree with the reference, jitter (the tile
    sums of contrast) and resize (its zero tiles) included."""
    out = _run("""
        import os, sys, torch, triton.language
        os.environ["TRITON_INTERPRET"] = "1"
        from dlpack_io.kernels import crop_flip_permute, resized_crop, reference
        g = torch.Generator().manual_seed(3)
        images = torch.randint(0, 256, (3, 9, 11, 3), dtype=torch.uint8, generator=g)
        kw = dict(out_dtype=torch.float32, contrast=torch.tensor([0.5, 1.0, 1.7]),
                  brightness=torch.tensor([1.2, 0.8, 1.0]))
        zeros = torch.zeros(3, dtype=torch.int64)
        a = crop_flip_permute(images, zeros, zeros, 9, 11, True, False, **kw)
        ra = reference.crop_flip_permute(images, zeros, zeros, 9, 11, True, False, **kw)
        boxes = torch.tensor([[0, 0, 9, 11], [1, 2, 5, 7], [3, 0, 6, 11]])
        b = resized_crop(images, boxes, (5, 6), False, True, antialias=True, **kw)
        rb = reference.resized_crop(images, boxes, (5, 6), False, True, antialias=True, **kw)
        print(float((a - ra).abs().max()) < 1e-5, float((b - rb).abs().max()) < 1e-5)
    """)
    assert out == "True True"
