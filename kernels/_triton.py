"""Lazy Triton plumbing shared by the kernel modules.

Triton is optional at run time, so no module of ours imports it at import time. Kernel
modules write their kernels at module level as usual, but decorate them with
:func:`lazy_jit` instead of ``@triton.jit`` and declare ``tl = None``; with
``from __future__ import annotations`` the ``tl.constexpr`` annotations stay strings
(Triton reads them as strings). The first launch imports triton, binds ``tl`` in the
kernel module and in every module whose lazy kernels it uses, and replaces each lazy
kernel by the real ``triton.jit`` object.

:func:`use_triton` is the one place that decides between the Triton kernel and the torch
reference: CUDA tensors use Triton (when it is installed), CPU tensors use Triton's
interpreter only when ``TRITON_INTERPRET=1`` is set, everything else the torch reference.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from typing import Any, Callable, Optional

import torch

log = logging.getLogger(__name__)

#: Launch options shared by every kernel. FP contraction is off so the kernels round like
#: the torch reference (these kernels are memory bound; FMA buys nothing).
LAUNCH_OPTIONS: dict[str, Any] = {"enable_fp_fusion": False}

# "interpret" or "compiled": fixed by the first launch in this process (triton.jit picks
# the interpreter from TRITON_INTERPRET at that moment and kernels are jitted only once).
_mode: list[str] = []


class LazyJit:
    """A ``@triton.jit`` stand-in that imports triton and jits on first use."""

    def __init__(self, fn: Callable, jit_options: Optional[dict] = None) -> None:
        self.fn = fn
        self.jit_options = dict(jit_options or {})
        self._jitted: Any = None
        functools.update_wrapper(self, fn)

    def jitted(self) -> Any:
        """Return the real Triton kernel, binding every lazy kernel it can call."""
        if self._jitted is None:
            _bind_module(self.fn.__globals__, set())
        return self._jitted

    def __getitem__(self, grid: Any) -> Any:
        return self.jitted()[grid]


def lazy_jit(fn: Optional[Callable] = None, **jit_options: Any):
    """Decorate a Triton kernel (or ``@triton.jit`` helper) without importing triton.

    ``@lazy_jit`` or ``@lazy_jit(do_not_specialize=("H", "W"))``: keyword options are
    passed to ``triton.jit`` on first use.
    """
    if fn is None:
        return lambda f: LazyJit(f, jit_options)
    return LazyJit(fn, jit_options)


def _bind_module(namespace: dict, seen: set[int]) -> None:
    """Bind ``tl`` and jit every :class:`LazyJit` in a module namespace (and its deps)."""
    if id(namespace) in seen:
        return
    seen.add(id(namespace))
    import triton
    import triton.language

    if not _mode:
        _mode.append("interpret" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled")

    namespace["tl"] = triton.language
    for name, value in list(namespace.items()):
        if isinstance(value, LazyJit):
            if value._jitted is None:
                value._jitted = triton.jit(value.fn, **value.jit_options)
            namespace[name] = value._jitted
            _bind_module(value.fn.__globals__, seen)


@functools.lru_cache(maxsize=None)
def triton_installed() -> bool:
    """True when the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(device: torch.device) -> bool:
    """Decide whether tensors on ``device`` go through the Triton kernel.

    CUDA: yes when triton is installed (otherwise the torch reference runs on the GPU and
    a warning is logged once), unless this process jitted the kernels for the interpreter
    and ``TRITON_INTERPRET`` is no longer set. CPU: only under ``TRITON_INTERPRET=1``
    (Triton's interpreter, what the tests use) and only if this process has not already
    compiled the kernels for the GPU; otherwise the torch reference. Other devices: the
    torch reference.
    """
    if device.type == "cuda":
        if not triton_installed():
            _warn_once("triton is not installed: CUDA tensors use the torch reference path")
            return False
        if _mode == ["interpret"] and os.environ.get("TRITON_INTERPRET") != "1":
            _warn_once("the kernels were jitted for Triton's interpreter earlier in this "
                       "process: CUDA tensors use the torch reference path")
            return False
        return True
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        if not triton_installed():
            _warn_once("triton is not installed: TRITON_INTERPRET=1 is ignored, CPU tensors "
                       "use the torch reference path")
        elif _mode == ["compiled"]:
            _warn_once("TRITON_INTERPRET=1 was set after the kernels were compiled for the "
                       "GPU in this process: CPU tensors use the torch reference path")
        else:
            return True
    return False


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    log.warning(message)
