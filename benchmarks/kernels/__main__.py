"""``python -m benchmarks.kernels``."""
import sys

from benchmarks.kernels.main import main

sys.exit(main())
