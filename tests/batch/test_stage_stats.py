"""loader.stats() per stage: the workers' seconds in each stage add up to what the test
itself put there (a sample_transform that sleeps a known time), for threads and processes,
on the host path and the device path; the CUDA timeline on a GPU (gpu marker)."""
from __future__ import annotations

import os
import time

import pytest
import torch

from dlpack_io.reader import Dataset, Loader, Normalize, RandomResizedCrop, Workers
from dlpack_io.reader.batch.build import stage_table as new
from dlpack_io.reader.batch.build import stage_totals as totals
from dlpack_io.reader.batch.stats import STAGES

from helpers import pack_jpeg_and_raw

PAUSE = 0.004  # seconds the sample_transform sleeps per image
# What the sleeps took, as the transform measured: one line per call appended to the file
# named by this variable (O_APPEND: whole lines from any process). Not multiprocessing.Value:
# its shared-memory arena would stay mapped in the test process for the whole session.
SLEPT_FILE = "DLPACK_TEST_SLEPT_FILE"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("stages"), 24, 3, seed=3, shard_size="60KB")


def pausing(image):
    """A sample_transform of known cost (module level: worker processes run it too and
    append what they slept to the same file)."""
    t0 = time.perf_counter()
    time.sleep(PAUSE)
    line = f"{time.perf_counter() - t0!r}\n".encode()
    fd = os.open(os.environ[SLEPT_FILE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return image


def slept(path) -> float:
    """Seconds the transform measured, summed over every call."""
    return sum(float(x) for x in path.read_text().split()) if path.exists() else 0.0


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_each_stage_holds_its_own_seconds(packed, kind, tmp_path, monkeypatch):
    monkeypatch.setenv(SLEPT_FILE, str(tmp_path / "slept"))
    loader = Loader(Dataset(packed["jpeg"]), batch_size=8, num_workers=2,
                    workers=Workers(kind=kind), sample_transform=pausing, seed=2,
                    transforms=[RandomResizedCrop(16), Normalize((0.5,) * 3, (0.25,) * 3)])
    t0 = time.perf_counter()
    assert sum(len(x) for x, _ in loader) == 24
    wall = time.perf_counter() - t0
    s = loader.stats()
    # the sleeps are the user's stage, and only there (what the transform measured, plus
    # a call's slack per image); decoding, planning, the normalise took time of their own
    measured = slept(tmp_path / "slept")
    assert measured >= 24 * PAUSE
    assert s.user_s == pytest.approx(measured, abs=24 * 0.0005)
    assert s.decode_s > 0 and s.plan_s > 0 and s.transforms_s > 0
    assert s.decode_s < s.user_s  # 24 tiny JPEGs decode in far less than 96 ms
    # worker seconds cannot exceed the workers' wall time
    assert s.plan_s + s.decode_s + s.user_s + s.transforms_s <= 2 * wall
    assert (s.fetch_wait_s, s.fetched_bytes, s.gpu_wait_s, s.gpu_step_s) == (0, 0, 0, 0)
    d = s.as_dict()
    assert {f"{name}_s" for name in STAGES} <= set(d) and d["run"]["user_s"] == s.user_s
    loader.close()


def test_the_device_path_counts_the_gather_as_decoding(packed, triton_interpret):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=1, seed=2,
                    transforms=[RandomResizedCrop(16)], workers=Workers(device_transforms=True))
    assert sum(len(x) for x, _ in loader) == 24
    s = loader.stats()
    assert s.decode_s > 0 and s.plan_s > 0 and (s.user_s, s.transforms_s) == (0, 0)
    assert s.finish_s > 0  # the kernels ran in the consumer (here: their CPU twin)
    loader.close()


def test_stage_tables_sum_per_stage():
    table = new(3)
    table[:, 1] = (0.5, 0.25, 0.25)
    table[2, 3] = 2.0
    assert totals(table).tolist() == [0.0, 1.0, 0.0, 2.0]
    assert totals(None) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (docs/gpu.md)")
def test_on_a_gpu_the_step_and_the_wait_are_the_gpus(packed):
    # a step that keeps the GPU busy for a known time while the host returns at once:
    # the host clock sees no step at all, the CUDA events see all of it
    spin = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spin[0].record()
    torch.cuda._sleep(20_000_000)
    spin[1].record()
    torch.cuda.synchronize()
    step = spin[0].elapsed_time(spin[1]) / 1000
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=2, seed=2,
                    transforms=[RandomResizedCrop(16)], device="cuda")
    batches = 0
    for x, _ in loader:
        torch.cuda._sleep(20_000_000)
        batches += 1
    s = loader.stats()
    assert batches == 3
    assert s.gpu_step_s == pytest.approx(batches * step, rel=0.25)
    assert s.wait_fraction == pytest.approx(s.gpu_wait_s / (s.gpu_wait_s + s.gpu_step_s))
    assert s.step_s < s.gpu_step_s  # the host's clock alone would have missed the step
    loader.close()


def test_the_verdict_names_where_the_worker_time_goes():
    from dlpack_io.reader import LoaderStats

    bound = LoaderStats(wall_s=10, wait_s=3.4, step_s=6.6, cpu_s=19.6, num_workers=2,
                        images=1000, batches=4, plan_s=1.0, decode_s=14.0, user_s=0.0,
                        transforms_s=5.0)
    assert bound.verdict() == ("data-bound: 34.0% of step time spent waiting for data; "
                               "workers busy 98%: decoding takes 70% of the workers' time: "
                               "more cores, smaller stored images (convert --max-side) or raw "
                               "records (--mode raw) would help; worker time: plan 5%, "
                               "decode 70%, transforms 25%")
    assert bound.as_dict()["stage_shares"] == {"plan": 0.05, "decode": 0.7, "transforms": 0.25}
    # on a GPU the GPU's own timeline decides: the host waited 34%, the GPU only 2%
    gpu = LoaderStats(wall_s=10, wait_s=3.4, step_s=6.6, gpu_wait_s=0.2, gpu_step_s=9.8,
                      batches=4)
    assert gpu.wait_fraction == pytest.approx(0.02)
    assert gpu.verdict() == "not data-bound: 2.0% of step time spent waiting for data"


def test_fetched_bytes_reads_a_handle_or_a_mixtures_handles():
    from dlpack_io.reader.batch.stats import fetched_bytes

    assert fetched_bytes({"bytes_fetched": 700, "requests": 3}) == 700
    assert fetched_bytes([{"bytes_fetched": 700}, {"bytes_fetched": 50}]) == 750
    assert fetched_bytes(None) == 0 and fetched_bytes([]) == 0
