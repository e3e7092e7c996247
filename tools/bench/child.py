"""One contender (or one conversion) in its own process, driven over a JSON-lines pipe.

    python -m dlpack_io.tools.bench.child

First line in: {"op": "convert", ...} (reply: timing, then exit), {"op": "remote", ...} (one
cold first epoch from object storage, see remote.run_one; reply, then exit) or {"op": "load",
...} (reply: {"ready": true} or {"error": ...}); then "epoch N" lines (reply: seconds, images)
and "quit" (reply: ru_maxrss of itself and of its reaped children). Every builder comes from
the registry (families.py). Anything a library prints goes to stderr: the protocol owns the
original stdout.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback


def _reply(proto, obj) -> None:
    proto.write(json.dumps(obj) + "\n")
    proto.flush()


def convert(cmd: dict) -> dict:
    """Run one store writer, timed; its inputs are the scanned source folder."""
    from dlpack_io.packer.scan import scan_image_folder
    from dlpack_io.tools.bench.families import BY_SECTION, build, resolve

    inputs = scan_image_folder(cmd["src"])
    family = BY_SECTION["convert"][cmd["store"]]
    resolve(family)  # import the writer's module before the clock starts
    os.makedirs(cmd["out"], exist_ok=True)
    start = time.perf_counter()
    extra = build(family, inputs, cmd["out"], cmd["mode"], cmd.get("raw_npy"))
    return {"seconds": time.perf_counter() - start, "images": len(inputs.paths), **extra}


def epoch(loader, n: int, dtype: str = "torch.uint8") -> dict:
    """Iterate one epoch; check every batch is NCHW 224x224 of ``dtype``."""
    images = batches = 0
    start = time.perf_counter()
    for batch in loader(n):
        x = batch[0]
        if tuple(x.shape[1:]) != (3, 224, 224) or str(x.dtype) != dtype:
            raise RuntimeError(f"bad batch: shape {tuple(x.shape)} dtype {x.dtype}")
        images += x.shape[0]
        batches += 1
    return {"seconds": time.perf_counter() - start, "images": images, "batches": batches}


def serve(cmd: dict, proto) -> None:
    """Build the loader, then answer epoch / quit lines."""
    from dlpack_io.tools.bench.families import BY_SECTION, build

    try:
        loader = build(BY_SECTION["loader"][cmd["family"]], cmd["store"], cmd["mode"],
                       cmd["batch_size"], cmd["workers"], cmd.get("seed", 0))
    except Exception as exc:
        traceback.print_exc()
        return _reply(proto, {"error": f"{type(exc).__name__}: {exc}"})
    _reply(proto, {"ready": True})
    for line in sys.stdin:
        if line.startswith("epoch"):
            try:
                _reply(proto, epoch(loader, int(line.split()[1]), cmd.get("dtype", "torch.uint8")))
            except Exception as exc:
                traceback.print_exc()
                _reply(proto, {"error": f"{type(exc).__name__}: {exc}"})
        else:
            break
    close = getattr(loader, "close", None)
    if close:
        close()
    _reply(proto, {"maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss})


def _remote(cmd: dict) -> dict:
    from dlpack_io.tools.bench.remote import run_one

    return run_one(cmd["family"], cmd["endpoint"], cmd["out"], cmd.get("rank", 0),
                   cmd.get("world_size", 1))


def main() -> None:
    """Entry point: protocol on the original stdout, everything else to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cmd = json.loads(sys.stdin.readline())
    if cmd["op"] in ("convert", "remote"):
        try:
            _reply(proto, convert(cmd) if cmd["op"] == "convert" else _remote(cmd))
        except Exception as exc:
            traceback.print_exc()
            _reply(proto, {"error": f"{type(exc).__name__}: {exc}"})
    else:
        serve(cmd, proto)
    proto.flush()
    # a normal exit: atexit handlers and multiprocessing's resource tracker unlink what the
    # loader created (named semaphores, shared memory); the parent kills us if this hangs


if __name__ == "__main__":
    main()
