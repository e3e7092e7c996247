"""What ``dlpack convert --append`` prints, and which of its options the user gave (the
others come from the data set's manifest)."""
from __future__ import annotations

from click.core import ParameterSource

# convert's parameter names that differ from the packing option they set
_PARAM_OF = {"format": "data_format", "jpeg_restarts": "restart_markers"}


def given_only(ctx, options: dict) -> dict:
    """``options`` without those left at their command-line default."""
    return {key: value for key, value in options.items()
            if ctx.get_parameter_source(_PARAM_OF.get(key, key)) != ParameterSource.DEFAULT}


def append_lines(result: dict) -> list[str]:
    """The lines saying what an append added, skipped and reported."""
    from dlpack_io.tools.render import plural

    a = result["append"]
    lines = [f"appended {plural(a['new_samples'], 'image')} in "
             f"{plural(len(a['new_shards']), 'new shard')} to {a['base_samples']} "
             f"(now {result['num_samples']} in {result['num_shards']} shards); of "
             f"{plural(a['seen'], 'input')} in SRC: {a['duplicates']} already there "
             f"(same path and content), {a['changed']} changed, {a['unverified']} packed "
             f"before content hashes were recorded (skipped by path)"]
    if "quick" in a:  # how the duplicates were found (packer/appendbase.py)
        lines.append(f"{plural(a['quick'], 'file')} unchanged by size and mtime (not read), "
                     f"{plural(a['hashed'], 'file')} hashed" + ("" if a["hashed"] or not
                     a["quick"] else " (--checksum hashes every one)"))
    if a["new_classes"]:
        lines.append(f"new classes (indices after the old ones): "
                     f"{', '.join(a['new_classes'][:10])}"
                     + (f" and {len(a['new_classes']) - 10} more" if len(a['new_classes']) > 10
                        else ""))
    if a.get("replaced"):
        lines.append(f"replaced {plural(a['replaced'], 'changed input')} (--replace-changed: "
                     f"new content packed, old record retired, the sample keeps its index): "
                     + ", ".join(a["replaced_paths"][:5]))
    if a["changed"] > a.get("replaced", 0):
        lines.append(f"WARNING: {plural(a['changed'] - a.get('replaced', 0), 'input')} "
                     f"changed since packed (left as they are; --replace-changed packs the "
                     f"new content): " + ", ".join(p for p in a["changed_paths"][:5]
                                                   if p not in a.get("replaced_paths", ())))
    if result.get("nothing_new"):
        lines.append("nothing new: the data set is unchanged")
    return lines
