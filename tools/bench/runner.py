"""Run ``dlpack bench``: convert, measure the limits, run the load groups, write the report."""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import time

from dlpack_io.tools.bench import families as fam
from dlpack_io.tools.bench import plan
from dlpack_io.tools.bench.load import ForeignLoad
from dlpack_io.tools.bench.procs import Child, ChildError
from dlpack_io.tools.pagecache import warm

log = logging.getLogger(__name__)


def _convert_one(src, out, store, mode, raw_npy, logs) -> dict:
    dst = os.path.join(out, "stores", f"{store}-{mode}")
    shutil.rmtree(dst, ignore_errors=True)
    cmd = {"op": "convert", "store": store, "mode": mode, "src": src, "out": dst,
           "raw_npy": raw_npy}
    child = Child(cmd, os.path.join(logs, f"convert-{store}-{mode}.log"))
    warm(*([src, os.path.dirname(raw_npy)] if raw_npy and mode == "raw" else [src]))
    try:
        reply = child.start(timeout=1800)
        child.wait_exit(grace=30.0)  # let multiprocessing's resource tracker clean up
    finally:
        child.kill()
    return reply


def _convert_row(store: str, mode: str) -> dict:
    family = fam.BY_SECTION["convert"][store]
    reads = family.reads[mode]
    return {"store": store, "writer": family.label, "mode": mode, "seconds": [],
            "input": "JPEG files" if reads == "src" else f"the {reads} store's 256x256 arrays"}


def convert_all(src, out, pairs, peers, repeats: int) -> dict:
    """Convert into every store of ``pairs``, ``repeats`` interleaved rounds: key -> row."""
    from dlpack_io.tools.synth import folder_bytes

    logs = os.path.join(out, "logs")
    raw_npy = os.path.join(out, "stores", "numpy-raw", "raw.npy")
    jpeg_bytes, rows = folder_bytes(src), {}
    for _ in range(repeats):
        for store, mode in pairs:
            key = f"{store}-{mode}"
            row = rows.setdefault(key, _convert_row(store, mode))
            need = fam.BY_SECTION["convert"][store].needs
            if need and not peers.get(need, {}).get("ok"):
                row["error"] = peers.get(need, {}).get("reason", "not installed")
            if "error" in row:
                continue
            try:
                reply = _convert_one(src, out, store, mode, raw_npy, logs)
            except ChildError as exc:
                row["error"] = str(exc)
                continue
            row["seconds"].append(reply["seconds"])
            row["images"] = reply["images"]
            row["bytes_in"] = jpeg_bytes if row["input"] == "JPEG files" \
                else reply["images"] * 256 * 256 * 3
            row["warm"] = reply.get("warm") or [os.path.join(out, "stores", key)]
            log.info("convert %s: %.2f s", key, reply["seconds"])
    for row in rows.values():
        if row["seconds"]:
            med = statistics.median(row["seconds"])
            row.update(median_s=med, images_per_s=row["images"] / med,
                       mb_per_s=row["bytes_in"] / 1e6 / med)
    return rows


def _start(spec, stores, peers, out, timeout):
    family = fam.BY_SECTION["loader"][spec.family]
    if family.needs and not peers.get(family.needs, {}).get("ok"):
        raise ChildError(peers.get(family.needs, {}).get("reason", "not installed"))
    store = stores.get(spec.store, {})
    if "warm" not in store:
        raise ChildError(f"no {spec.store} store: {store.get('error', 'not converted')}")
    cmd = {"op": "load", "family": spec.family, "store": os.path.join(out, "stores", spec.store),
           "mode": spec.mode, "workers": spec.workers, "batch_size": spec.batch_size, "seed": 0,
           "dtype": "torch.uint8" if family.device == "cpu" else "torch.float16"}
    child = Child(cmd, os.path.join(out, "logs", spec.name.replace(" ", "_") + ".log"))
    try:
        child.start(timeout)
    except ChildError:
        child.kill()
        raise
    return child


def _epoch(child, row, r: int, warm_paths, timeout: float) -> bool:
    """One epoch of one contender (warm cache first); False when the contender failed."""
    warm(*warm_paths)
    foreign = ForeignLoad(child.proc.pid)
    try:
        reply = child.ask(f"epoch {r}", timeout, track=True)
    except ChildError as exc:
        row["error"] = f"epoch {r}: {exc}"
        child.kill()
        return False
    row["images"] = reply["images"]
    if r > 0:
        row["seconds"].append(reply["seconds"])
        row.setdefault("foreign_cores", []).append(round(foreign.stop(reply["seconds"]), 2))
        row.setdefault("cpu_s", []).append(round(foreign.own_s, 3))  # the contender's tree
    return True


def run_group(group, stores, peers, out, epochs: int, timeout: float) -> list:
    """Run one group's specs interleaved: 1 warm-up + ``epochs`` timed epochs each."""
    rows, children = [], {}
    for spec in group["specs"]:
        row = {"name": spec.name, "family": spec.family, "mode": spec.mode,
               "workers": spec.workers, "batch_size": spec.batch_size, "seconds": []}
        rows.append(row)
        try:
            children[spec.name] = (_start(spec, stores, peers, out, timeout), spec, row)
        except ChildError as exc:
            row["error"] = str(exc)
    for r in range(1 + epochs):
        names = list(children)
        shift = r % max(1, len(names))
        for name in names[shift:] + names[:shift]:  # rotate who goes first each round
            child, spec, row = children[name]
            if not _epoch(child, row, r, stores[spec.store]["warm"], timeout):
                del children[name]
    for child, _, row in children.values():
        row.update(child.quit(), memory=child.memory.peak)
    return _summarise(rows)


def _summarise(rows) -> list:
    base = next((r for r in rows if r["family"] == "serial" and r["seconds"]), None)
    for row in rows:
        if row["seconds"]:
            row["median_s"] = statistics.median(row["seconds"])
            row["images_per_s"] = row["images"] / row["median_s"]
            row["spread"] = (max(row["seconds"]) - min(row["seconds"])) / row["median_s"]
            row["best_images_per_s"] = row["images"] / min(row["seconds"])
            if row.get("cpu_s") and row["images"]:
                row["cpu_ms_per_image"] = 1000 * statistics.median(row["cpu_s"]) / row["images"]
            if base:
                row["speedup"] = row["images_per_s"] / base["images_per_s"]
    return rows


def run_bench(src, out, *, sections=("convert", "loader"), quick=False, workers=(1, 2),
              batch_sizes=(10, 50, 100, 300, 500, 1000), only=None, epochs=None, rounds=None,
              modes=("jpeg", "raw"), rtts=(0, 10, 20, 50)) -> dict:
    """The sections asked for; returns the result dict and writes JSON, markdown and PNGs to out.

    ``rounds``: interleaved rounds of the convert (default 3, 1 with ``quick``) and remote
    (default 2, 1 with ``quick``) sections; ``epochs``: timed epochs of each loader spec."""
    from dlpack_io.tools.bench import environment, prepare, report
    from dlpack_io.tools.bench.peers import PACKAGES, peer_status

    started = time.time()
    unknown = [s for s in sections if s not in fam.BENCH_SECTIONS]
    if unknown or not sections:
        raise ValueError(f"--section: unknown section(s) {unknown or list(sections)}; "
                         f"known: {', '.join(fam.BENCH_SECTIONS)}")
    fam.check_only(only, sections)
    if "remote" in sections:  # before hours of other sections: say now what is missing
        from dlpack_io.tools.bench.remote import check_ready

        check_ready()
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    src = plan.subset_folder(src, out, plan.QUICK_IMAGES) if quick else src
    src, changed = prepare.bench_source(src, out)  # PNG, EXIF, CMYK...: upright RGB JPEGs
    result = {"options": {"src": os.path.abspath(src), "source_changes": changed,
                          "quick": quick, "workers": list(workers),
                          "batch_sizes": list(batch_sizes), "only": only, "modes": list(modes),
                          "sections": list(sections), "rounds": rounds, "rtts": list(rtts)},
              "environment": environment.describe(), "families": {}, "convert": {},
              "groups": []}
    result["peers"] = {name: peer_status(name) for name in PACKAGES}
    if "convert" in sections or "loader" in sections:
        _local(result, src, out, sections, epochs, rounds)
    if "remote" in sections:
        from dlpack_io.tools.bench import remote

        result["remote"] = remote.run_section(
            src, os.path.join(out, "remote"), rtts=list(rtts),
            rounds=rounds or (1 if quick else 2), only=only, peers=result["peers"])
    result["environment"]["load_after"] = os.getloadavg()
    result["seconds"] = time.time() - started
    report.write_all(result, out)
    return result


def _local(result, src, out, sections, epochs, rounds) -> None:
    """The convert and loader sections (they share the stores) into ``result``."""
    from dlpack_io.tools.bench import environment

    opts, quick = result["options"], result["options"]["quick"]
    loaders = []
    if "loader" in sections:
        loaders = fam.select("loader", opts["only"], gpu=not environment.gpu().startswith("none"))
        if loaders and all(f.name != "serial" for f in loaders):
            loaders.insert(0, fam.BY_SECTION["loader"]["serial"])  # every group's baseline
    converts = []
    if "convert" in sections:
        converts = plan.convert_families(fam.select("convert", opts["only"]), quick)
    result["families"] = {f.name: {"label": f.label, "same_work": f.same_work} for f in loaders}
    pairs = plan.stores_needed(converts, loaders, opts["modes"])
    repeats = (rounds or (1 if quick else 3)) if converts else 1
    result["convert"] = convert_all(src, out, pairs, result["peers"], repeats)
    if not loaders:
        return
    result["limits"] = _limits(src, out, result["convert"], quick)
    epochs = epochs or (3 if quick else 5)
    workers, modes = opts["workers"], opts["modes"]
    groups = plan.main_groups(loaders, modes, workers) + \
        plan.batch_groups(loaders, modes, workers, opts["batch_sizes"], quick)
    for i, group in enumerate(groups):
        log.info("group %d/%d: %s", i + 1, len(groups), {k: v for k, v in group.items() if k != "specs"})
        group["rows"] = run_group(group, result["convert"], result["peers"], out, epochs,
                                  300 if quick else 900)
        group["specs"] = [s.name for s in group["specs"]]
    result["groups"] = groups


def _limits(src, out, stores, quick) -> dict:
    from dlpack_io.packer.scan import scan_image_folder
    from dlpack_io.tools.bench import limits

    inputs = scan_image_folder(src)
    paths = [os.path.join(inputs.root, p) for p in inputs.paths]
    made = {key: os.path.join(out, "stores", key) for key, row in stores.items() if "warm" in row}
    return limits.measure(paths, made, quick)
