"""benchmarks/kernels runs end to end (tiny, CPU, Triton interpreter) and fails clearly
without a GPU, so the one-command H100 run in a later session does not trip on its logic;
its model of the JPEG loader's batch (regions decoded at reduced scale) is checked here, and
the GPU checklist's command (``python -m benchmarks.kernels``, from the repository root)
runs it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.kernels import cases as kernels_cases
from benchmarks.kernels import main as bench_kernels

ROOT = Path(__file__).resolve().parents[2]  # the repository root: where benchmarks/ is found


def test_cpu_smoke_writes_table_and_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after the test
    out = tmp_path / "kernels.json"
    assert bench_kernels.main(["--cpu-smoke", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert "| crop_flip_permute | float16 | triton |" in printed.out
    assert "| resized_crop | float16 | triton antialias jitter(b,c,s,h) |" in printed.out
    assert "correctness vs torch reference: OK" in printed.err
    report = json.loads(out.read_text())
    assert report["cpu_smoke"] is True and report["correctness_problems"] == []
    assert {"device", "torch", "triton", "rows", "targets", "jpeg_case"} <= set(report)
    variants = {(r["op"], r["dtype"], r["variant"]) for r in report["rows"]}
    for dtype in ("uint8", "float16", "float32"):
        assert ("crop_flip_permute", dtype, "triton") in variants
        assert ("crop_flip_permute", dtype, "eager gather") in variants
        assert ("resized_crop", dtype, "triton antialias") in variants
        assert ("resized_crop", dtype, "eager per-box interpolate") in variants
    assert ("end_to_end", "float16", "h2d copy + kernel, serial") in variants
    assert all(r["us"] > 0 and r["GBps"] > 0 for r in report["rows"])
    # bytes moved by the loader case: box pixels + records + output, counted from the slot
    jpeg = report["jpeg_case"]
    row = next(r for r in report["rows"] if r["variant"] == "triton antialias"
               and r["dtype"] == "float16")
    assert row["bytes"] == jpeg["box_bytes"] + jpeg["n"] * 64 + jpeg["n"] * 3 * 12 * 12 * 2
    jit = next(r for r in report["rows"] if r["variant"] == "triton antialias jitter(b,c,s)")
    assert jit["bytes"] == row["bytes"] + jpeg["box_bytes"]  # + the contrast-mean pass


def test_loader_case_regions_are_one_to_two_times_the_output():
    """Boxes at least the output size are decoded at the smallest n/8 that keeps them >= the
    output: the stored box is then 1-2x the output along its tighter side."""
    g = torch.Generator().manual_seed(0)
    ratios, upscaled = [], 0
    for _ in range(400):
        h, w = int(torch.randint(333, 501, (1,), generator=g)), 500
        box = kernels_cases.rrc_box(g, h, w)
        rows, cols, (top, left, bh, bw) = kernels_cases.decoded_region(box, h, w, 224)
        assert 0 <= top and top + bh <= rows and 0 <= left and left + bw <= cols
        assert rows * cols >= bh * bw
        if min(box[2], box[3]) < 224:
            upscaled += 1
            continue
        ratios.append(min(bh, bw) / 224)
    assert ratios and upscaled
    assert min(ratios) >= 1 - 1 / 224 and max(ratios) < 2 + 1 / 224
    assert math.isclose(sum(r < 2 for r in ratios) / len(ratios), 1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_exits_with_a_clear_message(tmp_path, capsys):
    assert bench_kernels.main(["--json", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device found" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_checklist_command_runs_the_benchmark():
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "Benchmark the fused Triton kernels" in done.stdout and "--cpu-smoke" in done.stdout
