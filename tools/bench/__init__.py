"""``dlpack bench``: the contests of contenders; every contender in one registry (``families``).

``dlpack bench SRC --section convert,loader,remote`` (:func:`runner.run_bench`) runs the
sections that compare contenders on SRC's JPEGs:

- convert: ``stores`` (one folder converted into every contender's format, timed);
- loader: ``contenders_*`` (one module per family of loaders), ``work`` (the per-sample work
  every contender does), ``sources``, ``plan`` (groups of specs), ``child`` / ``procs`` (one
  contender per process, JSON-lines pipe), ``memory`` / ``load`` (peak memory, foreign CPU),
  ``limits`` (everything that is not a contender: decode, memcpy, gather, decode breakdown,
  first batch);
- remote: ``remote`` (SeaweedFS + ``latencyproxy``, first epoch from S3), ``contenders_remote``,
  ``remote_report``;

then ``report`` / ``charts`` write bench.json, bench.md and PNGs. This package holds exactly
what ``dlpack bench`` runs, and the command imports it only when it runs (tools/cli_bench.py).
The benchmarks with their own command are not part of the product: they live in the
repository's ``benchmarks/`` folder (``python -m benchmarks.<name>`` from the repository
root; not in the wheel): ``remote_clients`` (which S3 client), ``convert_ray`` (the Ray
engine against the local one), ``kernels`` (the Triton kernels on a GPU), ``gpu_step``
(exposed data time per training step), ``fidelity`` (read-time cost of original JPEG bytes;
photo-like data), ``cost_of_checks`` (cost of the untrusted-input checks),
``larger_than_ram`` (global vs block shuffle under a page cache smaller than the data).
Their contenders are still named in ``families`` (the one registry). ``seaweed`` and
``latencyproxy`` also serve the tests and ``benchmarks.remote_clients``.
"""
