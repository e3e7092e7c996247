"""Load and validate a data set's manifest.json."""
from __future__ import annotations

import os

from dlpack_io.reader import format as fmt
from dlpack_io.reader.safeio import read_limited

# Names a conversion leaves in DST while it runs or after it was interrupted.
_UNFINISHED = (".dlpack-convert.journal", ".dlpack-convert.lock")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jfif", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


class NotADatasetError(FileNotFoundError):
    """The folder has no manifest.json: not a dlpack data set (or an unfinished one)."""


def manifest_path(dataset_dir) -> str:
    """Path of the manifest inside a data set folder."""
    return os.path.join(os.fspath(dataset_dir), fmt.MANIFEST_NAME)


def _looks_like_images(dataset_dir: str, names: list) -> bool:
    if any(n.lower().endswith(_IMAGE_SUFFIXES) for n in names):
        return True
    subdirs = [n for n in names[:20] if os.path.isdir(os.path.join(dataset_dir, n))]
    return any(any(m.lower().endswith(_IMAGE_SUFFIXES) for m in os.listdir(
        os.path.join(dataset_dir, d))[:50]) for d in subdirs)


def _not_a_dataset(dataset_dir: str) -> NotADatasetError:
    """The error for a folder without a manifest, saying what the folder looks like."""
    try:
        names = sorted(os.listdir(dataset_dir))
    except OSError:
        names = []
    if any(n in _UNFINISHED or (n.startswith(".shard-") and n.endswith(".partial")) for n in names):
        why = ("a conversion into it is still running or was interrupted; finish it with "
               "'dlpack convert SRC " + dataset_dir + " --resume'")
    elif any(n.startswith("shard-") for n in names):
        why = ("it holds shard files but no manifest: an interrupted conversion (finish it "
               "with 'dlpack convert SRC " + dataset_dir + " --resume') or an incomplete copy "
               "(copy manifest.json too)")
    elif _looks_like_images(dataset_dir, names):
        why = f"it looks like a folder of images: pack it with 'dlpack convert {dataset_dir} DST'"
    else:
        why = "point at the folder that 'dlpack convert' wrote (it holds manifest.json and shard files)"
    return NotADatasetError(f"{dataset_dir} is not a dlpack data set (no {fmt.MANIFEST_NAME}): {why}")


def load_manifest(dataset_dir) -> dict:
    """Read, parse and validate ``dataset_dir/manifest.json``.

    Raises NotADatasetError (a FileNotFoundError) when there is none, FileNotFoundError
    when the folder does not exist, and FormatError when the manifest is damaged, is not a
    regular file or is larger than MAX_MANIFEST_BYTES, naming the file every time.
    """
    dataset_dir = os.fspath(dataset_dir)
    path = manifest_path(dataset_dir)
    if not os.path.isdir(dataset_dir):
        raise FileNotFoundError(f"{dataset_dir}: no such data set folder")
    try:
        data = read_limited(path, fmt.MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise _not_a_dataset(dataset_dir) from None
    return fmt.validate_manifest(fmt.decode_json(data, path), path)
