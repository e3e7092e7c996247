"""Find the inputs of a conversion: an ImageFolder tree or a path,label list."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jfif")
# Other image files are packed too (what they are is decided by their content, as for
# JPEGs: see --non-jpeg); files with any other suffix are ignored and counted.
IMAGE_SUFFIXES = JPEG_SUFFIXES + (".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")


@dataclass(frozen=True)
class Inputs:
    """The samples to pack, in a canonical order, with their class names.

    ``paths`` are relative to ``root`` (POSIX separators) so the output does not depend on
    where the source folder is mounted; ``labels[i]`` indexes ``classes``.
    """

    root: str
    paths: list
    labels: list
    classes: list
    list_file: str | None = None
    ignored: dict | None = None  # suffix -> count of files skipped as not images by name


def scan_image_folder(root) -> Inputs:
    """Scan ``root/<class>/**/*`` for IMAGE_SUFFIXES (any case); labels = sorted class names.

    Files directly under ``root`` are ignored, as torchvision's ImageFolder does.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"source folder {root} does not exist or is not a directory")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    paths, labels, ignored = [], [], {}
    for label, name in enumerate(classes):
        found = []
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in filenames:
                if fn.startswith("."):
                    continue
                if fn.lower().endswith(IMAGE_SUFFIXES):
                    found.append(Path(dirpath, fn).relative_to(root).as_posix())
                else:
                    suffix = os.path.splitext(fn)[1].lower() or "(none)"
                    ignored[suffix] = ignored.get(suffix, 0) + 1
        found.sort()
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise ValueError(f"no .jpg/.jpeg/.jfif (or {'/'.join(IMAGE_SUFFIXES[3:])}) files found "
                         f"in class sub-folders of {root}; expected "
                         f"{root}/<class name>/<image>.jpg (or pass --list FILE)")
    return Inputs(str(root.resolve()), paths, labels, classes, ignored=dict(sorted(ignored.items())))


def _rows(list_file: Path):
    text = list_file.read_text(encoding="utf-8-sig")
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","
    for lineno, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 2:
            raise ValueError(f"{list_file}:{lineno}: expected 'path{delimiter}label', got {row!r}")
        yield lineno, row[0].strip(), row[1].strip()


def read_list(root, list_file) -> Inputs:
    """Read a CSV/TSV of ``path,label`` rows; paths are relative to ``root``.

    Labels may be class names (classes = sorted unique names) or non-negative integers
    (classes = "0".."max"). A first row whose label is not numeric while the others are,
    or that reads ``path,label``, is taken as a header. Order is the list's order.
    """
    root, list_file = Path(root), Path(list_file)
    rows = list(_rows(list_file))
    if rows and rows[0][2].lower() in ("label", "class", "target"):
        rows = rows[1:]
    if not rows:
        raise ValueError(f"{list_file}: no 'path,label' rows found")
    raw_labels = [label for _, _, label in rows]
    if all(lab.isdigit() for lab in raw_labels):
        labels = [int(lab) for lab in raw_labels]
        classes = [str(i) for i in range(max(labels) + 1)]
    else:
        classes = sorted(set(raw_labels))
        lookup = {name: i for i, name in enumerate(classes)}
        labels = [lookup[lab] for lab in raw_labels]
    paths = []
    for lineno, path, _ in rows:
        if os.path.isabs(path) or ".." in Path(path).parts:
            raise ValueError(f"{list_file}:{lineno}: path {path!r} must be relative to {root} "
                             f"and stay inside it")
        paths.append(Path(path).as_posix())
    return Inputs(str(root.resolve()), paths, labels, classes, str(list_file.resolve()))


def stat_inputs(inputs: Inputs) -> list[tuple[int, int]]:
    """(size, mtime_ns) of every input, (-1, -1) where it cannot be stat'ed.

    Recorded in the resume plan and re-checked when each file is read, so a source file
    that changes during or between runs is named instead of silently packed.
    """
    out = []
    for rel in inputs.paths:
        try:
            st = os.stat(os.path.join(inputs.root, rel))
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((-1, -1))
    return out
