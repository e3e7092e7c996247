"""``dlpack bench``: our loader against the loaders users would pick instead.

Modules: ``work`` (the per-sample work every contender does), ``stores`` (one folder of JPEGs
converted into every contender's format, timed: the Convert table), ``contenders_*`` (one
module per family of loaders), ``child`` (runs one contender in its own process), ``memory``
(peak memory of a process tree), ``limits`` (decode and memcpy ceilings), ``runner``
(orchestration: interleaved rounds, medians) and ``report`` (JSON, markdown, PNG charts).
Entry point: :func:`dlpack_io.tools.bench.runner.run_bench`, or ``dlpack bench SRC``.
"""
