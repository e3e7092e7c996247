"""The last step of a conversion: the manifest (built from the packing state), the rejects
file, then the manifest file, atomically; and the summary ``convert`` returns."""
from __future__ import annotations

import datetime
import os
import platform
from collections import Counter

from dlpack_io.packer.fieldshapes import settle
from dlpack_io.packer.names import clipped, shown
from dlpack_io.packer.nofollow import create_new
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.targets import annotation_rejects
from dlpack_io.packer.writers import fsync_dir
from dlpack_io.reader import format as fmt

TMP_INFIX = ".tmp-"  # atomic_write's temp file: PATH.tmp-PID (pid: two writers never collide)


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` via temp file, fsync and rename: all or nothing."""
    tmp = f"{path}{TMP_INFIX}{os.getpid()}"
    try:
        with open(create_new(tmp), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def pil_flavour() -> str:
    """Which PIL is installed: ``pillow-simd X`` or ``pillow X``."""
    from importlib import metadata

    for dist in ("pillow-simd", "Pillow"):
        try:
            return f"{dist.lower()} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "PIL (unknown distribution)"


def rejects_tsv(rejects: list) -> bytes:
    """The rejects file: a header line, then ``path<TAB>reason`` per skipped input (and,
    after them, per annotation left out of a packed image: targets.annotation_rejects)."""
    lines = ["path\treason"] + [f"{clipped(p)}\t{clipped(r)}".replace("\n", " ")
                                for p, r in rejects]
    return ("\n".join(lines) + "\n").encode()


def build_manifest(inputs, options, shards: list, rejects: list, reencoded: dict,
                   class_counts: list, seconds: float, lossless: dict | None = None, *,
                   provenance: bool = True, engine: str = "local", fields=None) -> dict:
    """The manifest dict (checksum included) describing a finished data set.

    Only ``created`` (when, where, by which engine) and the checksum over it differ between
    two conversions of the same source with the same options. ``provenance=False`` leaves
    out what identifies the machine that packed it: the host name and the absolute paths
    of the source folder and list file (null instead). ``fields``: the field schema of
    samples that carry more than an image and a label (format 3); None or empty: format 2.
    """
    from dlpack_io.packer.version import __version__

    manifest = {
        "kind": fmt.MANIFEST_KIND, "version": fmt.FORMAT_VERSION if fields else fmt.PLAIN_VERSION,
        "format": options.format, "mode": options.mode,
        "num_samples": sum(s["num_samples"] for s in shards),
        "num_bytes": sum(s["bytes"] for s in shards),
        "classes": list(inputs.classes), "class_counts": list(class_counts),
        "shards": shards, "options": options.output_options(),
        "source": {"root": None if inputs.root is None else shown(inputs.root),
                   "list": None if inputs.list_file is None else shown(inputs.list_file),
                   "num_inputs": len(inputs.paths)},
        "rejects": [{"path": clipped(p), "reason": clipped(r)} for p, r in rejects],
        "reencoded": dict(sorted(reencoded.items())),
        "lossless": dict(sorted((lossless or {}).items())),
        "created": {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "seconds": round(seconds, 3), "dlpack": __version__, "pil": pil_flavour(),
                    "python": platform.python_version(), "host": platform.node(),
                    "engine": engine},
    }
    if fields:
        manifest["fields"] = fields
    if not provenance:
        manifest["source"].update(root=None, list=None)
        del manifest["created"]["host"]
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    return manifest


def write_dataset_files(dst, manifest: dict, rejects: list) -> None:
    """Write rejects.tsv, then manifest.json last: the manifest's arrival completes DST."""
    data = manifest_bytes(manifest, dst)
    atomic_write(os.path.join(dst, fmt.REJECTS_NAME), rejects_tsv(rejects))
    atomic_write(os.path.join(dst, fmt.MANIFEST_NAME), data)


def manifest_bytes(manifest: dict, dst) -> bytes:
    """The manifest file's bytes; ConversionError when they exceed what a reader takes
    (never a data set its own reader refuses)."""
    data = fmt.encode_meta(manifest)
    if len(data) > fmt.MAX_MANIFEST_BYTES:
        raise ConversionError(
            f"{dst}: the manifest would be {len(data)} bytes, more than the "
            f"{fmt.MAX_MANIFEST_BYTES} a reader takes ({len(manifest['rejects'])} rejects, "
            f"{len(manifest['classes'])} classes, {len(manifest['shards'])} shards); no "
            f"manifest was written: fix or leave out the rejected inputs, or pack fewer classes "
            f"or larger shards")
    return data


def final_manifest(src, inputs, opts, state, progress, engine: str, provenance: bool) -> dict:
    """The finished data set's manifest from the packing ``state`` (packing.State) and
    ``opts`` (PackOptions); ConversionError (naming ``src`` and the most common reasons)
    when not one input could be packed."""
    if not state.shards:
        reasons = Counter(r for _, r in state.rejects).most_common(3)
        raise ConversionError(f"{src}: none of the {len(inputs.paths)} inputs could be "
                              f"packed; most common reasons: "
                              + "; ".join(f"{why} ({n}x)" for why, n in reasons))
    manifest = build_manifest(inputs, opts, state.shards, state.rejects, state.reencoded,
                              state.class_counts.tolist(), progress.elapsed, state.lossless,
                              provenance=provenance, engine=engine,
                              fields=settle(getattr(inputs, "fields", None), state.shapes))
    problem = fmt.accounting_problem(manifest)
    if problem:  # never a data set with an input silently gone
        raise ConversionError(f"{src}: {problem} (the packing state does not add up: a "
                              f"damaged or edited journal?); no manifest was written")
    return manifest


def summary(dst, manifest, state, inputs, progress, resumed_from) -> dict:
    """What ``convert`` returns (and ``dlpack convert`` prints): counts, rates, and what
    the scan found along the way. ``num_samples`` is the data set's; ``run_samples`` (and
    the rates over ``seconds``) this run's, which differ after --resume and --append."""
    empty = [c for c, n in zip(manifest["classes"], manifest["class_counts"]) if n == 0]
    seconds = progress.elapsed
    return {"dst": dst, "num_samples": manifest["num_samples"], "num_shards": len(state.shards),
            "num_bytes": manifest["num_bytes"], "rejects": len(state.rejects),
            "annotation_rejects": len(annotation_rejects(inputs)),
            "reencoded": dict(state.reencoded), "lossless": dict(state.lossless),
            "ignored": dict(inputs.ignored or {}), "resumed_from": resumed_from,
            "seconds": seconds, "run_samples": progress.packed,
            "images_per_s": progress.packed / max(seconds, 1e-9),  # one clock reading for all
            "mb_per_s": progress.bytes / 1e6 / max(seconds, 1e-9), "empty_classes": empty,
            "via_links": inputs.via_links, "outside_src": inputs.outside_src,
            "repeated_dirs": inputs.repeated_dirs, "hidden_files": inputs.hidden_files,
            "hidden_dirs": inputs.hidden_dirs, "mode": manifest["mode"],
            "size": manifest["options"].get("size"),
            "max_side": manifest["options"].get("max_side"), "fields": manifest.get("fields", {}),
            "sidecars": dict(getattr(inputs, "sidecars", None) or {})}
