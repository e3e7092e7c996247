#!/usr/bin/env bash
# The main job end to end on a generated demo data set (about 30 s once set up; on a fresh
# machine scripts/setup.sh first takes a few minutes, naming each step as it starts it):
# make 600 ImageNet-like JPEGs, convert them, inspect, draw a contact sheet, verify,
# then read one epoch and print the throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
OUT=${DEMO_DIR:-demo-data}
set -x
python -m dlpack_io.tools.synth "$OUT/jpegs" --count 600 --classes 10
dlpack convert "$OUT/jpegs" "$OUT/packed" --shard-size 16MB --overwrite
dlpack inspect "$OUT/packed"
dlpack inspect "$OUT/packed" --grid "$OUT/contact-sheet.png"
dlpack verify "$OUT/packed"
python -m dlpack_io.tools.demo "$OUT/packed"
