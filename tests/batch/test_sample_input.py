"""SampleTransform(fn, input="numpy" | "pil" | "tensor"): PIL and torchvision-style tensor
pipelines run unchanged in the workers, before the fused transforms."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from dlpack_io.reader import (Dataset, Loader, Normalize, Output, RandomCrop, SampleError,
                              SampleTransform, Workers)
from dlpack_io.reader.batch.plan import compile_spec

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("sampleio"), 16, 2, seed=6,
                             shard_size="60KB")


def pil_pipeline(img):
    """A torchvision v1-style PIL pipeline: it only knows PIL images."""
    if not isinstance(img, Image.Image):
        raise TypeError(f"expected a PIL image, got {type(img)}")
    return ImageOps.mirror(img).transpose(Image.Transpose.ROTATE_90)


def tensor_pipeline(t):
    """A torchvision v2-style tensor pipeline: (C, H, W) uint8 in and out."""
    if not (isinstance(t, torch.Tensor) and t.shape[0] == 3 and t.dtype == torch.uint8):
        raise TypeError(f"expected a (3, H, W) uint8 tensor, got {type(t)}")
    return t[:, ::2, :].flip(-1)


def grey_tensor(t):
    return t[:1]  # torchvision's Grayscale(1) keeps one channel


def to_float(t):
    return t.float() / 255  # ToDtype(float32, scale=True)


def np_reference(kind, pixels):
    if kind == "pil":
        return np.rot90(pixels[:, ::-1])
    if kind == "tensor":
        return pixels[::2, ::-1]
    return np.repeat(pixels[:, :, :1], 3, axis=2)


@pytest.mark.parametrize("kind,fn,worker_kind", [("pil", pil_pipeline, "thread"),
                                                 ("pil", pil_pipeline, "process"),
                                                 ("tensor", tensor_pipeline, "process"),
                                                 ("tensor", grey_tensor, "thread")])
def test_pipelines_run_unchanged_in_the_workers(packed, kind, fn, worker_kind):
    ds = Dataset(packed["raw"])
    loader = Loader(ds, batch_size=8, num_workers=2, workers=Workers(kind=worker_kind),
                    output=Output(return_index=True), seed=4,
                    sample_transform=SampleTransform(fn, input=kind),
                    transforms=[RandomCrop(16)])
    spec = compile_spec([RandomCrop(16)])
    seen = 0
    for images, _, idx in loader:
        for k, i in enumerate(idx):
            ref = np_reference(kind if fn is not grey_tensor else "grey", ds[int(i)][0])
            t, l, h, w = spec.draw(4, 0, [i], [ref.shape[0]], [ref.shape[1]]).boxes[0]
            assert np.array_equal(images[k].numpy(), ref[t:t + h, l:l + w].transpose(2, 0, 1))
            seen += 1
    assert seen == 16


def test_numpy_input_is_the_plain_array(packed):
    got = SampleTransform(lambda a: a[::2], input="numpy")(np.zeros((4, 6, 3), np.uint8))
    assert got.shape == (2, 6, 3) and got.flags.c_contiguous


def test_float_results_are_refused_with_the_fix(packed):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=0,
                    sample_transform=SampleTransform(to_float, input="tensor"),
                    transforms=[RandomCrop(16), Normalize()])
    with pytest.raises(SampleError, match=r"'to_float' returned torch.Tensor torch.float32 "
                                          r"\(3, 40, 40\).*transforms=\[\.\.\., Normalize"):
        next(iter(loader))


def test_arguments_checked():
    with pytest.raises(ValueError, match="input='cv2'; expected one of"):
        SampleTransform(pil_pipeline, input="cv2")
    with pytest.raises(TypeError, match="is not callable"):
        SampleTransform(3)
