"""Every benchmark of dlpack, in one package; every contender in one registry (``families``).

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

then ``report`` / ``charts`` write bench.json, bench.md and PNGs. Benchmarks with their own
command (``python -m dlpack_io.tools.bench.<name>``): ``remote_clients`` (which S3 client),
``convert_ray`` (+ ``rayhost``: the Ray engine against the local one), ``kernels`` (+
``kernels_cases``: the Triton kernels on a GPU), ``fidelity`` (read-time cost of original
JPEG bytes; photo-like data), ``cost_of_checks`` (cost of the untrusted-input checks),
``larger_than_ram`` (global vs block shuffle under a page cache smaller than the data).
``seaweed`` and ``latencyproxy`` also serve the tests.
"""
