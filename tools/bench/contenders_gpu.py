"""End-to-end to the GPU (only when CUDA is present): images/s delivered as normalized fp16
NCHW on the device. DataLoader over files + pinned .cuda(non_blocking) + torch ops, against
ours with device="cuda" (its Triton kernels do crop/flip/normalize on the device)."""
from __future__ import annotations

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class _ToDevice:
    """Wrap a CPU uint8 loader: pinned copy, then float/normalize/fp16 with torch ops."""

    def __init__(self, inner):
        import torch

        self.inner = inner
        self.mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255

    def __call__(self, epoch: int):
        import torch

        for images, labels in self.inner(epoch):
            x = images.pin_memory().cuda(non_blocking=True)
            x = ((x.float() - self.mean) / self.std).half()
            yield x, labels.cuda(non_blocking=True)
        torch.cuda.synchronize()


def dataloader_cuda(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """torch DataLoader (PIL work, uint8) + .cuda() + torch normalize."""
    from dlpack_io.tools.bench.contenders_torch import dataloader_files

    return _ToDevice(dataloader_files(store, mode, batch_size, workers, seed))


def ours_cuda(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """Ours with device='cuda', fp16, normalized on the device."""
    import torch

    from dlpack_io.reader import (Dataset, Loader, Normalize, RandomCrop, RandomHorizontalFlip,
                                  RandomResizedCrop)

    crop = RandomResizedCrop(224) if mode == "jpeg" else RandomCrop(224)
    loader = Loader(Dataset(store), batch_size=batch_size, shuffle="global", seed=seed,
                    num_workers=workers, drop_last=False, dtype=torch.float16, device="cuda",
                    transforms=[crop, RandomHorizontalFlip(), Normalize(MEAN, STD)])

    def epoch(n: int):
        loader.set_epoch(n)
        yield from loader
        torch.cuda.synchronize()
    return epoch
