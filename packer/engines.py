"""Which engine packs: worker processes on this machine, or tasks on a Ray cluster."""
from __future__ import annotations

import contextlib

from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.packing import pack_local


ENGINES = ("local", "ray")


def engine_context(engine: str, ray_address, opts: PackOptions):
    """A context manager that yields the function packing the inputs: worker processes
    here (local) or tasks on a Ray cluster. Raises at once for a bad choice or missing Ray."""
    if engine == "local":
        if ray_address is not None:
            raise ValueError("--ray-address is for --engine ray (the local engine uses this "
                             "machine's cores)")
        return contextlib.nullcontext(pack_local)
    if engine == "ray":
        from dlpack_io.packer import ray_cluster  # loaded only for --engine ray

        return ray_cluster.connection(ray_address, opts)
    raise ValueError(f"engine {engine!r}: expected one of {ENGINES}")
