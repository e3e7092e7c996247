"""Find the inputs of a conversion in an ImageFolder tree (lists: packer/jsonlist.py), and
turn their names into the escaped, bounded names a shard records.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from dlpack_io.packer.fields import MASK_SUFFIX, SIDECARS

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
        (``name.txt`` beside ``name.jpg``, ``fields.SIDECARS``) or an ignored file."""
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



# ---- input names -----------------------------------------------------------------------------
# Names from the wild as the data set records them.
#
# File and folder names are bytes on Linux; Python hands undecodable ones over with
# surrogate escapes (PEP 383), which no UTF-8 JSON, TSV or manifest can hold. Such a name is
# still opened by its real bytes, and recorded escaped: each undecodable byte as ``\xNN``,
# and so are control characters (NUL, tabs, newlines), which would break a TSV line or a
# terminal. A valid, printable name is recorded as it is.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Integer labels of a list (CSV/TSV or JSON Lines) define classes "0".."max": beyond this a
# label is a typo or an attack (a label of 10**12 must not make 10**12 class names): a reject.
MAX_LIST_LABEL = 2**20
# A path a list or a COCO file names, and a class name it gives, longer than any file path
# (Linux PATH_MAX) or class name can be is a reject; what a manifest records of a reject (its
# path and reason) is clipped, so its rejects never grow it past what a reader takes.
MAX_PATH_CHARS = 4096
MAX_CLASS_CHARS = 1024
MAX_REJECT_CHARS = 2048


def shown(name: str) -> str:
    """``name`` as the manifest, shard metadata and rejects record it (see module doc)."""
    try:
        name.encode("utf-8")
        clean = True
    except UnicodeEncodeError:
        clean = False
    if clean and not _CONTROL.search(name):
        return name
    if not clean:
        name = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", name)


def clipped(text: str, limit: int = MAX_REJECT_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def too_long(text: str, what: str, limit: int) -> str | None:
    """Why ``text`` (a path or a class name) cannot be one, or None."""
    return None if len(text) <= limit else \
        f"{what} of {len(text)} characters, more than the {limit} one may have"


def hashable(name: str) -> bytes:
    """``name``'s real bytes (for digests): undecodable ones kept as they were on disk."""
    return name.encode("utf-8", "surrogateescape")


def field_name(key: str) -> str:
    """A field name made of a key from another format (a tar member's suffix, a TFRecord
    feature, a Parquet column): every character that cannot be in a name becomes "_",
    at most 64 of them, "_" first when it starts with a digit; a name the sample already
    has (image, label, index) gets a "_" after it."""
    name = re.sub(r"\W", "_", key, flags=re.ASCII)[:64] or "_"
    name = name if re.match(r"[A-Za-z_]", name) else "_" + name[:63]
    return name + "_" if name in ("image", "label", "index") else name


def link_counts(root: str, paths) -> tuple[int, int]:
    """(inputs reached through a symlink, of them those whose real path lies outside
    ``root``) of ``paths`` relative to ``root``, counted as the folder scan counts its own:
    what a list or a COCO file names is followed like a folder's entries, and said. Each
    folder's real path is resolved once."""
    real_root, folders = os.path.realpath(root), {}
    via = outside = 0
    for rel in paths:
        try:
            head, name = os.path.split(rel)
            if head not in folders:
                real = os.path.realpath(os.path.join(root, head))
                folders[head] = real, real != os.path.normpath(os.path.join(real_root, head))
            folder, linked = folders[head]
            path = os.path.join(folder, name)
            if not (linked or os.path.islink(path)):
                continue
            real = os.path.realpath(path)
        except (OSError, ValueError):  # a NUL in the path: a reject already
            continue
        via += 1
        outside += not real.startswith(real_root + os.sep)
    return via, outside
