#!/usr/bin/env bash
# dlpack bench --quick (loader section) on two checkouts of this repository, one after the
# other, on the same JPEG folder: how docs/benchmarks.md "Loader before and after the
# re-cut" was measured. Compare each loader's ratio to the DataLoader of the same run.
#
#   scripts/bench_before_after.sh BEFORE_TREE AFTER_TREE SRC OUT
# Each tree needs its own .venv (bash scripts/setup.sh there). The "before" tree predates the
# bench package, so it gets the old options.
set -u
before=$1 after=$2 src=$3 out=$4
mkdir -p "$out"
( cd "$before" && . .venv/bin/activate && dlpack bench "$src" --quick \
    --only dataloader-files,ours-thread,ours-process --workers 2 --batch-sizes 256 \
    --out "$out/before" > "$out/before.md" )
( cd "$after" && . .venv/bin/activate && dlpack bench "$src" --quick --section loader \
    --only dataloader-files,ours-thread,ours-process,ours-plain --workers 2 --batch-sizes none \
    --out "$out/after" > "$out/after.md" )
