"""Find the inputs of a conversion: an ImageFolder tree or a path,label list."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from dlpack_io.packer.fieldsource import MASK_SUFFIX, SIDECARS
from dlpack_io.packer.names import MAX_LIST_LABEL, shown

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jfif")
# Other image files are packed too (what they are is decided by their content, as for JPEGs:
# see --non-jpeg); files with any other suffix are ignored and counted. Every suffix of
# torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp) is here.
IMAGE_SUFFIXES = JPEG_SUFFIXES + (".png", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".ppm",
                                  ".pgm")


@dataclass(frozen=True)
class Inputs:
    """The samples to pack, in a canonical order, with their class names.

    ``paths`` are relative to ``root`` (POSIX separators) so the output does not depend on
    where the source folder is mounted; ``labels[i]`` indexes ``classes`` (-1 for every
    input of a folder scanned without labels, whose ``classes`` is empty). The scan
    counters say how symlinks shaped the input (see docs/reliability.md).
    """

    root: str
    paths: list
    labels: list
    classes: list
    list_file: str | None = None
    via_links: int = 0           # inputs reached through a symlink (file or folder)
    outside_src: int = 0         # ... whose real path lies outside SRC
    repeated_dirs: int = 0       # folders reached again (symlink loops, aliases) and skipped
    empty_classes: tuple = ()    # (class name, files in it that are not images)
    ignored: dict | None = None  # suffix -> count of files skipped as not images by name
    hidden_files: int = 0        # files named .* skipped (ImageFolder would try to read them)
    hidden_dirs: int = 0         # folders named .* skipped (ImageFolder: classes, walked)
    bad: dict | None = None      # input number -> why it is a reject before it is read
    fields: dict | None = None   # field schema of the list's extra keys / columns (format 3)
    field_values: list | None = None  # per input: its fields, or why its line is rejected
    sidecars: dict | None = None  # kind -> files named like an image with a sidecar suffix
    mask_files: int | None = None  # files named *.mask.png a folder scan saw (None: no scan)
    targets: object | None = None  # boxes and masks to attach (packer/targets.TargetSource)
    members: object | None = None  # containers.Members: where each image lies in a container


@dataclass
class _Walk:
    """One scan: the real directories walked so far and the symlink counters."""

    root: Path
    real_root: str
    seen: set = field(default_factory=set)
    reserved: set = field(default_factory=set)  # SRC and the class folders: walked as tops only
    via_links: int = 0
    outside_src: int = 0
    repeated_dirs: int = 0
    ignored: dict = field(default_factory=dict)  # suffix -> files skipped as not images
    sidecars: dict = field(default_factory=dict)  # kind -> sidecar files (name.txt, ...)
    hidden_files: int = 0
    hidden_dirs: int = 0
    mask_files: int = 0  # files named *.mask.png: sidecar masks are looked for only then

    def images(self, top: Path, top_is_link: bool) -> tuple[list, int]:
        """(sorted relative paths of the images under ``top``, count of other files).

        Symlinks are followed, but each real directory is walked once per scan: a loop
        (a link to a parent) or a second link to a folder already walked adds nothing.
        """
        found, others, stack = [], 0, [(top, top_is_link)]
        stems, loose = set(), []  # a folder's image names and other files: sidecars or not
        prefix = str(self.root) + os.sep  # relative paths by slicing (pathlib per file: slow)
        while stack:
            folder, via = stack.pop()
            try:
                st = os.stat(folder)
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:  # unreadable or dangling: nothing to pack from it
                continue
            key = (st.st_dev, st.st_ino)
            if key in self.seen or (folder != top and key in self.reserved):
                self.repeated_dirs += 1  # a loop, an alias, or a link to SRC or another class
                continue
            self.seen.add(key)
            for e in entries:
                if e.name.startswith("."):  # .ipynb_checkpoints, ._x.jpg (macOS), .DS_Store
                    self._count_hidden(e)
                    continue
                if e.is_dir():
                    stack.append((Path(e.path), via or e.is_symlink()))
                elif e.name.lower().endswith(IMAGE_SUFFIXES) and e.is_file():
                    found.append(e.path[len(prefix):].replace(os.sep, "/") if e.path.startswith(
                        prefix) else Path(e.path).relative_to(self.root).as_posix())
                    stems.add(os.path.splitext(e.name)[0])
                    self.mask_files += e.name.lower().endswith(MASK_SUFFIX)
                    self._count_link(e, via)
                elif e.is_file():
                    others += 1
                    loose.append(os.path.splitext(e.name))
            self._count_loose(loose, stems)
            stems, loose = set(), []
        return sorted(found), others

    def _count_loose(self, loose: list, stems: set) -> None:
        """Count a folder's files that are not images: a sidecar of one of its images
        (``name.txt`` beside ``name.jpg``, fieldsource.SIDECARS) or an ignored file."""
        for stem, suffix in loose:
            if suffix[1:] in SIDECARS and stem in stems:
                self.sidecars[suffix[1:]] = self.sidecars.get(suffix[1:], 0) + 1
            else:
                key = suffix.lower() or "(none)"
                self.ignored[key] = self.ignored.get(key, 0) + 1

    def _count_hidden(self, entry) -> None:
        try:
            if entry.is_dir():
                self.hidden_dirs += 1
            elif entry.is_file():
                self.hidden_files += 1
        except OSError:  # unreadable: not an input either way
            pass

    def _count_link(self, entry, via: bool) -> None:
        if via or entry.is_symlink():
            self.via_links += 1
            real = os.path.realpath(entry.path)
            if not real.startswith(self.real_root + os.sep):
                self.outside_src += 1


def _no_images_error(root: Path) -> ValueError:
    loose = sum(1 for e in os.scandir(root) if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES))
    found = f"found {loose} image files directly in {root} but none in class sub-folders" if loose \
        else (f"no image files ({', '.join(IMAGE_SUFFIXES)}) found in class sub-folders of "
              f"{root}")
    return ValueError(f"{found}; expected {root}/<class name>/<image>.jpg, or pass --list FILE "
                      f"(path,label rows), or --no-labels to pack a folder of images without "
                      f"classes (every label is then -1)")


def scan_image_folder(root, *, labels: bool = True) -> Inputs:
    """Scan ``root/<class>/**/*`` for IMAGE_SUFFIXES (any case); labels = sorted class names.

    Files directly under ``root`` are ignored, as torchvision's ImageFolder does. Files and
    folders whose name starts with "." are skipped and counted (ImageFolder reads them: a
    ``.ipynb_checkpoints`` folder becomes its class 0, a ``._x.jpg`` fails to load). With
    ``labels=False`` every JPEG under ``root`` (any depth) is an input with label -1 and
    there are no classes. Symlinks are followed; each real directory is walked once.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"source folder {root} does not exist or is not a directory")
    walk = _Walk(root, os.path.realpath(root))
    walk.reserved.add(_identity(root))
    if not labels:
        paths, _ = walk.images(root, False)
        if not paths:
            raise ValueError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) found under {root}")
        return _inputs(walk, paths, [-1] * len(paths), [], ())
    tops = [e for e in os.scandir(root) if e.is_dir()]
    classes = sorted(e.name for e in tops if not e.name.startswith("."))
    walk.hidden_dirs += len(tops) - len(classes)  # a hidden class folder is skipped whole
    walk.reserved.update(_identity(root / name) for name in classes)
    paths, label_list, empty = [], [], []
    for label, name in enumerate(classes):
        found, others = walk.images(root / name, (root / name).is_symlink())
        if not found:
            empty.append((name, others))
        paths += found
        label_list += [label] * len(found)
    if not paths:
        raise _no_images_error(root)
    # class names the manifest holds: escaped when not valid UTF-8 (walked by real name)
    return _inputs(walk, paths, label_list, [shown(c) for c in classes],
                   tuple((shown(name), n) for name, n in empty))


def _identity(path: Path) -> tuple:
    return os.stat(path)[2:0:-1]  # (st_dev, st_ino)


def _inputs(walk: _Walk, paths, labels, classes, empty) -> Inputs:
    return Inputs(str(walk.root.resolve()), paths, labels, classes, None, walk.via_links,
                  walk.outside_src, walk.repeated_dirs, empty, dict(sorted(walk.ignored.items())),
                  hidden_files=walk.hidden_files, hidden_dirs=walk.hidden_dirs,
                  sidecars=dict(walk.sidecars), mask_files=walk.mask_files)


def _rows(list_file: Path):
    # undecodable bytes stay as they are (surrogate escapes): such a path still opens
    text = list_file.read_text(encoding="utf-8-sig", errors="surrogateescape")
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","
    for lineno, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 2:
            raise ValueError(f"{list_file}:{lineno}: expected 'path{delimiter}label', "
                             f"got {delimiter.join(row)!r}")
        yield lineno, row[0].strip(), row[1].strip(), row[2:]


def read_list(root, list_file) -> Inputs:
    """Read a CSV/TSV of ``path,label`` rows; paths are relative to ``root``.

    Labels may be class names (classes = sorted unique names) or non-negative integers
    (classes = "0".."max"). A first row whose label is not numeric while the others are,
    or that reads ``path,label``, is taken as a header. Order is the list's order. A row
    that cannot be an input (a NUL in its path; in a list of integer labels, a label in
    other digits than 0-9 or above MAX_LIST_LABEL) stays in the list as a reject naming
    its line (``Inputs.bad``): one bad row never stops the conversion.
    """
    root, list_file = Path(root), Path(list_file)
    if list_file.suffix.lower() in (".jsonl", ".ndjson"):
        return _read_jsonl(root, list_file)
    rows = list(_rows(list_file))
    header = None
    if rows and rows[0][2].lower() in ("label", "class", "target"):
        header, rows = rows[0], rows[1:]
    if not rows:
        raise ValueError(f"{list_file}: no 'path,label' rows found")
    raw_labels = [label for _, _, label, _ in rows]
    bad = {}
    if all(lab.isdigit() for lab in raw_labels):  # isdigit: also other scripts' digits
        labels = [_int_label(lab, list_file, lineno, bad, k)
                  for k, (lineno, _, lab, _) in enumerate(rows)]
        classes = [str(i) for i in range(max(labels) + 1)]
    else:
        classes = sorted(set(raw_labels))
        lookup = {name: i for i, name in enumerate(classes)}
        labels = [lookup[lab] for lab in raw_labels]
        classes = [shown(c) for c in classes]
    paths = []
    for k, (lineno, path, _, _) in enumerate(rows):
        if "\0" in path:
            bad[k] = f"{list_file}:{lineno}: the path holds a NUL byte (shown as \\x00)"
            path = shown(path)
        elif os.path.isabs(path) or ".." in Path(path).parts:
            raise ValueError(f"{list_file}:{lineno}: path {path!r} must be relative to {root} "
                             f"and stay inside it")
        paths.append(Path(path).as_posix())
    schema, values = extra_columns(header, rows, list_file)
    return Inputs(str(root.resolve()), paths, labels, classes, str(list_file.resolve()),
                  bad=bad or None, fields=schema, field_values=values)


def _int_label(text: str, list_file, lineno: int, bad: dict, k: int) -> int:
    """The integer label of row ``k``; -1 with ``bad[k]`` set when it is not one we take."""
    if not (text.isascii() and text.isdecimal()):
        bad[k] = f"{list_file}:{lineno}: label {shown(text)!r} is not written in digits 0-9"
        return -1
    if len(text) > 9 or int(text) > MAX_LIST_LABEL:  # length first: int() of a huge text
        bad[k] = (f"{list_file}:{lineno}: label {shown(text[:20])} is above "
                  f"{MAX_LIST_LABEL}, the largest class number a list may use")
        return -1
    return int(text)


def extra_columns(header, rows, list_file):
    """(schema, values) of a CSV/TSV list's columns after path and label: str fields
    named by the header row (``column3``, ... without one); (None, None) when none."""
    width = max(len(extra) for *_, extra in rows)
    if not width:
        return None, None
    names = [n.strip() for n in header[3]] if header else []
    names += [f"column{k + 3}" for k in range(len(names), width)]
    from dlpack_io.reader.format.fieldschema import check_field_name
    for name in names:
        check_field_name(name, f"{list_file}: header")
    values = [dict(zip(names, extra)) if len(extra) == width else
              f"{list_file}:{lineno}: {len(extra) + 2} columns, other rows have {width + 2}"
              for lineno, _, _, extra in rows]
    return {n: {"type": "str"} for n in names}, values


def _read_jsonl(root: Path, list_file: Path) -> Inputs:
    from dlpack_io.packer.jsonlist import read_jsonl

    paths, labels, classes, schema, values = read_jsonl(root, list_file)
    return Inputs(str(root.resolve()), paths, labels, classes, str(list_file.resolve()),
                  fields=schema, field_values=values)


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
        except (OSError, ValueError):  # ValueError: a NUL in the path (a reject already)
            out.append((-1, -1))
    return out
