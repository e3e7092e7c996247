"""The result of ``dlpack bench`` as JSON, a markdown report and PNG charts."""
from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)
NOISY = 0.25  # epochs of one configuration further apart than this (of the median) get a dagger


def _fmt(x, digits=0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _cell(row) -> str:
    if row is None:
        return "-"
    if "images_per_s" not in row:
        return f"failed: {row.get('error', '?')[:80]}"
    noisy = "†" if row.get("spread", 0) > NOISY else ""
    cpu = f", {row['cpu_ms_per_image']:.2f} CPU-ms" if "cpu_ms_per_image" in row else ""
    return f"{row['images_per_s']:,.0f} ({row.get('speedup', 0):.2f}x{cpu}){noisy}"


def convert_table(result) -> list:
    """Markdown lines: one row per store (writer), images/s and MB/s of input read."""
    lines = ["| writer | mode | reads | images/s | MB/s in | median s |",
             "|---|---|---|---:|---:|---:|"]
    for key, r in result["convert"].items():
        if key.startswith("files-"):
            continue
        name = r.get("writer", r["store"])
        if "median_s" in r:
            lines.append(f"| {name} | {r['mode']} | {r['input']} | {_fmt(r['images_per_s'])} "
                         f"| {_fmt(r['mb_per_s'], 1)} | {r['median_s']:.2f} |")
        else:
            lines.append(f"| {name} | {r['mode']} | {r['input']} | {r.get('error', '-')} | | |")
    return lines


def _per_round(a: dict, b: dict):
    """images/s of a over b in each round both ran (rows' seconds are listed by round)."""
    if not a.get("seconds") or len(a["seconds"]) != len(b.get("seconds", ())):
        return None
    return [(a["images"] / sa) / (b["images"] / sb) for sa, sb in zip(a["seconds"], b["seconds"])]


def _per_round_cpu(a: dict, b: dict):
    """CPU per image of a over b in each round both ran (cpu_s, like seconds, by round)."""
    ca, cb = a.get("cpu_s") or (), b.get("cpu_s") or ()
    if not ca or len(ca) != len(cb) or not all(cb):
        return None
    return [(x / a["images"]) / (y / b["images"]) for x, y in zip(ca, cb)]


# (what, numerator, denominator): images/s ratios, median over rounds of the ratio measured
# within one round; loader rows are "family mode" at the largest worker count, batch 256
LOADER_RATIOS = (
    ("jpeg: ours (threads) / DataLoader over files (target >= 2.0)", "ours-thread jpeg",
     "dataloader-files jpeg"),
    ("jpeg: ours (threads) / DataLoader over our shards (target >= 1.3)", "ours-thread jpeg",
     "dataloader-ours jpeg"),
    ("raw: ours (threads) / DataLoader over .npy files (target >= 5.0)", "ours-thread raw",
     "dataloader-npy raw"),
    ("jpeg: ours, restart-marker records / plain records", "ours-thread jpeg", "ours-plain jpeg"),
    ("jpeg: ours, thread / process workers", "ours-thread jpeg", "ours-process jpeg"),
    ("raw: ours, thread / process workers", "ours-thread raw", "ours-process raw"))
CONVERT_RATIOS = (
    ("jpeg: ours record (validated) / webdataset ShardWriter", "ours-record-jpeg",
     "webdataset-jpeg"),
    ("jpeg: ours LMDB (validated) / webdataset ShardWriter", "ours-lmdb-jpeg", "webdataset-jpeg"),
    ("raw: ours record, all cores / 1 worker", "ours-record-raw", "ours-record-1w-raw"),
    ("raw: ours LMDB, all cores / 1 worker", "ours-lmdb-raw", "ours-lmdb-1w-raw"),
    ("jpeg: ours record without / with restart markers (time with / without)",
     "ours-record-plain-jpeg", "ours-record-jpeg"),
    ("jpeg: ours record without / with validation", "ours-record-novalidate-jpeg",
     "ours-record-jpeg"))


def ratios(result) -> dict:
    """The target ratios of the loader and convert sections that this run measured."""
    import statistics

    top = max(result["options"]["workers"])
    rows = {f"{r['family']} {r['mode']}": r for g in result["groups"]
            if g["kind"] == "workers" and g["workers"] == top for r in g["rows"]}
    out = {}
    for table, pairs in ((rows, LOADER_RATIOS), (result["convert"], CONVERT_RATIOS)):
        for what, a, b in pairs:
            per = _per_round(table.get(a, {}), table.get(b, {})) if a in table else None
            if per:
                out[what] = {"median": statistics.median(per), "rounds": [round(x, 2) for x in per]}
    a, b = rows.get("ours-thread jpeg"), rows.get("dataloader-files jpeg")
    per = _per_round_cpu(a, b) if a and b else None
    if per:
        out["jpeg: ours (threads) CPU per image / DataLoader over files' (target <= 0.5)"] = {
            "median": statistics.median(per), "rounds": [round(x, 2) for x in per]}
    ours = rows.get("ours-thread jpeg", {}).get("images_per_s")
    limit = result.get("limits", {}).get("decode_limit_ours-record-jpeg")
    if ours and limit:
        out["jpeg: ours (threads) / our region decode alone, one thread per core"] = {
            "median": ours / limit, "rounds": []}
    return out


def ratio_table(result) -> list:
    """Markdown lines: the target ratios measured."""
    found = ratios(result)
    if not found:
        return []
    lines = ["| ratio (median over rounds of the ratio within each round) | measured | rounds |",
             "|---|---:|---|"]
    return lines + [f"| {k} | {v['median']:.2f} | {v['rounds'] or '-'} |" for k, v in found.items()]


def _ceiling(result, key: str, workers: int):
    per_core = result["limits"].get(key)
    cores = min(max(1, workers), result["environment"]["cores"] or 1)
    return None if per_core is None else per_core * cores


LIMIT_ROWS = (("*limit: the same work alone, per sample (PIL / numpy), x cores used*",
               {"jpeg": "work_jpeg_per_core", "raw": "work_raw_per_core"}),
              ("*limit: JPEG decode alone (jpeg) / gathering 256 raw rows (raw), x cores*",
               {"jpeg": "decode_full_per_core", "raw": "gather_256_images_per_s"}))


def load_table(result) -> list:
    """Markdown lines: contender x (mode, workers) images/s (speedup over serial, CPU-ms per
    image of the contender's whole process tree), batch 256."""
    groups = [g for g in result["groups"] if g["kind"] == "workers"]
    lines = ["| contender | " + " | ".join(f"{g['mode']} w{g['workers']}" for g in groups)
             + " | peak PSS MB (max over its runs) |", "|---|" + "---:|" * (len(groups) + 1)]
    for name, info in result["families"].items():
        cells, peak = [], 0
        for g in groups:
            row = next((r for r in g["rows"] if r["family"] == name), None)
            cells.append(_cell(row))
            if row and "memory" in row:
                peak = max(peak, row["memory"]["pss_kb"] / 1024)
        label = info["label"] + ("" if info["same_work"] else " *")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(peak or None)} |")
    lines.append(_foreign_row(groups))
    for label, keys in LIMIT_ROWS:
        cells = [_fmt(_ceiling(result, keys[g["mode"]], g["workers"])) for g in groups]
        lines.append(f"| {label} | " + " | ".join(cells) + " | |")
    return lines


def batch_table(result) -> list:
    """Markdown lines: speedup over serial by batch size."""
    groups = [g for g in result["groups"] if g["kind"] == "batch"]
    if not groups:
        return []
    names = sorted({(r["family"], r["workers"]) for g in groups for r in g["rows"]})
    lines = ["| contender | " + " | ".join(f"{g['mode']} b{g['batch_size']}" for g in groups) + " |",
             "|---|" + "---:|" * len(groups)]
    for family, w in names:
        cells = [_cell(next((r for r in g["rows"] if (r["family"], r["workers"]) == (family, w)),
                            None)) for g in groups]
        lines.append(f"| {family} w{w} | " + " | ".join(cells) + " |")
    lines.append(_foreign_row(groups))
    return lines


def limits_table(result) -> list:
    """Markdown lines: the physical limits."""
    lim = result["limits"]
    names = {"decode_full_per_core": "JPEG decode, PIL, per core (images/s)",
             "decode_draft_half_per_core": "JPEG decode, PIL draft 1/2 scale, per core",
             "work_jpeg_per_core": "W_jpeg alone (decode+crop+resize+flip+CHW), per core",
             "work_raw_per_core": "W_raw alone (crop+flip+CHW), per core",
             "gather_256_images_per_s": "random gather of 256 raw rows from memmap (images/s)",
             "gather_gb_per_s": "  the same in GB/s", "memcpy_gb_per_s": "memcpy, 1 thread (GB/s)",
             "ours_gather_gb_per_s": "ours, device path: 1 thread gathers whole raw records (GB/s)",
             "ours_gather_images_per_s": "  the same in images/s",
             "ours_gather_vs_memcpy": "  the same / memcpy in the same rounds (target >= 0.5)",
             "pil_full_decode_us": "per image: PIL full decode (us)",
             "peer_work_us": "per image: the DataLoader's whole W_jpeg (us)",
             "region_decode_us": "per image: our region decode (us)",
             "loader_work_us": "per image: our whole work (us)",
             "decode_limit_ours-record-jpeg": "our region decode + resize alone, 1 thread per "
                                              "core (images/s)",
             "decode_limit_ours-record-plain-jpeg": "  the same, records without restart markers",
             "first_batch_s": "time to the first batch, Dataset(path) -> batch (s, target < 1)",
             "first_batch_s_with_imports": "  the same including import torch (s)",
             "first_batch_samples": "  samples in that data set"}
    lines = ["| limit | value |", "|---|---:|"]
    digits = {"first_batch_s": 2, "first_batch_s_with_imports": 2, "ours_gather_vs_memcpy": 2}
    lines += [f"| {label} | {_fmt(lim[k], digits.get(k, 1 if 'gb' in k else 0))} |"
              for k, label in names.items() if k in lim]
    return lines


def _header(result) -> list:
    env = result["environment"]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v != "not installed")
    peers = "; ".join(f"{k}: {v.get('version') or v.get('reason')}" for k, v in result["peers"].items())
    n = next((r["images"] for r in result["convert"].values() if "images" in r),
             result.get("remote", {}).get("data", {}).get("images", "?"))
    return [
        f"Measured {env['date']} on {env['cpu']}, {env['cores']} cores, {env['memory_gib']} GiB, "
        f"{env['platform']}, Python {env['python']}; GPU: {env['gpu']}. Load average before "
        f"{_loads(env['load_before'])}, after {_loads(env.get('load_after'))}. {n} images, "
        f"{'--quick' if result['options']['quick'] else 'full'} run of section(s) "
        f"{', '.join(result['options']['sections'])}, {result['seconds']:.0f} s.",
        "", f"Versions: {vers}.", "", f"Peers: {peers}."] + _source_note(result)


def _source_note(result) -> list:
    changed = result["options"].get("source_changes") or {}
    if not changed:
        return []
    return ["", "Source: " + "; ".join(f"{n} {why}" for why, n in sorted(changed.items()))
            + " (re-encoded inputs as upright RGB JPEGs; bad ones left out: "
              "tools/bench/prepare.py)."]


def _loader_parts(result) -> list:
    parts = ["", "### Load: images/s (speedup over the serial loop measured in the same "
                 "group, CPU-ms per image of the contender's processes), batch 256", ""]
    parts += load_table(result) + ["", "\\* not the same per-sample work: the peer's own "
                                   "decoder and resize. † its timed epochs spread more than "
                                   f"{NOISY:.0%} around the median. {foreign_text(result)}"]
    if batch_table(result):
        parts += ["", "### Scaling with batch size (images/s, speedup over serial)", ""]
        parts += batch_table(result)
    parts += ["", "### Limits (single core unless said)", ""]
    parts += limits_table(result)
    if result["environment"]["gpu"].startswith("none"):
        parts += ["", "GPU end-to-end: no GPU on this machine, not measured."]
    return parts


def markdown(result) -> str:
    """The whole report as markdown: the sections that ran, then the target ratios."""
    parts = _header(result)
    if "convert" in result["options"]["sections"]:
        parts += ["", "### Convert", ""] + convert_table(result)
    if result["groups"]:
        parts += _loader_parts(result)
    if ratio_table(result):
        parts += ["", "### Target ratios", ""] + ratio_table(result)
    if "remote" in result:
        from dlpack_io.tools.bench import remote_report

        parts += ["", "### Remote: first epoch from S3 (SeaweedFS behind the latency proxy), "
                      "cold cache", "", remote_report.section_markdown(result["remote"])]
    return "\n".join(parts) + "\n"


def _foreign_row(groups) -> str:
    cells = []
    for g in groups:
        loads = sorted(x for r in g["rows"] for x in r.get("foreign_cores", []))
        cells.append(f"{loads[len(loads) // 2]:.2f}" if loads else "-")
    return "| *other users' CPU during these epochs (cores, median)* | " + " | ".join(cells) + " |"


def foreign_text(result) -> str:
    """One sentence: CPU used by other users of the machine during the timed epochs."""
    loads = sorted(x for g in result["groups"] for r in g["rows"] for x in r.get("foreign_cores", []))
    if not loads:
        return ""
    median = loads[len(loads) // 2]
    busy = sum(x > 0.5 for x in loads) / len(loads)
    return (f"Other processes on this shared machine used a median {median:.2f} cores (max "
            f"{loads[-1]:.2f}) during the timed epochs; {busy:.0%} of epochs ran beside more "
            f"than half a core of foreign load.")


def _loads(loads) -> str:
    return "-" if not loads else "/".join(f"{x:.2f}" for x in loads)


def write_all(result, out) -> dict:
    """Write bench.json, bench.md and the charts into ``out``; return their paths."""
    paths = {"json": os.path.join(out, "bench.json"), "markdown": os.path.join(out, "bench.md")}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(result))
    try:
        if result["groups"]:
            from dlpack_io.tools.bench.charts import draw
            paths.update(draw(result, out))
        if result.get("remote", {}).get("runs"):
            from dlpack_io.tools.bench.remote_report import chart
            if chart(result["remote"], os.path.join(out, "bench-remote.png")):
                paths["remote_png"] = os.path.join(out, "bench-remote.png")
    except ImportError as exc:
        log.warning("charts skipped: %s", exc)
    result["files"] = paths
    return paths
