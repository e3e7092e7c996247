"""Tables and chart of the remote section of ``dlpack bench`` (tools/bench/remote.py)."""
from __future__ import annotations

import statistics


def summarize(result: dict) -> list:
    """Median per (contender, rtt) of images/s, first batch, CPU costs."""
    groups = {}
    for r in result["runs"]:
        groups.setdefault((r["contender"], r["rtt_ms"]), []).append(r)
    rows = []
    for (name, rtt), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            rows.append({"contender": name, "rtt_ms": rtt, "error": rs[0]["error"]})
            continue
        med = lambda k: statistics.median(r[k] for r in ok)  # noqa: E731
        rows.append({"contender": name, "rtt_ms": rtt, "runs": len(ok),
                     "images_per_s": med("images_per_s"), "first_batch_s": med("first_batch_s"),
                     "cpu_s": med("cpu_s"), "server_cpu_s": med("server_cpu_s"),
                     "proxy_cpu_s": med("proxy_cpu_s"),
                     "images_per_cpu_s": statistics.median(r["images"] / r["cpu_s"] for r in ok),
                     **_warm(ok)})
    return rows


def _warm(ok: list) -> dict:
    """Medians of the epoch-1 (warm cache) figures of runs that have them."""
    warm = [r for r in ok if "images_per_s_e1" in r]
    if not warm:
        return {}
    med = lambda k: statistics.median(r[k] for r in warm)  # noqa: E731
    return {"images_per_s_e1": med("images_per_s_e1"), "first_batch_s_e1": med("first_batch_s_e1"),
            "cpu_ms_per_image_e1": statistics.median(1e3 * r["cpu_s_e1"] / r["images_e1"]
                                                     for r in warm),
            "bytes_fetched_e1": med("bytes_fetched_e1") if warm[0]["bytes_fetched_e1"] is not None
            else None}


def warm_markdown(rows: list) -> list:
    """Lines of the epoch-0 / epoch-1 table: images/s and CPU-ms per image per contender
    and RTT, epoch 1 (warm cache) beside epoch 0 (cold) for those that keep a cache."""
    out = ["", "| contender @ RTT | epoch 0 images/s | CPU ms/image | epoch 1 (warm) images/s | "
           "CPU ms/image | epoch 1 MB fetched |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            continue
        e1 = ("| - | - | - |" if "images_per_s_e1" not in r else
              f"| {r['images_per_s_e1']:.0f} | {r['cpu_ms_per_image_e1']:.2f} | "
              + ("-" if r["bytes_fetched_e1"] is None else f"{r['bytes_fetched_e1'] / 1e6:.2f}")
              + " |")
        out.append(f"| {r['contender']} @ {r['rtt_ms']} ms | {r['images_per_s']:.0f} | "
                   f"{1e3 / r['images_per_cpu_s']:.2f} " + e1)
    return out


def markdown(result: dict) -> str:
    """Tables: images/s by RTT, then first batch and CPU per contender at 20 ms."""
    rows = summarize(result)
    rtts = sorted({r["rtt_ms"] for r in rows})
    by = {(r["contender"], r["rtt_ms"]): r for r in rows}
    out = ["| contender | " + " | ".join(f"{t} ms" for t in rtts) + " |",
           "|---|" + "---|" * len(rtts)]
    for name in dict.fromkeys(r["contender"] for r in rows):
        cells = [by.get((name, t), {}) for t in rtts]
        out.append(f"| {name} | " + " | ".join(
            f"{c['images_per_s']:.0f}" if "images_per_s" in c else c.get("error", "-")[:40]
            for c in cells) + " |")
    out += ["", "| contender (per RTT: median) | first batch s | loader CPU s | images per loader "
            "CPU-s | server CPU s | proxy CPU s |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" not in r:
            out.append(f"| {r['contender']} @ {r['rtt_ms']} ms | {r['first_batch_s']:.2f} | "
                       f"{r['cpu_s']:.1f} | {r['images_per_cpu_s']:.0f} | "
                       f"{r['server_cpu_s']:.1f} | {r['proxy_cpu_s']:.1f} |")
    out += warm_markdown(rows)
    out += ["", "| ratio (median over rounds, each within one round) | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in ratios(result).items()]
    total = result["data"]["bytes"]
    for r in result["two_ranks"]:
        if "error" not in r:
            out.append(f"\nours-records, rank of 2: {r['images']} images, fetched "
                       f"{r['bytes_fetched'] / 1e6:.1f} MB = {r['bytes_fetched'] / total:.2f} "
                       f"of the JPEG bytes")
    return "\n".join(out)


def section_markdown(result: dict) -> str:
    """The remote section's markdown, or why it measured nothing."""
    return result["skipped"] if result.get("skipped") else markdown(result)


def chart(result: dict, path: str) -> bool:
    """images/s against added RTT per contender (False when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in summarize(result) if "error" not in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["contender"] for r in rows):
        pts = sorted((r["rtt_ms"], r["images_per_s"]) for r in rows if r["contender"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("added round trip (ms)")
    ax.set_ylabel("images/s, first epoch, cold cache")
    ax.set_title(f"{result['data']['images']} JPEGs from S3 (SeaweedFS), batch 256, 2 workers")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def _per_round(result: dict) -> dict:
    """{(round, rtt): {contender: images/s}} of the successful runs; epoch 1 (warm cache)
    as contender ``name + "@e1"``."""
    out = {}
    for r in result["runs"]:
        if "error" not in r:
            cell = out.setdefault((r["round"], r["rtt_ms"]), {})
            cell[r["contender"]] = r["images_per_s"]
            if r.get("images"):
                cell[r["contender"] + "#cpu"] = r["cpu_s"] / r["images"]
            if "images_per_s_e1" in r:
                cell[r["contender"] + "@e1"] = r["images_per_s_e1"]
    return out


def ratios(result: dict, rtt: int = 20) -> dict:
    """The issue's targets as medians of ratios taken within one round (contenders that ran
    back to back), so that load from other jobs on the machine mostly cancels out."""
    rounds = _per_round(result)

    def med(a, b, rtt_a=rtt, rtt_b=rtt):
        vals = [rounds[(n, rtt_a)][a] / rounds[(n, rtt_b)][b] for n in {k[0] for k in rounds}
                if a in rounds.get((n, rtt_a), {}) and b in rounds.get((n, rtt_b), {})]
        return round(statistics.median(vals), 2) if vals else None
    cold = {}
    for t in sorted({k[1] for k in rounds}):  # the first-epoch targets, at every RTT
        cold[f"records / local disk @ {t} ms (target >= 0.85)"] = \
            med("ours-records", "ours-local", t, t)
        cold[f"records CPU per image / local disk's @ {t} ms (target <= 1.15)"] = \
            med("ours-records#cpu", "ours-local#cpu", t, t)
    return cold | {
            f"records / dataloader-1 @ {rtt} ms (target >= 20)": med("ours-records", "dataloader-1"),
            f"records / dataloader-16 @ {rtt} ms (target >= 2)": med("ours-records", "dataloader-16"),
            f"records / streaming @ {rtt} ms (target > 1)": med("ours-records", "streaming"),
            f"records / litdata @ {rtt} ms": med("ours-records", "litdata"),
            f"shards / local disk @ {rtt} ms": med("ours-shards", "ours-local"),
            "records @ 50 ms / records @ 0 ms (target >= 0.9)":
                med("ours-records", "ours-records", 50, 0),
            f"records epoch 1 / local disk epoch 1 @ {rtt} ms (target >= 0.95)":
                med("ours-records@e1", "ours-local@e1"),
            f"shards epoch 1 / local disk epoch 1 @ {rtt} ms": med("ours-shards@e1", "ours-local@e1"),
            f"streaming epoch 1 / local disk epoch 1 @ {rtt} ms": med("streaming@e1", "ours-local@e1"),
            f"litdata epoch 1 / local disk epoch 1 @ {rtt} ms": med("litdata@e1", "ours-local@e1")}
