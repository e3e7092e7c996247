"""The transform spec (reader/batch/plan.py, transforms.py, geometry.py): pinned parameters
and every validation message.

The parameters a sample gets (its crop box, flips, colour-jitter factors and their order)
are a documented pure function of (seed, epoch, sample index): the numbers below were
computed once with this code and are pinned, so a change to the box sampling, the streams
or the jitter draw fails here. Properties that hold for any input are checked alongside.
"""
import numpy as np
import pytest
import torch

from dlpack_io.reader import (CenterCrop, ColorJitter, Normalize, RandomCrop,
                              RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip, Resize)
from dlpack_io.kernels.records import NEUTRAL_FACTORS
from dlpack_io.reader.batch.plan import Draws, compile_spec, full_image_boxes
from dlpack_io.reader.transforms.geometry import ResizeThenCrop, decode_windows, round_boxes
from dlpack_io.reader.transforms.geometry import TransformError

IDX = np.array([3, 17, 1000, 42])
HS, WS = np.array([100, 64, 300, 40]), np.array([80, 200, 300, 400])

FULL = [RandomResizedCrop(32), RandomHorizontalFlip(0.5), RandomVerticalFlip(0.3),
        ColorJitter(0.4, 0.3, 0.2, 0.1), Normalize()]
# FULL drawn for seed 5, epoch 2, samples IDX of sizes HS x WS
PINNED_BOXES = [[11, 16, 62, 56], [28, 19, 34, 42], [15, 85, 119, 104], [0, 173, 40, 53]]
PINNED_FLIP_H = [False, True, False, False]
PINNED_FLIP_V = [False, False, True, False]
PINNED_JITTER = [  # float32 brightness, contrast, saturation, hue
    [1.1763758659362793, 1.228124737739563, 0.900708794593811, 0.01498184073716402],
    [0.616682231426239, 0.9214763641357422, 0.8068504929542542, -0.017573799937963486],
    [1.1397396326065063, 1.0567983388900757, 1.0940459966659546, 0.06569214165210724],
    [1.2643464803695679, 1.038295030593872, 0.8026256561279297, -0.015541688539087772]]
PINNED_ORDER = [[2, 1, 3, 0], [0, 1, 3, 2], [1, 2, 0, 3], [1, 0, 2, 3]]


def test_full_spec_draw_is_pinned():
    spec = compile_spec(FULL)
    p = spec.draw(5, 2, IDX, HS, WS)
    assert p.boxes.dtype == np.int64 and p.boxes.tolist() == PINNED_BOXES
    assert p.flip_h.tolist() == PINNED_FLIP_H and p.flip_v.tolist() == PINNED_FLIP_V
    assert p.jitter.dtype == np.float32 and p.jitter.tolist() == PINNED_JITTER
    assert p.order.dtype == np.int8 and p.order.tolist() == PINNED_ORDER
    assert (p.out_size, p.resize, p.exact, p.windows) == ((32, 32), True, None, None)
    assert spec.dtype == torch.float32 and spec.has_epilogue


def test_draw_is_per_sample_whatever_the_batch():
    spec = compile_spec(FULL)
    whole = spec.draw(5, 2, IDX, HS, WS)
    order = [2, 0, 3, 1]
    part = spec.draw(5, 2, IDX[order], HS[order], WS[order])
    assert part.boxes.tolist() == [PINNED_BOXES[k] for k in order]
    assert part.jitter.tolist() == [PINNED_JITTER[k] for k in order]
    assert part.order.tolist() == [PINNED_ORDER[k] for k in order]
    assert part.flip_v.tolist() == [PINNED_FLIP_V[k] for k in order]
    taken = whole.take(np.array([3, 1]))
    assert taken.boxes.tolist() == [PINNED_BOXES[3], PINNED_BOXES[1]]
    assert taken.flip_h.tolist() == [PINNED_FLIP_H[3], PINNED_FLIP_H[1]]
    assert taken.jitter.tolist() == [PINNED_JITTER[3], PINNED_JITTER[1]]
    assert taken.order.tolist() == [PINNED_ORDER[3], PINNED_ORDER[1]]
    assert whole.take(np.array([True, False, False, True])).boxes.tolist() == \
        [PINNED_BOXES[0], PINNED_BOXES[3]]
    other_epoch = spec.draw(5, 3, IDX, HS, WS)
    assert other_epoch.boxes.tolist() != PINNED_BOXES


def test_jitter_factors_lie_in_their_ranges_and_disabled_ops_are_neutral():
    idx = np.arange(3000)
    factors, order = ColorJitter(brightness=(0.5, 0.7), hue=(-0.2, 0.3)).draw(Draws(1, 0), idx)
    assert factors.min(axis=0)[0] >= 0.5 and factors.max(axis=0)[0] < 0.7
    assert factors[:, 0].min() < 0.51 and factors[:, 0].max() > 0.69  # the whole range
    assert np.all(factors[:, 1] == 1.0) and np.all(factors[:, 2] == 1.0)
    assert factors[:, 3].min() >= -0.2 and factors[:, 3].max() < 0.3
    assert factors[:, 3].min() < -0.19 and factors[:, 3].max() > 0.29
    assert np.array_equal(np.sort(order, axis=1), np.tile(np.arange(4), (3000, 1)))
    firsts = np.bincount(order[:, 0], minlength=4) / 3000  # each op comes first 1/4 of the time
    assert np.all(np.abs(firsts - 0.25) < 0.04), firsts
    assert NEUTRAL_FACTORS == (1.0, 1.0, 1.0, 0.0)


def test_flip_probabilities_are_thresholds_on_the_flip_streams():
    from dlpack_io.reader.batch.plan import uniforms

    idx = np.arange(2000)
    spec = compile_spec([RandomCrop(4), RandomHorizontalFlip(0.3), RandomVerticalFlip(0.6)])
    p = spec.draw(8, 1, idx, np.full(2000, 10), np.full(2000, 10))
    assert np.array_equal(p.flip_h, uniforms(8, 1, RandomHorizontalFlip.stream, idx)[:, 0] < 0.3)
    assert np.array_equal(p.flip_v, uniforms(8, 1, RandomVerticalFlip.stream, idx)[:, 0] < 0.6)
    none = compile_spec([RandomCrop(4)]).draw(8, 1, idx, np.full(2000, 10), np.full(2000, 10))
    assert not none.flip_h.any() and not none.flip_v.any()
    always = compile_spec([RandomCrop(4), RandomHorizontalFlip(1.0)]).draw(
        8, 1, idx, np.full(2000, 10), np.full(2000, 10))
    assert always.flip_h.all()


def test_resize_then_random_crop_is_pinned():
    p = compile_spec([Resize(48), RandomCrop(40)]).draw(5, 2, IDX, HS, WS)
    assert p.exact.tolist() == [
        [13.333333333333334, 3.3333333333333335, 66.66666666666667, 66.66666666666667],
        [10.666666666666666, 65.33333333333333, 53.33333333333333, 53.33333333333333],
        [0.0, 12.5, 250.0, 250.0],
        [0.8333333333333334, 79.16666666666667, 33.333333333333336, 33.333333333333336]]
    assert p.boxes.tolist() == [[13, 3, 67, 67], [11, 65, 53, 53], [0, 12, 250, 250],
                                [1, 79, 33, 33]]
    assert p.windows.tolist() == [[10, 0, 73, 73], [7, 62, 57, 60], [0, 4, 258, 267],
                                  [0, 77, 37, 38]]
    assert (p.out_size, p.resize) == ((40, 40), True)


def test_resize_then_center_crop_is_pinned():
    p = compile_spec([Resize(48), CenterCrop(40)]).draw(5, 2, IDX, HS, WS)
    assert p.exact.tolist() == [
        [16.666666666666668, 6.666666666666667, 66.66666666666667, 66.66666666666667],
        [5.333333333333333, 73.33333333333333, 53.33333333333333, 53.33333333333333],
        [25.0, 25.0, 250.0, 250.0],
        [3.3333333333333335, 183.33333333333334, 33.333333333333336, 33.333333333333336]]
    assert p.boxes.tolist() == [[17, 7, 67, 67], [5, 73, 53, 53], [25, 25, 250, 250],
                                [3, 183, 33, 33]]


def test_resize_alone_with_a_fixed_size_covers_the_image():
    p = compile_spec([Resize((20, 30))]).draw(0, 0, IDX, HS, WS)
    assert p.exact.tolist() == [[0.0, 0.0, float(h), float(w)] for h, w in zip(HS, WS)]
    assert p.boxes.tolist() == [[0, 0, int(h), int(w)] for h, w in zip(HS, WS)]
    assert (p.out_size, p.resize) == ((20, 30), True)
    assert ResizeThenCrop(Resize((20, 30))).size == (20, 30)


def test_resized_shape_follows_torchvision():
    """Shorter side to 48, the longer int(48 * long / short) (truncated, not rounded)."""
    h, w = Resize(48).resized_shape(np.array([100, 64, 300, 40, 70]), np.array([80, 200, 300, 400, 100]))
    assert h.tolist() == [60, 48, 48, 48, 48] and w.tolist() == [48, 150, 48, 480, 68]  # 68.57
    h, w = Resize((7, 9)).resized_shape(HS, WS)
    assert h.tolist() == [7] * 4 and w.tolist() == [9] * 4


def test_crop_boxes_are_pinned():
    assert RandomCrop((20, 30)).boxes(HS, WS, Draws(5, 2), IDX).tolist() == \
        [[31, 15, 20, 30], [42, 76, 20, 30], [17, 71, 20, 30], [3, 80, 20, 30]]
    assert CenterCrop((21, 30)).boxes(HS, WS, Draws(5, 2), IDX).tolist() == \
        [[40, 25, 21, 30], [22, 85, 21, 30], [140, 135, 21, 30], [10, 185, 21, 30]]
    # torchvision rounds (H - h) / 2 half to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
    top, left = CenterCrop(4).corners(np.array([5, 7, 9]), np.array([4, 4, 4]), Draws(0, 0), np.arange(3))
    assert top.tolist() == [0, 2, 2] and left.tolist() == [0, 0, 0]


def test_random_crop_reaches_every_position():
    """A 3-pixel slack in each direction: 16 corners, all drawn (no off-by-one)."""
    idx = np.arange(2000)
    top, left = RandomCrop(5).corners(np.full(2000, 8), np.full(2000, 8), Draws(1, 0), idx)
    assert set(zip(top.tolist(), left.tolist())) == {(t, l) for t in range(4) for l in range(4)}
    top, _ = RandomCrop(8).corners(np.full(50, 8), np.full(50, 8), Draws(1, 0), idx[:50])
    assert not top.any()  # no slack: the only position


def test_random_resized_crop_fallback_is_torchvisions_central_crop():
    rrc = RandomResizedCrop(16, scale=(0.9, 1.0), ratio=(5.0, 9.0))
    boxes = rrc.boxes(np.array([100, 30, 40]), np.array([30, 100, 400]), Draws(0, 0), np.arange(3))
    assert boxes.tolist()[:2] == [[47, 0, 6, 30], [5, 0, 20, 100]]
    wide = RandomResizedCrop(16, scale=(0.9, 1.0), ratio=(0.2, 0.3))
    assert wide.boxes(np.array([40]), np.array([400]), Draws(0, 0), np.arange(1)).tolist() == \
        [[0, 194, 40, 12]]  # too wide: height kept, width round(40 * 0.3)
    inside = RandomResizedCrop(16, scale=(1.0, 1.0), ratio=(0.5, 2.0))
    assert inside.boxes(np.array([40]), np.array([41]), Draws(0, 0), np.arange(1)).tolist() == \
        [[0, 0, 40, 41]]  # the whole image: found by a try, or the fallback (ratio inside)
    full = RandomResizedCrop(16, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert full.boxes(np.array([40]), np.array([40]), Draws(0, 0), np.arange(1)).tolist() == [[0, 0, 40, 40]]


def test_round_boxes_and_decode_windows():
    exact = np.array([[0.4, 1.6, 5.5, 3.2], [9.7, 9.7, 5.0, 5.0]])
    hs, ws = np.array([10, 12]), np.array([10, 12])
    assert round_boxes(exact, hs, ws).tolist() == [[0, 2, 6, 3], [10, 10, 2, 2]]
    # margins: ceil(max(box / out, 1)) + 1 pixels each side, clipped to the image
    assert decode_windows(exact, (2, 2), hs, ws).tolist() == [[0, 0, 10, 8], [5, 5, 7, 7]]


def test_full_image_boxes_need_one_size():
    boxes, size = full_image_boxes(np.array([8, 8]), np.array([6, 6]), np.array([4, 5]))
    assert boxes.tolist() == [[0, 0, 8, 6], [0, 0, 8, 6]] and size == (8, 6)
    assert full_image_boxes(np.zeros(0), np.zeros(0), np.zeros(0))[1] == (0, 0)
    with pytest.raises(TransformError, match=r"without a crop or Resize every image must have "
                                             r"one size, but this one is 8x7 and sample 4 is "
                                             r"8x6: add e.g. RandomResizedCrop\(224\)") as info:
        full_image_boxes(np.array([8, 8, 8]), np.array([6, 6, 7]), np.array([4, 5, 9]))
    assert info.value.sample == 9
    with pytest.raises(TransformError, match=r"this one is 9x6 and sample 4 is 8x6") as info:
        full_image_boxes(np.array([8, 9, 8]), np.array([6, 6, 6]), np.array([4, 5, 9]))
    assert info.value.sample == 5  # the first that differs from the first sample
    p = compile_spec([]).draw(0, 0, np.array([4, 5]), np.array([8, 8]), np.array([6, 6]))
    assert (p.out_size, p.resize, p.jitter) == ((8, 6), False, None)


# ---- compile_spec: what is refused, and why ------------------------------------------------
@pytest.mark.parametrize("transforms,match", [
    ([RandomHorizontalFlip(), RandomCrop(8)], r"got \[RandomHorizontalFlip, RandomCrop\]"),
    ([Normalize(), ColorJitter(0.1)], r"got \[Normalize, ColorJitter\]"),
    ([RandomCrop(8), CenterCrop(8)], r"got \[RandomCrop, CenterCrop\]"),
    ([RandomHorizontalFlip(), CenterCrop(8)], r"got \[RandomHorizontalFlip, CenterCrop\]"),
    ([ColorJitter(0.1), CenterCrop(8)], r"got \[ColorJitter, CenterCrop\]"),
    ([ColorJitter(0.1), ColorJitter(0.2)], r"got \[ColorJitter, ColorJitter\]"),
    ([RandomCrop(8), Resize(8)], r"got \[RandomCrop, Resize\]"),
    ([Resize(32), RandomResizedCrop(24)], r"got \[Resize, RandomResizedCrop\] \(RandomResizedCrop "
                                          r"picks its box relative to the image: drop the Resize\)"),
    ([Resize(32)], r"Resize\(32\) alone gives every image its own size, which cannot be "
                   r"batched: follow it by CenterCrop/RandomCrop, or give Resize\(\(height, width\)\)"),
])
def test_transform_lists_that_cannot_be_fused(transforms, match):
    with pytest.raises(ValueError, match=match) as info:
        compile_spec(transforms)
    assert "transforms must come in this order: [Resize] [RandomResizedCrop | RandomCrop | " \
           "CenterCrop]" in str(info.value)


def test_foreign_transform_is_a_type_error():
    with pytest.raises(TypeError, match=r"is not a dlpack_io.reader transform \(Resize, "
                                        r"RandomResizedCrop, .*\); run your own per-sample "
                                        r"function with sample_transform=fn"):
        compile_spec([RandomCrop(8), print])


@pytest.mark.parametrize("kw,match", [
    (dict(transforms=[RandomCrop(8)], dtype=torch.int32),
     r"dtype torch.int32: expected torch.uint8, float16, bfloat16 or float32"),
    (dict(transforms=[Normalize()], dtype=torch.uint8), r"Normalize needs a float dtype"),
    (dict(transforms=[Normalize(mean=(0.5,) * 4, std=(0.2,) * 4)]),
     r"Normalize: 4 means/stds for 3-channel RGB images"),
])
def test_dtype_and_normalize_checks(kw, match):
    with pytest.raises(ValueError, match=match):
        compile_spec(**kw)


def test_compiled_defaults():
    spec = compile_spec([RandomCrop(8), Normalize()], dtype=torch.bfloat16, reduced_decode=False)
    assert (spec.dtype, spec.reduced_decode, spec.flip_h, spec.flip_v, spec.jitter) == \
        (torch.bfloat16, False, 0.0, 0.0, None)
    assert compile_spec([RandomCrop(8)]).dtype == torch.uint8
    assert not compile_spec([RandomCrop(8)]).has_epilogue
    assert compile_spec([RandomCrop(8), ColorJitter(0.1)]).has_epilogue
    assert compile_spec().geometry is None and compile_spec(None).reduced_decode is True
    rtc = compile_spec([Resize(10), CenterCrop(8)]).geometry
    assert isinstance(rtc, ResizeThenCrop) and rtc.size == (8, 8) and rtc.resizes


# ---- the transform objects' own checks -------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: RandomHorizontalFlip(1.5), r"RandomHorizontalFlip\(p=1.5\): a probability in \[0, 1\]"),
    (lambda: RandomVerticalFlip(-0.1), r"RandomVerticalFlip\(p=-0.1\): a probability in \[0, 1\]"),
    (lambda: ColorJitter(brightness=-1), r"ColorJitter: brightness=-1.0 must be non-negative"),
    (lambda: ColorJitter(contrast=(1.0, 2.0, 3.0)), r"ColorJitter: contrast \(1.0, 2.0, 3.0\) "
                                                    r"must be a number or a \(min, max\) pair"),
    (lambda: ColorJitter(saturation=(2.0, 1.0)), r"ColorJitter: saturation range \(2.0, 1.0\) "
                                                 r"must be increasing and within \(0.0, None\)"),
    (lambda: ColorJitter(brightness=(-0.5, 1.0)), r"brightness range \(-0.5, 1.0\) must be"),
    (lambda: ColorJitter(hue=0.6), r"ColorJitter: hue range \(-0.5, 0.6\) must be increasing "
                                   r"and within \(-0.5, 0.5\)"),
    (lambda: ColorJitter(hue=(-0.1, 0.7)), r"hue range \(-0.1, 0.7\)"),
    (lambda: Normalize(std=(0.2, 0.0, 0.2)), r"Normalize: mean .* and std .* need one finite "
                                             r"entry per channel each, std > 0"),
    (lambda: Normalize(mean=(0.5, float("nan"), 0.5)), r"need one finite entry per channel"),
    (lambda: Normalize(std=(0.2, float("inf"), 0.2)), r"need one finite entry per channel"),
    (lambda: Normalize(mean=(0.5, 0.5)), r"need one finite entry per channel"),
    (lambda: RandomCrop(0), r"RandomCrop: size 0 must be >= 1 pixel"),
    (lambda: CenterCrop((8, 0)), r"CenterCrop: size \(8, 0\) must be >= 1 pixel"),
    (lambda: RandomResizedCrop((1, 2, 3)), r"RandomResizedCrop: size \(1, 2, 3\) must be an int "
                                           r"or a \(height, width\) pair"),
    (lambda: RandomResizedCrop(8, scale=(0.5, 0.1)), r"scale \(0.5, 0.1\) and ratio .* must be "
                                                     r"increasing pairs of positive numbers"),
    (lambda: RandomResizedCrop(8, scale=(0.0, 1.0)), r"scale \(0.0, 1.0\) and ratio"),
    (lambda: RandomResizedCrop(8, ratio=(2.0, 1.0)), r"and ratio \(2.0, 1.0\) must be increasing"),
    (lambda: RandomResizedCrop(8, ratio=(0.0, 1.0)), r"and ratio \(0.0, 1.0\) must be increasing"),
    (lambda: Resize(0), r"Resize: size 0 must be >= 1 pixel"),
    (lambda: Resize((0, 4)), r"Resize: size \(0, 4\) must be >= 1 pixel"),
])
def test_transform_arguments_are_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_random_resized_crop_never_gives_an_empty_box():
    """An extreme aspect range rounds every try's height to 0: like torchvision, no such try
    is taken; the central fallback (1 x 10 here) is."""
    boxes = RandomResizedCrop(4, scale=(0.01, 0.01), ratio=(9.0, 9.0)).boxes(
        np.full(5, 10), np.full(5, 10), Draws(0, 0), np.arange(5))
    assert boxes.tolist() == [[4, 0, 1, 10]] * 5


def test_transforms_are_immutable_values():
    """A compiled spec keeps the transform objects: changing one afterwards must fail, not
    silently disagree with what was compiled."""
    import dataclasses

    for t in (Resize(8), RandomResizedCrop(8), RandomCrop(8), CenterCrop(8),
              RandomHorizontalFlip(), RandomVerticalFlip(), ColorJitter(0.1), Normalize()):
        field = dataclasses.fields(t)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError, match=field):
            setattr(t, field, getattr(t, field))
        assert {t: 1}[t] == 1  # a value: hashable


def test_one_pixel_is_a_valid_size():
    """The smallest size each transform accepts, on both sides (0 is refused above)."""
    assert RandomCrop((1, 3)).size == (1, 3) and CenterCrop((3, 1)).size == (3, 1)
    assert RandomResizedCrop(1).size == (1, 1) and Resize((1, 2)).size == (1, 2)
    boxes = CenterCrop((1, 1)).boxes(np.array([3]), np.array([5]), Draws(0, 0), np.array([0]))
    assert boxes.tolist() == [[1, 2, 1, 1]]


def test_transform_arguments_are_normalised():
    assert RandomResizedCrop(8).size == (8, 8) and RandomResizedCrop([6, 7]).size == (6, 7)
    assert RandomResizedCrop(8, scale=(1, 1), ratio=[1, 2]).scale == (1.0, 1.0)
    assert RandomResizedCrop(8).ratio == (3.0 / 4.0, 4.0 / 3.0)
    assert RandomResizedCrop(8).scale == (0.08, 1.0)
    assert Resize(12.0).size == 12 and Resize([3, 4]).size == (3, 4)
    assert RandomHorizontalFlip().p == 0.5 and RandomVerticalFlip(1).p == 1.0
    assert RandomHorizontalFlip(0).p == 0.0 and RandomHorizontalFlip(1).p == 1.0
    assert ColorJitter(brightness=0).ranges == (None, None, None, None)
    assert ColorJitter(brightness=1.5).ranges[0] == (0.0, 2.5)  # clipped at 0
    assert ColorJitter(hue=0.5).ranges[3] == (-0.5, 0.5)
    assert ColorJitter(contrast=(1.0, 1.0)).ranges[1] is None  # a neutral pair is "off"
    assert ColorJitter(hue=(0.0, 0.0)).ranges[3] is None
    assert Normalize().mean == (0.485, 0.456, 0.406) and Normalize().std == (0.229, 0.224, 0.225)
    assert Normalize([1, 2, 3], [1, 1, 1]).mean == (1.0, 2.0, 3.0)


def test_crops_refuse_images_smaller_than_the_crop():
    with pytest.raises(TransformError, match=r"RandomCrop\(41, 41\): the image is only 40x40 "
                                             r"pixels; crops do not pad: put Resize before it, "
                                             r"use RandomResizedCrop or a smaller size") as info:
        RandomCrop(41).boxes(np.array([50, 40]), np.array([50, 40]), Draws(0, 0), np.array([7, 8]))
    assert info.value.sample == 8
    with pytest.raises(TransformError, match=r"CenterCrop\(10, 20\): the image is only 40x19"):
        CenterCrop((10, 20)).boxes(np.array([40]), np.array([19]), Draws(0, 0), np.array([0]))
    assert CenterCrop((40, 19)).boxes(np.array([40]), np.array([19]), Draws(0, 0),
                                      np.array([0])).tolist() == [[0, 0, 40, 19]]
