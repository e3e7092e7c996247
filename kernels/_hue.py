"""Torch reference of torchvision's ``adjust_hue`` (float RGB in [0, 1]), fast on CPU.

RGB -> HSV performs torchvision's ``_rgb_to_hsv`` float32 operations in order, but
branch-free: each ``where`` / boolean mask becomes a 0/1 float mask built with ``sign``
(selections stay exact: products with 0 or 1, sums with zeros), because torch's CPU ``where``
and comparisons run many times slower than arithmetic. HSV -> RGB is the sector-free
formula in :func:`hue_`. The Triton twin ``_colour_tl.hue3`` performs the same operations.
Every intermediate lives in preallocated scratch planes (``out=`` / in-place ops): fresh
allocations of this size page-fault on every call.
"""

from __future__ import annotations

import torch

SCRATCH_PLANES = 10  # (k, H, W) float32 planes hue_ needs


def hue_(x: torch.Tensor, hue: torch.Tensor, sc: list) -> None:
    """Shift the hue of an ``(k, 3, H, W)`` chunk in place; ``hue``: ``(k, 1, 1, 1)``;
    ``sc``: ``SCRATCH_PLANES`` contiguous ``(k, H, W)`` float32 planes.

    HSV -> RGB uses the sector-free form ``c_n = v * (1 - s * clamp(min(k, 4 - k), 0, 1))``
    with ``k = (n + 6 h) mod 6`` and ``n = 5, 3, 1`` for R, G, B: the same values as
    torchvision's sector table (``v, p = v (1 - s), q = v (1 - s f), t``) up to float
    rounding of ``f`` (<= 2.4e-7), with no selection at all.
    """
    v, mn, s, h, ar, ag, ab, mr, mg, t = sc
    _rgb_to_hsv(x, v, mn, s, h, ar, ag, ab, mr, mg, t)
    h.add_(hue.view(-1, 1, 1))
    h.sub_(torch.floor(h, out=t))  # remainder(h + hue, 1): exact for h + hue in [-0.5, 1.5)
    h.mul_(6.0)
    for channel, n in enumerate((5.0, 3.0, 1.0)):
        k = torch.add(h, n, out=ar)
        k.sub_(torch.floor(k, out=t).sub_(5.0).clamp_(0.0, 1.0).mul_(6.0))  # mod 6
        torch.minimum(k, torch.neg(k, out=t).add_(4.0), out=k).clamp_(0.0, 1.0)
        x[:, channel].copy_(k.mul_(s).neg_().add_(1.0).mul_(v))


def _rgb_to_hsv(x, v, mn, s, h, ar, ag, ab, mr, mg, t) -> None:
    """torchvision ``_rgb_to_hsv`` into ``h``, ``s``, ``v`` (the rest is scratch)."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    torch.maximum(torch.maximum(r, g, out=v), b, out=v)
    torch.minimum(torch.minimum(r, g, out=mn), b, out=mn)
    cr = mn.neg_().add_(v)  # max - min
    eqc = torch.sign(cr, out=t).neg_().add_(1.0)  # 1.0 where max == min (cr >= 0)
    torch.add(v, eqc, out=s)
    torch.div(cr, s, out=s)  # cr == 0 where eqc: any non-zero divisor gives torchvision's 0
    crd = cr.add_(eqc)
    rc, gc, bc = torch.sub(v, r, out=ar), torch.sub(v, g, out=ag), torch.sub(v, b, out=ab)
    is_r = torch.sign(rc, out=mr).neg_().add_(1.0)  # before the division: sign of max - r
    is_g = torch.sign(gc, out=mg).neg_().add_(1.0).mul_(torch.neg(is_r, out=t).add_(1.0))
    rc.div_(crd)
    gc.div_(crd)
    bc.div_(crd)
    is_b = t.sub_(is_g)  # 1 - is_r - is_g
    # h = is_r * (bc - gc) + is_g * ((rc + 2) - bc) + is_b * ((gc + 4) - rc)
    torch.sub(bc, gc, out=h).mul_(is_r)
    h.add_(torch.add(rc, 2.0, out=crd).sub_(bc).mul_(is_g))
    h.add_(gc.add_(4.0).sub_(rc).mul_(is_b))
    h.mul_(1.0 / 6.0).add_(1.0)
    h.sub_(torch.floor(h, out=t))  # fmod(h, 1) for h >= 0
