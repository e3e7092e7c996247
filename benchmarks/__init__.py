"""The standalone benchmarks of dlpack: not part of the product, not in the wheel.

Run them from the repository root (this folder is not installed; ``python -m`` finds it in
the current directory), with the project installed in the same environment::

    python -m benchmarks.larger_than_ram    global vs block shuffle, page cache < data
    python -m benchmarks.convert_ray        --engine ray against the local engine
    python -m benchmarks.kernels            the Triton kernels on a GPU (--cpu-smoke: none)
    python -m benchmarks.gpu_step           exposed data time per training step on a GPU
    python -m benchmarks.remote_clients     which S3 client the prefetch planner should use
    python -m benchmarks.cost_of_checks     what the untrusted-input checks cost
    python -m benchmarks.fidelity           read-time cost of original JPEG bytes; photo data
    python -m benchmarks.loader_overhead    the Loader's CPU per image against the bare decode
    python -m benchmarks.buckets            aspect buckets and token budgets against fixed sizes

``dlpack bench`` (the contests of contenders: convert, loader, remote) is part of the
product and lives in ``dlpack_io.tools.bench``, its contenders named in one registry
(``tools/bench/families.py``); each module here names its own contenders in its docstring.
docs/benchmarks.md holds the results and the commands that produced them.
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root, where `benchmarks` is found


def child_env() -> dict:
    """``os.environ`` with the repository root first on PYTHONPATH: a benchmark's child
    process (``python -m benchmarks....``) then finds this folder whatever its working
    directory, as the parent did."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def warm_page_cache(root: str) -> None:
    """Read every file under ``root`` once, untimed: this machine evicts page cache left idle
    for ~30 s, so a "warm" run must re-read its files right before it starts."""
    for base, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                while f.read(1 << 24):
                    pass
