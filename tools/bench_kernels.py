"""``python -m dlpack_io.tools.bench_kernels``: the GPU checklist's name of tools/bench/kernels.py."""
import sys

from dlpack_io.tools.bench.kernels import main

if __name__ == "__main__":
    sys.exit(main())
