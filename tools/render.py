"""Plain-text renderings of the dicts that inspection and verification return."""
from __future__ import annotations


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (powers of 1000, as disk vendors and --shard-size count)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 shard', '2 shards', '1 class', '3 classes' (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _reasons(counts: dict) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(counts.items()))


def raw_mode_text(n: int, size, max_side) -> str:
    """What raw mode did to every one of ``n`` images (it never keeps a file's bytes)."""
    if size:
        how = f"shorter side resized to {size} and center-cropped to {size}x{size} (--size)"
    elif max_side:
        how = f"longer side bounded to {max_side} (--max-side), aspect ratio kept"
    else:
        how = "at their own size"
    return f"decoded to raw RGB pixels: {n} (raw mode: {how})"


def convert_counts(result: dict) -> str:
    """What `dlpack convert` did with its inputs: kept, transformed, re-encoded, skipped."""
    changed = sum(result["reencoded"].values()) + sum(result.get("lossless", {}).values())
    if result.get("mode") == "raw":
        return "\n".join([raw_mode_text(result["num_samples"], result.get("size"),
                                        result.get("max_side"))] + _skip_lines(result))
    records = result.get("num_records", result["num_samples"])  # retired ones included
    lines = [f"original bytes kept: {records - changed}; "
             f"transformed losslessly: {sum(result.get('lossless', {}).values())}"
             + (f" ({_reasons(result['lossless'])})" if result.get("lossless") else "")
             + f"; re-encoded: {sum(result['reencoded'].values())}"
             + (f" ({_reasons(result['reencoded'])})" if result["reencoded"] else "")
             + (f" (of the {records} records stored, {result['retired']} retired by "
                f"--replace-changed)" if result.get("retired") else "")]
    return "\n".join(lines + _skip_lines(result))


def _skip_lines(result: dict) -> list:
    lines = [f"skipped {result['rejects']}" + (" (see rejects.tsv)" if result["rejects"] else "")]
    if result.get("annotation_rejects"):
        lines.append(f"annotations rejected: {result['annotation_rejects']} (their images "
                     f"packed without them; see rejects.tsv)")
    if result.get("ignored"):
        lines.append(f"ignored {plural(sum(result['ignored'].values()), 'file')} without an "
                     f"image suffix ("
                     + ", ".join(f"{s} {n}" for s, n in result["ignored"].items()) + ")")
    return lines


def _size_line(stats: dict) -> str:
    if not stats:
        return "-"
    h, w = stats["height"], stats["width"]
    return (f"height {h['min']}..{h['max']} (median {h['median']:g}), "
            f"width {w['min']}..{w['max']} (median {w['median']:g})")


def _storage_text(st: dict, mode: str = "jpeg", options: dict | None = None) -> str:
    if mode == "raw":
        o = options or {}
        return "stored        " + raw_mode_text(st["raw_records"], o.get("size"),
                                                o.get("max_side"))
    at = ", ".join(f"{n} {what}" for what, n in st["at_decode"].items() if n)
    kept = f" ({st['file_records']} PNG/WebP files kept as they are)" \
        if st.get("file_records") else ""
    lines = [f"stored        {st['original_bytes']} with their original bytes{kept}"
             + (f" (the reader applies: {at})" if at else ""),
             f"              {sum(st['lossless'].values())} transformed losslessly"]
    lines += [f"                {n:6d}  {why}" for why, n in st["lossless"].items()]
    lines.append(f"              {sum(st['reencoded'].values())} re-encoded")
    lines += [f"                {n:6d}  {why}" for why, n in st["reencoded"].items()]
    return "\n".join(lines)


def _kinds_text(st: dict) -> str:
    """The records by kind, when they are not all what the mode's name says."""
    kinds = {"JPEG": st.get("jpeg_records", 0), "raw": st.get("raw_records", 0),
             "PNG/WebP file": st.get("file_records", 0),
             "decoded-planes": st.get("planes_records", 0)}
    if sum(1 for n in kinds.values() if n) <= 1 and not st.get("file_records") and \
            (kinds["JPEG"] or not kinds["raw"]):
        return ""
    return " (records: " + ", ".join(plural(n, what) for what, n in kinds.items() if n) + ")"


def _no_classes_text(labels_from) -> str:
    """Why a data set has no classes, as it was packed."""
    return {"coco": " (a COCO set: every label is -1; the categories are the 'categories' "
                    "field of each sample)",
            "list": " (the list gave no labels: every label is -1)"}.get(
        labels_from, " (packed with --no-labels: every label is -1)")


def summary_text(s: dict, max_classes: int = 30) -> str:
    """Readable multi-line summary of inspection.summary()."""
    opts = ", ".join(f"{k}={v}" for k, v in sorted(s["options"].items()))
    source = s["source"]
    root = source.get("root") or "(left out: packed with --no-provenance)"
    lines = [
        f"data set      {s['path']}",
        f"format        {s['format']} (version {s['version']}), mode {s['mode']}"
        + _kinds_text(s["storage"]),
        f"samples       {plural(s['num_samples'], 'sample')} in {plural(s['num_shards'], 'shard')}, "
        f"{human_bytes(s['num_bytes'])} ({human_bytes(s['record_bytes']['mean'])}/record mean)"
        + (f"; {plural(s['retired'], 'record')} retired (replaced by an append: "
           f"--replace-changed)" if s.get("retired") else ""),
        f"image size    {_size_line(s['image_size'])}",
        f"options       {opts}",
        f"source        {root} ({plural(source.get('num_inputs', 0), 'input')}"
        + (f", list {source['list']})" if source.get('list') else ")"),
        f"created       {s['created'].get('at')} in {s['created'].get('seconds')} s "
        f"with {s['created'].get('pil')}"
        + "".join(f"\nappended      {h['at']}: +{h['num_samples']} samples from "
                  f"{h['first_sample']} in {len(h['shards'])} shards ({h['duplicates']} "
                  f"duplicates, {h['changed']} changed"
                  + (f", {h['replaced']} of them replaced" if h.get("replaced") else " skipped")
                  + "; new classes: "
                  f"{', '.join(h['new_classes'][:5]) or 'none'})"
                  for h in s.get("history", [])),
        _storage_text(s["storage"], s["mode"], s["options"]),
        f"rejects       {s['num_rejects']}"
        + "".join(f"\n                {r['path']}: {r['reason']}" for r in s["rejects"][:10])
        + ("\n                ... (all in rejects.tsv)" if s["num_rejects"] > 10 else ""),
        f"classes       {len(s['classes'])}" + ("" if s["classes"] else
                                                   _no_classes_text(s.get("labels_from"))),
    ]
    for c in s["classes"][:max_classes]:
        lines.append(f"  {c['label']:5d}  {c['count']:8d}  {c['name']}")
    if len(s["classes"]) > max_classes:
        lines.append(f"  ... {len(s['classes']) - max_classes} more (use --json)")
    if s.get("fields"):
        from dlpack_io.tools.fieldreport import field_text

        lines.append(field_text(s["fields"]))
    return "\n".join(lines)


def shard_text(d: dict) -> str:
    """Readable detail of inspection.shard_detail()."""
    lines = [f"shard {d['shard']}  {d['path']}",
             f"  {d['num_samples']} records (record numbers {d['first_sample']}.."
             f"{d['first_sample'] + d['num_samples'] - 1}), {human_bytes(d['bytes'])}, "
             f"crc {d['crc']:#010x}",
             f"  image size {_size_line(d['image_size'])}",
             "  label counts " + (", ".join(f"{label}: {n}" for label, n in
                                            enumerate(d["label_counts"]) if n) or "-"),
             "  sample  record      offset   length  label  size      kind  source"]
    for r in d["records"]:
        lines.append(f"  {'retired' if r['sample'] is None else r['sample']:>6}  {r['record']:6d}  {r['offset']:10d}  {r['length']:7d}  "
                     f"{r['label']:5d}  {r['height']}x{r['width']:<5d} {r['kind']:5s} {r['source']}")
    return "\n".join(lines)


def record_text(r: dict) -> str:
    """Readable detail of inspection.record_detail()."""
    keys = ("sample", "shard", "record", "offset", "length", "label", "class", "height",
            "width", "channels", "kind", "orientation", "colour", "source", "crc", "crc_ok")
    lines = [f"{k:9s} {r[k]:#010x}" if k == "crc" else f"{k:9s} {r[k]}" for k in keys]
    lines += [f"field     {name} = {value!r:.200}" for name, value in r.get("fields", {}).items()]
    return "\n".join(lines)


def verify_text(report: dict) -> str:
    """One line per problem, then a verdict line."""
    lines = [f"{p['where']}: {p['problem']}" for p in report["problems"]]
    if report.get("not_a_dataset"):
        lines.append(f"NOT A DATA SET: {report['path']}")
        return "\n".join(lines)
    verdict = "OK" if report["ok"] else f"DAMAGED ({plural(len(report['problems']), 'problem')})"
    from dlpack_io.tools.shardcheck import EXIT_UNREACHABLE

    if report.get("exit_code") == EXIT_UNREACHABLE:  # storage unreadable: not damage
        verdict = (f"NOT CHECKED, STORAGE UNREADABLE ({plural(len(report['problems']), 'problem')}"
                   f"; nothing read was damaged)")
    lines.append(f"{verdict}: {report['path']}: {plural(report['shards_checked'], 'shard')}, "
                 f"{plural(report['records_checked'], 'record')}, "
                 f"{human_bytes(report['bytes_checked'])} checked")
    return "\n".join(lines)
