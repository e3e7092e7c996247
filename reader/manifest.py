"""Load and validate a data set's manifest.json."""
from __future__ import annotations

import os

from dlpack_io.reader import format as fmt


def manifest_path(dataset_dir) -> str:
    """Path of the manifest inside a data set folder."""
    return os.path.join(os.fspath(dataset_dir), fmt.MANIFEST_NAME)


def load_manifest(dataset_dir) -> dict:
    """Read, parse and validate ``dataset_dir/manifest.json``.

    Raises FileNotFoundError when there is none (an unfinished or wrong folder) and
    FormatError when it is damaged, naming the file either way.
    """
    path = manifest_path(dataset_dir)
    if not os.path.isdir(dataset_dir):
        raise FileNotFoundError(f"{dataset_dir}: no such data set folder")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} not found: {dataset_dir} is not a finished dlpack data set (a conversion "
            f"still running or interrupted? finish it with 'dlpack convert ... --resume')") from None
    return fmt.validate_manifest(fmt.decode_json(data, path), path)
