#!/usr/bin/env bash
# What a user gets from a plain `pip install` of our wheel (run by .ci/run, ~2 min):
# build the wheel with `python -m build`, install it into a fresh venv with only its declared
# dependencies (torch from the local CPU build first, as the README says), then check that
#   * without a PIL provider `dlpack convert` stops at once with the one-line fix;
#   * with the [pillow] extra: convert + inspect + verify + one Loader epoch on demo data,
#     run from outside the repository so only the installed package is importable.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dlpack-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet() { "$@" 2>&1 | grep -vE "^WARNING: Location .* is ignored" || true; }
step() { echo "wheel_check: $*"; }

"$PY" -m venv "$WORK/build-env"
quiet "$WORK/build-env/bin/pip" install -q build
step "building the wheel"
"$WORK/build-env/bin/python" -m build --wheel --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log"; echo "wheel_check: python -m build failed" >&2; exit 1; }
WHEEL=$(ls "$WORK"/dist/dlpack_io-*.whl)
step "built $(basename "$WHEEL")"
# the product only: dlpack_io/ and its metadata; the standalone benchmarks (benchmarks/)
# stay in the repository
"$PY" - "$WHEEL" <<'PY' || exit 1
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
bad = [n for n in names if not n.startswith(("dlpack_io/", "dlpack_io-"))]
if bad:
    sys.exit(f"wheel_check: the wheel holds files outside the product: {bad[:10]}")
print(f"wheel_check: {len(names)} files, all under dlpack_io/")
PY

"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
quiet "$V/pip" install -q "numpy>=1.24"            # before torch: no "Failed to initialize NumPy"
quiet "$V/pip" install -q "torch==2.13.0"          # the local CPU build, never an unpinned torch
quiet "$V/pip" install -q "$WHEEL"
cd "$WORK"                                          # only the installed package is importable here
# demo JPEGs made by the repository's own set-up (synth needs PIL, absent here for now)
[ -x "$REPO/.venv/bin/python" ] || bash "$REPO/scripts/setup.sh" >/dev/null
"$REPO/.venv/bin/python" -m dlpack_io.tools.synth jpegs --count 200 --classes 4 >/dev/null 2>&1

step "no PIL provider: convert must stop before scanning, with the fix"
if "$V/dlpack" convert jpegs packed --quiet 2>"$WORK/err.txt"; then
  echo "wheel_check: convert succeeded without any PIL provider" >&2; exit 1
fi
grep -q "pip install 'dlpack-io\[pillow\]'" "$WORK/err.txt" \
  || { cat "$WORK/err.txt"; echo "wheel_check: no one-line PIL advice" >&2; exit 1; }
[ ! -e packed ] || { echo "wheel_check: the failed run left packed/ behind" >&2; exit 1; }
cat "$WORK/err.txt"

step "with the [pillow] extra"
quiet "$V/pip" install -q "$WHEEL[pillow,torch]"
"$V/dlpack" --version
"$V/dlpack" convert jpegs packed --shard-size 4MB --quiet
"$V/dlpack" inspect packed | head -12
"$V/dlpack" verify packed --quiet
"$V/dlpack" bench --help > "$WORK/bench-help.txt"   # what `dlpack bench` needs is in the wheel
grep -q "Benchmark on the JPEG folder SRC" "$WORK/bench-help.txt" \
  || { echo "wheel_check: dlpack bench --help failed from the wheel" >&2; exit 1; }
"$V/python" -m dlpack_io.tools.demo packed --batch-size 32 | tee "$WORK/epoch.txt"
grep -q "^epoch: 200 images" "$WORK/epoch.txt" \
  || { echo "wheel_check: the Loader epoch did not read all 200 images" >&2; exit 1; }
step "ok"
