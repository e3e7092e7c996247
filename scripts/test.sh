#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Kernel tests run Triton on the CPU
# (TRITON_INTERPRET=1); no GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
