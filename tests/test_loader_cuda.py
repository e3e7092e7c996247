"""The CUDA path (pinned slots, side-stream copies, Triton kernels) against the CPU path.

Skipped without a GPU; the same logic runs on the CPU in test_loader.py through
``device_transforms=True`` (torch references of the kernels).
"""
import numpy as np
import pytest
import torch

from dlpack_io.reader import (Dataset, Loader, Normalize, RandomCrop, RandomHorizontalFlip,
                              RandomResizedCrop, RandomVerticalFlip)

from helpers import pack_jpeg_and_raw

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("cuda"), 50, 5, seed=4,
                             shard_size="80KB")


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("crop", [RandomResizedCrop(24), RandomCrop(30)])
@pytest.mark.parametrize("name", ["jpeg", "raw"])
def test_cuda_matches_cpu(packed, name, crop, kind):
    ds = Dataset(packed[name])
    kw = dict(batch_size=8, transforms=[crop, RandomHorizontalFlip(), RandomVerticalFlip()],
              seed=1, drop_last=False, return_index=True, num_workers=2, reduced_decode=False)
    cpu = [(x.clone(), y, i) for x, y, i in Loader(ds, **kw)]
    gpu = [(x.cpu(), y.cpu(), i) for x, y, i in Loader(ds, device="cuda", worker_kind=kind, **kw)]
    assert len(cpu) == len(gpu)
    for (a, y1, i1), (b, y2, i2) in zip(cpu, gpu):
        assert np.array_equal(i1, i2) and torch.equal(y1, y2)
        assert (a.int() - b.int()).abs().max() <= (1 if isinstance(crop, RandomResizedCrop) else 0)


def test_cuda_float16_normalised(packed):
    ds = Dataset(packed["raw"])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    u8 = [x.clone() for x, _ in Loader(ds, batch_size=8, transforms=[RandomCrop(32)], num_workers=2)]
    fl = [x for x, _ in Loader(ds, batch_size=8, transforms=[RandomCrop(32), Normalize(mean, std)],
                               num_workers=2,
                               device="cuda", dtype=torch.float16)]
    for a, b in zip(u8, fl):
        assert b.is_cuda and b.dtype == torch.float16
        ref = (a.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        assert torch.allclose(b.float().cpu(), ref, atol=1e-2)
