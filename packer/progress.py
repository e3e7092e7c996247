"""Progress bar for long jobs: images/s, MB/s and ETA on stderr (tqdm when enabled)."""
from __future__ import annotations

import time


class Progress:
    """Counts images and bytes; draws a tqdm bar when ``enabled``."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True, initial: int = 0):
        self.images = 0
        self.bytes = 0
        self.start = time.perf_counter()
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="img",
                             dynamic_ncols=True, smoothing=0.1)
        self._last_postfix = self.start

    def update(self, images: int = 1, nbytes: int = 0) -> None:
        """Account for ``images`` more images totalling ``nbytes`` input bytes."""
        self.images += images
        self.bytes += nbytes
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
