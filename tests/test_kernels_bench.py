"""tools/bench_kernels.py runs end to end (tiny, CPU, Triton interpreter) and fails clearly
without a GPU, so the one-command H100 run in a later session does not trip on its logic."""

import json

import pytest
import torch

from dlpack_io.tools import bench_kernels


def test_cpu_smoke_writes_table_and_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after the test
    out = tmp_path / "kernels.json"
    assert bench_kernels.main(["--cpu-smoke", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert "| crop_flip_permute | float16 | triton |" in printed.out
    assert "correctness vs torch reference: OK" in printed.err
    report = json.loads(out.read_text())
    assert report["cpu_smoke"] is True and report["correctness_problems"] == []
    assert {"device", "torch", "triton", "rows", "targets"} <= set(report)
    variants = {(r["op"], r["dtype"], r["variant"]) for r in report["rows"]}
    for dtype in ("uint8", "float16", "float32"):
        assert ("crop_flip_permute", dtype, "triton") in variants
        assert ("crop_flip_permute", dtype, "eager gather") in variants
        assert ("resized_crop", dtype, "triton antialias") in variants
        assert ("resized_crop", dtype, "eager per-box interpolate") in variants
    assert all(r["us"] > 0 and r["GBps"] > 0 for r in report["rows"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_exits_with_a_clear_message(tmp_path, capsys):
    assert bench_kernels.main(["--json", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device found" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
