"""Progress for long jobs: images/s, MB/s and ETA on stderr.

On a terminal, a tqdm bar; when stderr is a file or a pipe (a batch job's log), one plain
log line every LOG_EVERY seconds instead of a bar redrawn with carriage returns.
"""
from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)
LOG_EVERY = 30.0


class Progress:
    """Counts images and bytes; draws a tqdm bar when ``enabled`` and stderr is a terminal,
    logs a line now and then when it is not."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True, initial: int = 0):
        self.images = 0
        self.packed = 0  # of ``images``, those packed (the others were rejects)
        self.bytes = 0
        self.start = time.perf_counter()
        self._bar = None
        self.total, self.desc, self._done = total, desc, initial
        self._log_lines = enabled and not _stderr_is_terminal()
        if enabled and not self._log_lines:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="img",
                             dynamic_ncols=True, smoothing=0.1)
        self._last_postfix = self._last_line = self.start

    def update(self, images: int = 1, nbytes: int = 0, *, packed: bool = True) -> None:
        """Account for ``images`` more images totalling ``nbytes`` input bytes (``packed``
        False: rejects, read but not packed)."""
        self.images += images
        self.packed += images if packed else 0
        self.bytes += nbytes
        self._done += images
        if self._log_lines and time.perf_counter() - self._last_line >= LOG_EVERY:
            self._last_line = time.perf_counter()
            log.info("%s: %d/%d images, %.0f images/s, %.1f MB/s", self.desc, self._done,
                     self.total, self.images_per_s, self.mb_per_s)
        if self._bar is not None:
            self._bar.update(images)
            now = time.perf_counter()
            if now - self._last_postfix > 0.5:
                self._bar.set_postfix_str(f"{self.mb_per_s:.1f} MB/s", refresh=False)
                self._last_postfix = now

    @property
    def elapsed(self) -> float:
        """Seconds since the bar started."""
        return time.perf_counter() - self.start

    @property
    def images_per_s(self) -> float:
        """Mean image rate so far."""
        return self.images / max(self.elapsed, 1e-9)

    @property
    def mb_per_s(self) -> float:
        """Mean byte rate so far, in MB (10^6) per second."""
        return self.bytes / 1e6 / max(self.elapsed, 1e-9)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.mb_per_s:.1f} MB/s", refresh=True)
            self._bar.close()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
