"""``python -m benchmarks.larger_than_ram``."""
from benchmarks.larger_than_ram.main import main

main()
