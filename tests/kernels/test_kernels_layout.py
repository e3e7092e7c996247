"""kernels/ holds one file per public operation: each op's Triton kernels are private and live
in the op's own file (the limits every module keeps are in tests/test_layout.py)."""
from __future__ import annotations

import ast
from pathlib import Path

MODULES = sorted((Path(__file__).resolve().parents[2] / "kernels").glob("*.py"))


def test_each_public_op_holds_its_kernels():
    """Every ``@lazy_jit`` kernel of an op (a ``*_kernel`` function) is private and lives in
    the op's own file."""
    kernels = {p.stem: [n.name for n in ast.parse(p.read_text()).body
                        if isinstance(n, ast.FunctionDef) and n.name.endswith("_kernel")]
               for p in MODULES}
    assert kernels.pop("crop") == ["_crop_flip_permute_kernel"]
    assert kernels.pop("resize") == ["_resized_crop_kernel", "_resized_crop_aa_kernel"]
    assert kernels.pop("masks") == ["_mask_gather_kernel"]
    assert not any(kernels.values()), kernels
