"""``python -m benchmarks.convert_ray``."""
from benchmarks.convert_ray.main import main

main()
