"""FFCV in its own idiom: its JPEG decoder with fused RandomResizedCrop (OpenCV resize, not
PIL), RandomHorizontalFlip, ToTensor, ToTorchImage; raw: a numba RandomCrop(224) op (FFCV has
none) on the stored 256x256 pixels. Its workers are threads. Not the PIL work of the others:
the table says so.
"""
from __future__ import annotations

import os


def _random_crop_op(size: int):
    import numpy as np
    from dataclasses import replace
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class RandomCrop(Operation):
        """Uniformly placed size x size crop of HWC uint8 images."""

        def generate_code(self):
            my_range = Compiler.get_iterator()

            def crop(images, dst):
                n, h, w = images.shape[0], images.shape[1], images.shape[2]
                tops = np.random.randint(0, h - size + 1, n)
                lefts = np.random.randint(0, w - size + 1, n)
                for i in my_range(n):
                    dst[i] = images[i, tops[i]:tops[i] + size, lefts[i]:lefts[i] + size]
                return dst

            crop.is_parallel = True
            return crop

        def declare_state_and_memory(self, previous_state):
            shape = (size, size, previous_state.shape[2])
            return (replace(previous_state, shape=shape, jit_mode=True),
                    AllocationQuery(shape, previous_state.dtype))

    return RandomCrop()


def ffcv(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """ffcv.loader.Loader(order=RANDOM, os_cache=True, num_workers=threads)."""
    from ffcv.fields.decoders import (IntDecoder, RandomResizedCropRGBImageDecoder,
                                      SimpleRGBImageDecoder)
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    if mode == "jpeg":
        image = [RandomResizedCropRGBImageDecoder((224, 224))]
    else:
        image = [SimpleRGBImageDecoder(), _random_crop_op(224)]
    image += [RandomHorizontalFlip(), ToTensor(), ToTorchImage(channels_last=False)]
    loader = Loader(os.path.join(store, "data.beton"), batch_size=batch_size,
                    num_workers=max(1, workers), order=OrderOption.RANDOM, os_cache=True,
                    seed=seed, drop_last=False,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return lambda epoch: iter(loader)
