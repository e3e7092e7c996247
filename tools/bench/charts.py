"""PNG charts (matplotlib, Agg): throughput per contender and scaling with workers / batch."""
from __future__ import annotations

import os


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _colors(names) -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def throughput(result, path: str) -> None:
    """Bars: images/s per contender at each worker count, one panel per mode, with limits."""
    plt = _plt()
    modes = result["options"]["modes"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        groups = [g for g in result["groups"] if g["kind"] == "workers" and g["mode"] == mode]
        names = list(result["families"])
        height = 0.8 / max(1, len(groups))
        for k, g in enumerate(groups):
            vals = [next((r.get("images_per_s", 0) for r in g["rows"] if r["family"] == n), 0)
                    for n in names]
            ax.barh([i + k * height for i in range(len(names))], vals, height,
                    label=f"{g['workers']} workers")
        per_core = result["limits"].get(f"work_{mode}_per_core")
        for cores, style in ((1, ":"), (result["environment"]["cores"] or 1, "--")):
            if per_core:
                ax.axvline(per_core * cores, color="black", ls=style, lw=0.8,
                           label=f"work alone x {cores} core{'s' if cores > 1 else ''}")
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("images/s")
        ax.set_title(f"W_{mode}, batch 256")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _lines(groups, key: str, mode: str) -> dict:
    lines = {}
    for g in groups:
        if g["mode"] != mode:
            continue
        for r in g["rows"]:
            if "speedup" in r and r["family"] != "serial":
                lines.setdefault(r["family"], []).append((g[key], r["speedup"]))
    return lines


def scaling(result, path: str) -> None:
    """Speedup over serial against workers (one panel per mode) and against batch size."""
    plt = _plt()
    colors = _colors(list(result["families"]))
    panels = [("workers", m) for m in result["options"]["modes"]]
    panels += [("batch", m) for m in result["options"]["modes"]
               if any(g["kind"] == "batch" and g["mode"] == m for g in result["groups"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (kind, mode) in zip(axes[0], panels):
        key = "workers" if kind == "workers" else "batch_size"
        groups = [g for g in result["groups"] if g["kind"] == kind]
        for family, pts in _lines(groups, key, mode).items():
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label=family, color=colors[family])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel(key.replace("_", " "))
        if kind == "workers":
            ax.set_xticks(sorted({g["workers"] for g in groups}))
            if mode == "raw":
                ax.set_yscale("log")  # ours' raw path is an order of magnitude off the rest
        else:
            ax.set_xscale("log")
        ax.set_title(f"W_{mode}: speedup over serial")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def draw(result, out) -> dict:
    """Both charts as PNG files in ``out``."""
    paths = {"throughput_png": os.path.join(out, "bench-throughput.png"),
             "scaling_png": os.path.join(out, "bench-scaling.png")}
    throughput(result, paths["throughput_png"])
    scaling(result, paths["scaling_png"])
    return paths
