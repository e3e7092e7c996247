#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Kernel tests run Triton on the CPU
# (TRITON_INTERPRET=1); no GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -X faulthandler -m pytest -q "$@"  # -X: a crash even after the last test prints the stacks
