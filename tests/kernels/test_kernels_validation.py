"""Every input the kernels cannot handle raises a clear TypeError/ValueError before launch.

Each case starts from a valid call, breaks one argument, and checks the exception type and
that the message names the argument (and the offending value where it has one). The same
cases run against the launchers and against the torch references; the launchers' kernel
and fallback paths are patched to fail loudly, proving nothing was launched.
"""

import numpy as np
import pytest
import torch

from dlpack_io.kernels import crop_flip_permute, reference, resized_crop

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch):
    """Use the kernel path, and make any launch (or fallback) an immediate failure."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def launched(*args, **kwargs):
        raise AssertionError("launched despite invalid arguments")

    import dlpack_io.kernels.crop as crop
    import dlpack_io.kernels.resize as resize
    monkeypatch.setattr(crop, "_launch", launched)
    monkeypatch.setattr(resize, "_launch", launched)


def _crop_call(**over):
    kw = dict(images=torch.zeros((2, 6, 7, 3), dtype=torch.uint8), top=torch.tensor([0, 1]),
              left=torch.tensor([0, 2]), height=4, width=5, flip_h=torch.tensor([True, False]),
              flip_v=False, out_dtype=torch.float16, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))
    kw.update(over)
    return kw


CROP_CASES = {
    "images-not-tensor": (dict(images=np.zeros((2, 6, 7, 3), np.uint8)), TypeError,
                          r"images must be a torch.Tensor, got ndarray"),
    "images-float": (dict(images=torch.zeros((2, 6, 7, 3))), TypeError,
                     r"images must be uint8, got torch.float32"),
    "images-3d": (dict(images=torch.zeros((6, 7, 3), dtype=torch.uint8)), ValueError,
                  r"images must be a 4-D NHWC batch, got shape \(6, 7, 3\)"),
    "images-5-channels": (dict(images=torch.zeros((2, 6, 7, 5), dtype=torch.uint8)), ValueError,
                          r"images must have 1..4 channels.*\(2, 6, 7, 5\)"),
    "images-empty-height": (dict(images=torch.zeros((2, 0, 7, 3), dtype=torch.uint8)),
                            ValueError, r"images must have height and width >= 1, got shape \(2, 0, 7, 3\)"),
    "images-noncontiguous": (dict(images=torch.zeros((2, 3, 6, 7), dtype=torch.uint8)
                                  .permute(0, 2, 3, 1)), ValueError,
                             r"images must be contiguous NHWC.*\.contiguous\(\)"),
    "height-zero": (dict(height=0), ValueError, r"height must be >= 1, got 0"),
    "width-float": (dict(width=5.0), TypeError, r"width must be an int, got 5.0"),
    "height-bool": (dict(height=True), TypeError, r"height must be an int, got True"),
    "top-float": (dict(top=torch.tensor([0.0, 1.0])), TypeError,
                  r"top must have dtype in .*torch.int64.*got torch.float32"),
    "top-length": (dict(top=torch.tensor([0, 1, 2])), ValueError,
                   r"top must have shape \(2,\).*got \(3,\)"),
    "left-2d": (dict(left=torch.zeros((2, 1), dtype=torch.int64)), ValueError,
                r"left must have shape \(2,\)"),
    "top-device": (dict(top=torch.zeros(2, dtype=torch.int64, device=META)), ValueError,
                   r"top is on meta but images is on cpu"),
    "flip-int64": (dict(flip_h=torch.tensor([1, 0])), TypeError,
                   r"flip_h must have dtype in .*torch.bool.*got torch.int64"),
    "flip-length": (dict(flip_v=torch.tensor([True])), ValueError,
                    r"flip_v must have shape \(2,\)"),
    "flip-list": (dict(flip_h=[True, False]), TypeError,
                  r"flip_h must be a torch.Tensor, got list"),
    "out-dtype-int32": (dict(out_dtype=torch.int32), TypeError,
                        r"out_dtype must be one of .*got torch.int32"),
    "out-dtype-str": (dict(out_dtype="float16"), TypeError, r"out_dtype must be one of"),
    "mean-without-std": (dict(std=None), ValueError, r"give mean and std together"),
    "uint8-normalize": (dict(out_dtype=torch.uint8), ValueError,
                        r"mean/std normalisation needs a float out_dtype"),
    "mean-length": (dict(mean=(0.5, 0.5)), ValueError,
                    r"mean must have one entry per channel \(3\), got 2"),
    "std-zero": (dict(std=(0.2, 0.0, 0.2)), ValueError, r"std entries must be finite and > 0"),
    "mean-nan": (dict(mean=(0.2, float("nan"), 0.2)), ValueError, r"mean entries must be finite"),
    "mean-scalar": (dict(mean=0.5), TypeError, r"mean must be a sequence of 3 numbers"),
    "mean-strings": (dict(mean=("a", "b", "c")), TypeError, r"mean must contain numbers"),
    "box-below": (dict(top=torch.tensor([0, 3])), ValueError,
                  r"sample 1: crop top=3, left=2, height=4, width=5 does not fit in the 6x7 "
                  r"image; expected 0 <= top <= 2 and 0 <= left <= 2"),
    "box-left-negative": (dict(left=torch.tensor([-1, 0])), ValueError,
                          r"sample 0: crop top=0, left=-1"),
    "crop-too-big": (dict(height=7), ValueError,
                     r"crop height x width = 7x5 is larger than the 6x7 images"),
    "brightness-int": (dict(brightness=torch.tensor([1, 1])), TypeError,
                       r"brightness must have dtype in"),
    "brightness-negative": (dict(brightness=torch.tensor([1.0, -0.5])), ValueError,
                            r"brightness\[1\] must be a finite factor >= 0, got -0.5"),
    "contrast-nan": (dict(contrast=torch.tensor([float("nan"), 1.0])), ValueError,
                     r"contrast\[0\] must be a finite factor >= 0, got nan"),
    "contrast-mean-range": (dict(contrast=torch.ones(2), contrast_mean=torch.tensor([0.5, 2.0])),
                            ValueError, r"contrast_mean\[1\] must be in \[0, 1\], got 2.0"),
    "contrast-mean-alone": (dict(contrast_mean=torch.ones(2)), ValueError,
                            r"contrast_mean given without contrast"),
    "brightness-length": (dict(brightness=torch.ones(3)), ValueError,
                          r"brightness must have shape \(2,\)"),
    "brightness-device": (dict(brightness=torch.ones(2, device=META)), ValueError,
                          r"brightness is on meta"),
    "saturation-negative": (dict(saturation=torch.tensor([1.0, -0.1])), ValueError,
                            r"saturation\[1\] must be a finite factor >= 0, got -0.1"),
    "hue-range": (dict(hue=torch.tensor([0.5, -0.6])), ValueError,
                  r"hue\[1\] must be in \[-0.5, 0.5\], got -0.6"),
    "hue-nan": (dict(hue=torch.tensor([float("nan"), 0.0])), ValueError,
                r"hue\[0\] must be in \[-0.5, 0.5\], got nan"),
    "saturation-4-channels": (dict(images=torch.zeros((2, 6, 7, 4), dtype=torch.uint8),
                                   mean=None, std=None, saturation=torch.ones(2)), ValueError,
                              r"saturation and hue need 1 or 3 channels \(as torchvision\), "
                              r"got 4"),
    "order-without-jitter": (dict(order=torch.tensor([228, 228])), ValueError,
                             r"order given without any jitter op"),
    "order-float": (dict(hue=torch.zeros(2), order=torch.tensor([228.0, 228.0])), TypeError,
                    r"order must have dtype in"),
    "order-not-a-permutation": (dict(hue=torch.zeros(2), order=torch.tensor([228, 0])),
                                ValueError, r"order\[1\] = 0 is not an order code"),
    "order-permutation-out-of-range": (dict(hue=torch.zeros(2),
                                            order=torch.tensor([[3, 2, 1, 0], [0, 1, 2, 4]])),
                                       ValueError, r"order\[1\] = -1 is not an order code"),
    "contrast-mean-without-contrast": (dict(brightness=torch.ones(2),
                                            contrast_mean=torch.ones(2)), ValueError,
                                       r"contrast_mean given without contrast"),
}


@pytest.mark.parametrize("fn", [crop_flip_permute, reference.crop_flip_permute],
                         ids=["launcher", "reference"])
@pytest.mark.parametrize("case", CROP_CASES, ids=list(CROP_CASES))
def test_crop_errors(fn, case):
    over, exc, match = CROP_CASES[case]
    with pytest.raises(exc, match=r"^crop_flip_permute: " + match):
        fn(**_crop_call(**over))


def _resize_call(**over):
    kw = dict(images=torch.zeros((2, 6, 7, 3), dtype=torch.uint8),
              boxes=torch.tensor([[0, 0, 6, 7], [1, 2, 3, 4]]), out_size=(4, 5),
              flip_h=torch.tensor([True, False]), flip_v=torch.zeros(2, dtype=torch.uint8))
    kw.update(over)
    return kw


def _ragged(**over):
    """A valid ragged call: a 4x5 and a 3x2 RGB image in a 200-byte buffer."""
    kw = _resize_call(images=torch.zeros(200, dtype=torch.uint8), offsets=torch.tensor([0, 100]),
                      heights=torch.tensor([4, 3]), widths=torch.tensor([5, 2]),
                      boxes=torch.tensor([[0, 0, 4, 5], [1, 0, 2, 2]]))
    kw.update(over)
    return kw


RESIZE_CASES = {
    "boxes-float": (_resize_call(boxes=torch.zeros((2, 4))), TypeError,
                    r"boxes must be int32 or int64, got torch.float32"),
    "boxes-shape": (_resize_call(boxes=torch.zeros((2, 3), dtype=torch.int64)), ValueError,
                    r"boxes must have shape \(2, 4\) of \(top, left, height, width\), got \(2, 3\)"),
    "boxes-batch": (_resize_call(boxes=torch.zeros((3, 4), dtype=torch.int64)), ValueError,
                    r"boxes must have shape \(2, 4\)"),
    "boxes-device": (_resize_call(boxes=torch.zeros((2, 4), dtype=torch.int64, device=META)),
                     ValueError, r"boxes is on meta but images is on cpu"),
    "box-outside": (_resize_call(boxes=torch.tensor([[0, 0, 6, 7], [4, 2, 3, 4]])), ValueError,
                    r"boxes\[1\] = \(top=4, left=2, height=3, width=4\) does not fit in the "
                    r"6x7 image"),
    "box-empty": (_resize_call(boxes=torch.tensor([[0, 0, 0, 7], [1, 2, 3, 4]])), ValueError,
                  r"boxes\[0\] = \(top=0, left=0, height=0, width=7\)"),
    "out-size-zero": (_resize_call(out_size=0), ValueError, r"out_size must be >= 1, got 0"),
    "out-size-triple": (_resize_call(out_size=(2, 3, 4)), ValueError,
                        r"out_size must be an int or an \(h, w\) pair, got \(2, 3, 4\)"),
    "out-size-str": (_resize_call(out_size="224"), TypeError, r"out_size must be an int"),
    "out-size-float": (_resize_call(out_size=(2.5, 3)), TypeError,
                       r"out_size\[0\] must be an int, got 2.5"),
    "antialias-str": (_resize_call(antialias="yes"), TypeError,
                      r"antialias must be a bool, got 'yes'"),
    "channels-mismatch": (_resize_call(channels=4), ValueError,
                          r"channels=4 does not match images.shape\[-1\]=3"),
    "heights-without-offsets": (_resize_call(heights=torch.tensor([6, 6])), ValueError,
                                r"heights/widths are only for the ragged form"),
    "std-length": (_resize_call(out_dtype=torch.float32, mean=(0.5,) * 4, std=(0.2,) * 4),
                   ValueError, r"mean must have one entry per channel \(3\), got 4"),
    "ragged-2d-buffer": (_ragged(images=torch.zeros((2, 100), dtype=torch.uint8)), ValueError,
                         r"with offsets=, images must be one flat 1-D uint8 buffer"),
    "ragged-float-buffer": (_ragged(images=torch.zeros(200)), TypeError,
                            r"images must be uint8, got torch.float32"),
    "ragged-strided-buffer": (_ragged(images=torch.zeros(400, dtype=torch.uint8)[::2]),
                              ValueError, r"images must be contiguous"),
    "ragged-missing-widths": (_ragged(widths=None), ValueError,
                              r"the ragged form needs offsets=, heights= and widths="),
    "ragged-offsets-2d": (_ragged(offsets=torch.zeros((2, 1), dtype=torch.int64)), ValueError,
                          r"offsets must be 1-D"),
    "ragged-offsets-float": (_ragged(offsets=torch.tensor([0.0, 100.0])), TypeError,
                             r"offsets must have dtype in"),
    "ragged-heights-length": (_ragged(heights=torch.tensor([4])), ValueError,
                              r"heights must have shape \(2,\)"),
    "ragged-past-end": (_ragged(offsets=torch.tensor([0, 190])), ValueError,
                        r"sample 1: offset=190, height=3, width=2, channels=3 does not fit in "
                        r"the flat buffer of 200 bytes"),
    "ragged-negative-offset": (_ragged(offsets=torch.tensor([-1, 100])), ValueError,
                               r"sample 0: offset=-1"),
    "ragged-zero-width": (_ragged(widths=torch.tensor([5, 0])), ValueError,
                          r"sample 1: offset=100, height=3, width=0"),
    "ragged-box-outside": (_ragged(boxes=torch.tensor([[0, 0, 4, 5], [1, 1, 2, 2]])),
                           ValueError, r"boxes\[1\] = .* does not fit in the 3x2 image"),
    "ragged-channels": (_ragged(channels=5), ValueError, r"channels must be 1..4, got 5"),
    "ragged-channels-zero": (_ragged(channels=0), ValueError, r"channels must be >= 1, got 0"),
    "ragged-tiny-buffer": (_ragged(images=torch.zeros(2, dtype=torch.uint8), validate=False),
                           ValueError, r"the flat buffer has 2 bytes, less than one 3-channel"),
    "ragged-boxes-batch": (_ragged(boxes=torch.zeros((3, 4), dtype=torch.int64)), ValueError,
                           r"boxes must have shape \(2, 4\)"),
}


@pytest.mark.parametrize("fn", [resized_crop, reference.resized_crop],
                         ids=["launcher", "reference"])
@pytest.mark.parametrize("case", RESIZE_CASES, ids=list(RESIZE_CASES))
def test_resize_errors(fn, case):
    kwargs, exc, match = RESIZE_CASES[case]
    with pytest.raises(exc, match=r"^resized_crop: " + match):
        fn(**kwargs)


def test_valid_calls_reach_the_launch():
    """The base calls above are valid: they get as far as the (patched) launch."""
    for fn, kw in ((crop_flip_permute, _crop_call()), (resized_crop, _resize_call()),
                   (resized_crop, _ragged())):
        with pytest.raises(AssertionError, match="launched"):
            fn(**kw)


EPILOGUE_CASES = {
    "nhwc-float": (dict(images=torch.zeros((2, 3, 4, 4))), ValueError,
                   r"images must be an \(N, C, H, W\) uint8 batch with C in 1..4, got "
                   r"torch.float32"),
    "five-channels": (dict(images=torch.zeros((2, 5, 4, 4), dtype=torch.uint8)), ValueError,
                      r"images must be .*with C in 1..4.*\(2, 5, 4, 4\)"),
    "out-wrong-dtype": (dict(out=torch.empty((2, 3, 4, 4), dtype=torch.float32)), ValueError,
                        r"out must be a contiguous torch.float16 tensor of shape \(2, 3, 4, 4\)"),
    "out-wrong-shape": (dict(out=torch.empty((2, 3, 4, 5), dtype=torch.float16)), ValueError,
                        r"out must be a contiguous torch.float16 tensor"),
    "hue-range": (dict(hue=torch.tensor([0.0, 0.51])), ValueError, r"hue\[1\] must be in"),
    "order-length": (dict(brightness=torch.ones(2), order=torch.tensor([228])), ValueError,
                     r"order must have shape \(2,\)"),
}


@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=list(EPILOGUE_CASES))
def test_epilogue_errors(case):
    over, exc, match = EPILOGUE_CASES[case]
    kw = dict(images=torch.zeros((2, 3, 4, 4), dtype=torch.uint8), out_dtype=torch.float16,
              mean=(0.5,) * 3, std=(0.2,) * 3)
    kw.update(over)
    with pytest.raises(exc, match=r"^epilogue: " + match):
        reference.epilogue(kw.pop("images"), **kw)
