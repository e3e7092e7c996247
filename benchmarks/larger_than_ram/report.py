"""The larger-than-RAM benchmark's section of docs/benchmarks.md: tables of the rounds
and the mixing figures, and the replacement of that section in a markdown file."""
from __future__ import annotations

from pathlib import Path

from benchmarks.larger_than_ram.cache import MB

SECTION = "## Data larger than RAM: global vs block"


def _rounds(values, fmt="{:.0f}") -> str:
    return "[" + ", ".join(fmt.format(v) for v in values) + "]"


def _row(label: str, cache: str, s: dict) -> str:
    cg = (f"{s['cg_majfault']:,.0f} | {s['cg_cache_peak'] / MB:,.0f} MB" if "cg_majfault" in s
          else " | ")
    tail = f"{_rounds(s['rates'])}; {_rounds(s['amplification'], '{:.2f}')}"
    return (f"| {label} | {cache} | {s['median_rates']:,.0f} | {s['median_read_gb']:.2f} | "
            f"{s['median_amplification']:.2f} | {cg} | {tail} |")


HOW = """Each epoch is a fresh process reading the whole data set once with the Loader (batch
256, 2 thread workers, uint8 CPU output; jpeg: `RandomResizedCrop(224)` + flip, raw:
`RandomCrop(224)` + flip), starting with none of it in the page cache. *page cache*: the
limit (cgroup: the process runs in a cgroup v1 memory cgroup whose limit is kept at its
anonymous memory + the cache allowed; fadvise: the shards' pages are dropped each time that
much more was read), or none (cold: nothing cached at the start; warm: everything cached).
*read / records' bytes*: read_bytes of /proc/self/io (the process and its threads) over the
bytes of the records the epoch delivered; 1.0 = every record read once (below 1 where an
epoch leaves bytes untouched: a raw 224 crop reads 224 of 256 rows). *major faults*, *cache peak*: the cgroup's memory.stat. The Loader maps shards
with the default advice, so a page-cache miss makes the kernel read `read_ahead_kb` around
the fault; in a random order those neighbours are evicted before they are used once the data
set is larger than the cache. A block-shuffle window reads `block_size x block_window x mean
record size` bytes (*window working set*); when that fits in the cache, what is read ahead
is used first. *global, MADV_RANDOM* is not a Loader option: global order with
madvise(MADV_RANDOM) on the shard mappings, so the kernel reads only the pages touched.
Mixing: `dlpack inspect DST --order` figures (distinct classes and shards per batch of 256,
against a uniformly random batch). The machine is shared with other agents' builds, tests
and benchmarks on its 2 cores: images/s move with their load (in the rounds column); read
volumes, and ratios within a round, hold better."""


def markdown(res: dict) -> str:
    """The docs/benchmarks.md section for the results of ``main.main``."""
    lines = [SECTION, "", f"Produced by `{res['command']}`.", "",
             f"Measured {res['date']} on {res['machine']}; page cache limited by "
             f"**{res['method']}** to {res['cache_mb']} MB. {res['context']}", "",
             f"Data: {res['data']}.", "", HOW, ""]
    for mode, m in res["modes"].items():
        show = m.get("labels", {})  # family name -> label (a saved run before: labels)
        lines += [f"### {mode} records: {m['num_samples']:,} samples, {m['data_bytes'] / MB:,.0f} "
                  f"MB ({m['data_bytes'] / (res['cache_mb'] * MB):.1f}x the cache), device "
                  f"read_ahead_kb {m['readahead_kb']}", "",
                  *(["Records: " + ", ".join(f"{k}: {v:,}" for k, v in m["packing"].items())
                     + ".", ""] if m.get("packing") else []),
                  "| shuffle | page cache | images/s (median) | GB read (median) | read / "
                  "records' bytes (median) | major faults | cache peak | rounds: images/s; "
                  "read / records' bytes |", "|---|---|---:|---:|---:|---:|---:|---|"]
        lines += [_row(show.get(name, name), f"no limit, {state}", s)
                  for name, ref in m["reference"].items() for state, s in ref.items()]
        lines += [_row(show.get(name, name), f"{res['cache_mb']} MB", s)
                  for name, s in m["limited"].items()]
        lines += ["", "| shuffle | images/s / global's, same round (median) | classes/batch "
                      "(perfect) | class mix | shards/batch (perfect) | shard mix | window "
                      "working set |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, s in m["limited"].items():
            q, label = m["quality"][name], show.get(name, name)
            block = q.get("shuffle", label.split()[0]) == "block"
            ws = f"{q['working_set'] / MB:,.0f} MB" if block else ""
            lines.append(f"| {label} | {s['vs_global']:.2f} | {q['classes_per_batch']:.1f} "
                         f"({q['perfect_classes_per_batch']:.1f}) | {q['class_mix']:.2f} | "
                         f"{q['shards_per_batch']:.1f} ({q['perfect_shards_per_batch']:.1f}) | "
                         f"{q['shard_mix']:.2f} | {ws} |")
        lines.append("")
    return "\n".join(lines)


def write_section(path, text: str) -> None:
    """Replace (or append) this benchmark's section of a markdown file."""
    p = Path(path)
    old = p.read_text() if p.exists() else "# Benchmarks\n"
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text.rstrip("\n") + "\n" + ("" if end < 0 else old[end:])
    p.write_text(new)
