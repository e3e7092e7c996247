"""``python -m benchmarks.gpu_step``."""
import sys

from benchmarks.gpu_step.main import main

sys.exit(main())
