"""The training loop's time as the GPU sees it (``device="cuda"``): CUDA events.

On a CUDA device the host's clock misreads a training loop: kernels are queued, the host
returns from the step at once and may then wait inside ``next()`` while the GPU is still
busy with the step (no data stall at all), or run far ahead of a GPU that sits idle. So
the Loader also records one CUDA event on the current stream when it hands a batch over
and one when the loop asks for the next, and reads the GPU's timeline between them:

    handed(k) -> asked(k):      the step on batch k, as the GPU ran it   (gpu_step_s)
    asked(k)  -> handed(k+1):   the GPU waited for batch k+1's data       (gpu_wait_s)

Events are read without blocking (``query()``) as later batches are delivered, and at the
end of an epoch after a synchronisation of the last one. Recording an event costs a few
microseconds; nothing here runs without CUDA (``GpuTimeline(None)`` does nothing).
"""
from __future__ import annotations

from collections import deque


class GpuTimeline:
    """Pairs of CUDA events around the training step; seconds of GPU step and GPU wait."""

    def __init__(self, device=None):
        self.device = device if device is not None and device.type == "cuda" else None
        self.step_s = self.wait_s = 0.0
        self._events, self._last = deque(), None

    def mark(self, kind: str) -> None:
        """Record an event now on the current stream; the GPU time since the previous mark
        is ``kind``'s: "wait" (a batch is handed over) or "step" (the loop asks again)."""
        if self.device is None:
            return
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self._events.append((event, kind))

    def resolve(self, block: bool = False) -> None:
        """Add the intervals whose events the GPU has reached (all of them with ``block``)."""
        while self._events:
            event, kind = self._events[0]
            if block:
                event.synchronize()
            elif not event.query():
                return
            if self._last is not None:
                seconds = self._last.elapsed_time(event) / 1000.0
                if kind == "step":
                    self.step_s += seconds
                else:
                    self.wait_s += seconds
            self._last = event
            self._events.popleft()

    def restart(self) -> None:
        """A new span (epoch): forget the figures and the pending events."""
        self.step_s = self.wait_s = 0.0
        self._events.clear()
        self._last = None
