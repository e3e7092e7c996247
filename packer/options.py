"""Packing options: one frozen dataclass, one set of defaults, validated once."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

from dlpack_io.reader.format import DEFAULT_MAX_PIXELS, FORMATS, MODES
from dlpack_io.reader.format.spec import native_jpeg, parse_size  # noqa: F401 (re-exported)

# The choices of the options below; their one home (encode.py implements them).
ON_ERROR = ("skip", "fail")
NON_JPEG = ("keep", "raw", "jpeg", "reject")


@dataclass(frozen=True)
class PackOptions:
    """Everything that decides the bytes of a packed data set (plus how to run).

    Fields that change output: format, mode, size, max_side, quality, shard_size, seed,
    shuffle, validate, jpeg_restarts, non_jpeg, max_pixels. Fields that only change how the
    work runs: workers, on_error, progress. Output never depends on ``workers``.
    """

    format: str = "record"
    mode: str = "jpeg"
    size: int | None = None        # raw: resize shorter side, then center-crop to size x size
    max_side: int | None = None    # bound the longer side, keeping aspect ratio
    quality: int = 95              # JPEG quality when a record must be re-encoded
    shard_size: int = 256 * 10**6  # target bytes of record data per shard
    seed: int = 0                  # seed of the packing order shuffle
    shuffle: bool = True           # shuffle samples across shards (helps block shuffling)
    validate: bool = True          # decode every input before packing it
    # jpeg mode: lossless rewrite with a restart marker per MCU (None: on in jpeg mode when
    # the C extension is there, which the reader needs to profit from it anyway)
    jpeg_restarts: bool | None = None
    non_jpeg: str = "keep"         # PNG/WebP: their own file (else raw), raw, jpeg, reject
    max_pixels: int = DEFAULT_MAX_PIXELS  # reject images with more pixels (bomb guard)
    fields: str | None = None      # sidecars / list fields to pack: None all, "none", "a,b"
    workers: int = 0               # 0 = all cores
    on_error: str = "skip"         # skip bad inputs (listed as rejects) or fail on the first
    progress: bool = True
    coco: str | None = None        # COCO instances JSON: boxes, categories (packer/targetinputs.py)
    masks: str | None = None       # folder of PNG label maps mirroring SRC (sidecars: None)
    skip_empty: bool = False       # leave out images without any box

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r}: expected one of {FORMATS}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {MODES}")
        if self.mode == "planes" and native_jpeg() is None:
            raise ValueError("--mode planes needs the C extension dlpack_io.reader._jpeg "
                             "(libjpeg's raw planes), which is not built here: install the "
                             "libjpeg headers and reinstall dlpack-io")
        if self.non_jpeg not in NON_JPEG:
            raise ValueError(f"non_jpeg {self.non_jpeg!r}: expected one of {NON_JPEG}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"max_pixels {self.max_pixels!r}: expected a positive pixel count")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error {self.on_error!r}: expected one of {ON_ERROR}")
        if self.size is not None and self.max_side is not None:
            raise ValueError("give --size or --max-side, not both")
        if self.size is not None and self.mode != "raw":
            raise ValueError("--size (fixed square records) is for --mode raw; use --max-side "
                             "to bound JPEG records")
        for name in ("size", "max_side"):
            value = getattr(self, name)
            if value is not None and not (1 <= value <= 65535):
                raise ValueError(f"{name} {value}: expected 1..65535 pixels")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality {self.quality}: expected 1..100")
        if self.shard_size < 1:
            raise ValueError(f"shard_size {self.shard_size}: expected a positive byte count")
        if self.jpeg_restarts is None:
            object.__setattr__(self, "jpeg_restarts",
                               self.mode == "jpeg" and native_jpeg() is not None)
        if self.jpeg_restarts and self.mode != "jpeg":
            raise ValueError("--restart-markers rewrites JPEG records; it needs --mode jpeg")
        if self.jpeg_restarts and native_jpeg() is None:
            raise ValueError("--restart-markers needs the reader's C extension _jpeg "
                             "(libjpeg-turbo headers at install time)")
        if self.workers < 0:
            raise ValueError(f"workers {self.workers}: expected 0 (all cores) or more")

    @property
    def num_workers(self) -> int:
        """Worker processes to use: ``workers`` or, when 0, the cores this process may use."""
        if self.workers:
            return self.workers
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    def output_options(self) -> dict:
        """The options that determine the output bytes (recorded in the manifest)."""
        skip = {"workers", "on_error", "progress"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        for name in ("coco", "masks"):  # file names only: no absolute path in the manifest
            out[name] = os.path.basename(os.path.normpath(out[name])) if out[name] else None
        return out

    def to_dict(self) -> dict:
        """All options as a plain dict."""
        return asdict(self)
