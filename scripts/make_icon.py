"""Draws docs/icon.png, the pack's registry icon (pyproject.toml [tool.comfy] Icon): a trident (Triton)
on a rounded dark tile. Run with any Python that has Pillow: python scripts/make_icon.py"""
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = 128
SCALE = 4  # drawn at 4x and downsampled: smooth edges without an anti-aliasing API
OUT = Path(__file__).resolve().parents[1] / "docs" / "icon.png"


def draw() -> Image.Image:
    s = SIZE * SCALE
    img = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((0, 0, s - 1, s - 1), radius=26 * SCALE, fill=(24, 32, 48, 255))

    def box(x0, y0, x1, y1):  # coordinates in 128-px units
        return tuple(v * SCALE for v in (x0, y0, x1, y1))

    gold, teal = (255, 184, 28, 255), (64, 200, 190, 255)
    d.rectangle(box(60, 40, 68, 112), fill=gold)                # shaft
    d.rounded_rectangle(box(30, 62, 98, 72), radius=5 * SCALE, fill=gold)  # cross bar
    for x in (30, 88):                                           # outer prongs
        d.rectangle(box(x, 30, x + 10, 72), fill=gold)
        d.polygon([(v * SCALE, w * SCALE) for v, w in ((x - 3, 32), (x + 5, 16), (x + 13, 32))], fill=gold)
    d.polygon([(v * SCALE, w * SCALE) for v, w in ((55, 42), (64, 16), (73, 42))], fill=gold)  # middle point
    d.rounded_rectangle(box(52, 104, 76, 112), radius=3 * SCALE, fill=teal)  # grip
    return img.resize((SIZE, SIZE), Image.LANCZOS)


if __name__ == "__main__":
    draw().save(OUT, optimize=True)
    print(f"wrote {OUT}")
