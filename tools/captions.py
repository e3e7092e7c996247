"""Captions on the contact sheet that show any class name: each character is drawn with the
first font found that has a glyph for it (DejaVu Sans, Noto, a CJK font, ...: whatever the
system has), and a character no font covers is written as its code point (``U+732B``)
rather than as an empty box.

Fonts are looked up once per process in the usual font folders; PIL's own default font
(Latin only) is the last resort, so a machine without any font file still gets a caption.
"""
from __future__ import annotations

import functools
import os

# Preferred files first: broad coverage, then the CJK and last-resort fonts.
PREFERRED = ("DejaVuSans.ttf", "NotoSans-Regular.ttf", "NotoSansCJK-Regular.ttc",
             "NotoSansCJKsc-Regular.otf", "DroidSansFallbackFull.ttf", "DroidSansFallback.ttf",
             "wqy-microhei.ttc", "unifont.otf", "Arial Unicode.ttf", "ArialUni.ttf",
             "arialuni.ttf", "msyh.ttc", "segoeui.ttf", "Arial.ttf", "arial.ttf")
FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", os.path.expanduser("~/.fonts"),
             os.path.expanduser("~/.local/share/fonts"), "/Library/Fonts",
             "/System/Library/Fonts", os.path.join(os.environ.get("WINDIR", "C:\\Windows"),
                                                   "Fonts"))
_PROBE = "\U0010fffd"  # a private-use code point no font draws: what "missing" looks like


def font_files(dirs=FONT_DIRS) -> list[str]:
    """Paths of the PREFERRED font files found under ``dirs``, in PREFERRED's order."""
    found = {}
    for top in dirs:
        for folder, _, files in os.walk(top):
            for name in files:
                if name in PREFERRED and name not in found:
                    found[name] = os.path.join(folder, name)
    return [found[name] for name in PREFERRED if name in found]


@functools.lru_cache(maxsize=8)
def fonts(size: int = 12) -> tuple:
    """The fonts captions are drawn with, best first; PIL's default font last."""
    from PIL import ImageFont

    out = []
    for path in font_files():
        try:
            out.append(ImageFont.truetype(path, size))
        except OSError:  # unreadable or not a font after all: try the next
            continue
    try:
        out.append(ImageFont.load_default(size))
    except TypeError:  # Pillow < 10.1 has no sized default font
        out.append(ImageFont.load_default())
    return tuple(out)


def _bitmap(font, ch: str) -> tuple:
    mask = font.getmask(ch)
    return mask.size, bytes(mask)


@functools.lru_cache(maxsize=65536)
def covers(font, ch: str) -> bool:
    """Whether ``font`` has a glyph for ``ch`` (its drawing differs from the missing-glyph
    box the font draws for a code point no font has)."""
    if ch.isspace():
        return True
    try:
        return _bitmap(font, ch) != _bitmap(font, _PROBE)
    except (UnicodeError, ValueError, OSError):
        return False


def runs(text: str, choices) -> list[tuple]:
    """``text`` cut into (font, piece) runs, each piece drawable by its font; characters no
    font covers become ``U+XXXX`` in the first font."""
    out = []
    for ch in text:
        font = next((f for f in choices if covers(f, ch)), None)
        if font is None:
            font, ch = choices[0], f"U+{ord(ch):04X}"
        if out and out[-1][0] is font:
            out[-1] = (font, out[-1][1] + ch)
        else:
            out.append((font, ch))
    return out


def font_name(font) -> str:
    """The file name of a font from ``fonts()`` ('PIL default' for PIL's own)."""
    path = getattr(font, "path", None)
    return os.path.basename(path) if isinstance(path, str) else "PIL default"


def draw_caption(draw, xy, text: str, *, width: int, size: int = 12, fill="black") -> list:
    """Draw ``text`` at ``xy``, cut at ``width`` pixels; returns the runs drawn as
    (font name, piece) so a caller can report them."""
    x, y = xy
    right, drawn = xy[0] + width, []
    for font, piece in runs(text, fonts(size)):
        while piece and x + draw.textlength(piece, font=font) > right:
            piece = piece[:-1]  # the caption is full: keep what fits
        if not piece:
            break
        draw.text((x, y), piece, font=font, fill=fill)
        x += draw.textlength(piece, font=font)
        drawn.append((font_name(font), piece))
    return drawn

