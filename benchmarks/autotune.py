"""Is ``num_workers="auto"`` as good as the best fixed setting? (issue 28)

    python -m benchmarks.autotune --root /tmp/autotune [--images 1024] [--repeats 5]

Three workloads: ImageNet-sized JPEGs (about 500x375) with RandomResizedCrop(224) + flip,
the same images packed raw at 256 px with a RandomResizedCrop(224) + flip, and the JPEGs
with a slow Python ``sample_transform`` (a pure-Python loop over 4,000 values that holds
the GIL for about a millisecond per image on this machine). Contenders: 1, 2 and 4 worker threads, 2 worker processes, and
``num_workers="auto", prefetch="auto"``. Each contender is a fresh Loader that reads
``--epochs`` epochs with no training step (the loop only takes batches: the hardest case
for the tuner, whose trials are not hidden behind a step); images/s over all epochs
(start-up and the tuner's trials included) and over the epochs after the first (steady
state). Every round runs each contender once, in turn, so a change in the machine's load
hits all alike (each round starts with the next contender); the figures are medians over
``--repeats`` rounds, and the ratios of auto to the best fixed setting and to today's default
(2 threads) are also taken within each round, then the median (a shared machine's capacity
drifts from round to round). ``all_over_steady`` (per contender, median over rounds) is
what the first epoch (start-up, and auto's trials) costs within one contender's own run,
a figure that the machine's drift between contenders does not enter.

``--check``: the contenders are 2 threads, auto, and auto without its later check of the
runner-up (confirm.py), interleaved the same way: what that check gains or costs, with
auto / auto-without-check as a third same-round ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from unittest import mock

SETTINGS = {"1 thread": dict(num_workers=1), "2 threads": dict(num_workers=2),
            "4 threads": dict(num_workers=4),
            "2 processes": dict(num_workers=2, worker_kind="process"),
            "auto": dict(num_workers="auto", prefetch="auto")}
# --check: auto against auto without its later check of the runner-up (confirm.py), and
# 2 threads, interleaved: what the check itself gains or costs
CHECK = {"2 threads": SETTINGS["2 threads"], "auto": SETTINGS["auto"],
         "auto, no check": dict(num_workers="auto", prefetch="auto", check=False)}


def slow_python(image):
    """A sample_transform that holds the GIL: a Python loop over 4,000 pixels."""
    flat = image.reshape(-1)
    total = 0
    for value in flat[:4_000].tolist():
        total += value
    return image if total >= 0 else image  # the image, unchanged, after the work


def epochs(ds, settings: dict, transforms, sample_transform, count: int, batch: int) -> dict:
    """Read ``count`` epochs with a fresh Loader; images/s over all and after the first."""
    from dlpack_io.reader import Loader

    settings = dict(settings)  # check=False: no runner-up, so no later check (confirm.py)
    no_check = mock.patch("dlpack_io.reader.batch.autotune.runner_up", lambda *args: None) \
        if not settings.pop("check", True) else contextlib.nullcontext()
    with no_check:
        loader = Loader(ds, batch_size=batch, transforms=list(transforms), seed=0,
                        sample_transform=sample_transform, **settings)
        marks, images = [time.perf_counter()], 0
        for _ in range(count):
            for x, _y in loader:
                images += len(x)
            marks.append(time.perf_counter())
    tuned = loader.stats().tuned
    loader.close()
    per_epoch = images / count
    return {"all": images / (marks[-1] - marks[0]),
            "steady": per_epoch * (count - 1) / (marks[-1] - marks[1]) if count > 1 else 0.0,
            "tuned": tuned}


def workloads(root: Path, images: int):
    """name -> (Dataset, transforms, sample_transform); packs the sets once under root."""
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.tools.synth import make_image_folder

    if not (root / "raw").exists():
        make_image_folder(root / "src", images, 10, seed=0)
        convert(root / "src", root / "jpeg", workers=1, progress=False, overwrite=True)
        convert(root / "src", root / "raw", mode="raw", size=256, workers=1, progress=False,
                overwrite=True)
    recipe = [RandomResizedCrop(224), RandomHorizontalFlip()]
    jpeg, raw = Dataset(str(root / "jpeg")), Dataset(str(root / "raw"))
    return {"JPEG, RRC 224 + flip": (jpeg, recipe, None),
            "raw 256 px, RRC 224 + flip": (raw, recipe, None),
            "JPEG + slow Python sample_transform": (jpeg, recipe, slow_python)}


def run(root: Path, images: int, repeats: int, count: int, batch: int, only: str = "",
        contenders: dict = SETTINGS) -> dict:
    """{workload: {setting: {"all": median images/s, "steady": ..., "tuned": [...]}}};
    ``only``: the workloads whose name holds it (all when empty)."""
    out = {}
    for name, (ds, transforms, fn) in workloads(root, images).items():
        if only not in name:
            continue
        rounds = {s: [] for s in contenders}
        for round_ in range(repeats):
            turn = round_ % len(contenders)
            order = list(contenders)[turn:] + list(contenders)[:turn]
            for setting in order:  # each round starts with another contender: none always last
                rounds[setting].append(epochs(ds, contenders[setting], transforms, fn, count,
                                              batch))
            print(json.dumps({"workload": name, "round": round_,
                              "loadavg": Path("/proc/loadavg").read_text().split()[:3]}),
                  flush=True)
        out[name] = {s: {"all": statistics.median(r["all"] for r in runs),
                         "steady": statistics.median(r["steady"] for r in runs),
                         "rounds": [[round(r["all"]), round(r["steady"])] for r in runs],
                         "tuned": [r["tuned"].split(" (")[0] for r in runs if r["tuned"]]}
                     for s, runs in rounds.items()}
        out[name]["auto"]["same_round"] = same_round(rounds)
        for s, runs in rounds.items():  # the first epoch's cost, within each contender's run
            out[name][s]["all_over_steady"] = round(statistics.median(
                r["all"] / r["steady"] for r in runs if r["steady"]), 2)
    return out


def same_round(rounds: dict) -> dict:
    """Medians over the rounds of auto / the best fixed setting of the same round and auto /
    today's default (2 threads) of the same round, "all" and "steady": a shared machine's
    capacity drifts between rounds, so ratios within a round compare like with like; with
    an "auto, no check" contender (--check), auto / it as a third figure."""
    fixed = [s for s in rounds if not s.startswith("auto")]
    out = {}
    for key in ("all", "steady"):
        out[key] = []
        for other in [fixed, ["2 threads"]] + [["auto, no check"]] * ("auto, no check" in rounds):
            ratios = [a[key] / max(rounds[s][r][key] for s in other)
                      for r, a in enumerate(rounds["auto"])]
            out[key].append(round(statistics.median(ratios), 2))
    return out


def table(results: dict) -> str:
    """A Markdown table: images/s per setting, auto over the best fixed setting (and over
    auto without its check, with --check)."""
    names = list(next(iter(results.values()), {}))
    fixed = [s for s in names if not s.startswith("auto")]
    check = "auto, no check" in names
    lines = ["| workload | " + " | ".join(names) + " | auto / best fixed (all, steady) "
             "| same round: auto / best fixed, auto / 2 threads" + ", auto / no check" * check
             + " (all; steady) | all / steady: 2 threads, auto | auto chose |",
             "|---" * (len(names) + 5) + "|"]
    for name, row in results.items():
        best_all = max(row[s]["all"] for s in fixed)
        best_steady = max(row[s]["steady"] for s in fixed)
        cells = [f"{row[s]['all']:,.0f} / {row[s]['steady']:,.0f}" for s in names]
        chose = "; ".join(sorted(set(row["auto"]["tuned"])))
        rs = row["auto"]["same_round"]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {row['auto']['all'] / best_all:.2f}x, "
                     f"{row['auto']['steady'] / best_steady:.2f}x | "
                     + ", ".join(f"{r:.2f}x" for r in rs["all"]) + "; "
                     + ", ".join(f"{r:.2f}x" for r in rs["steady"]) + " | "
                     f"{row['2 threads']['all_over_steady']:.2f}, "
                     f"{row['auto']['all_over_steady']:.2f} | {chose} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Pack once, run every workload and setting, print JSON and the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--only", default="", help="the workloads whose name holds this text")
    p.add_argument("--check", action="store_true",
                   help="contenders 2 threads, auto and auto without its later check")
    a = p.parse_args(argv)
    results = run(Path(a.root), a.images, a.repeats, a.epochs, a.batch_size, a.only,
                  CHECK if a.check else SETTINGS)
    print(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
