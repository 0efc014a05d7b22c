"""Generated test images: ordinary ones and every kind of bad one."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

from PIL import Image


def _save(image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body)
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png_claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims width × height greyscale
    pixels: a decompression bomb without allocating one (its data is one row)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + _png_chunk(b"IEND", b"")
    )


def write_image_corpus(root: Path) -> dict[str, str]:
    """Writes the corpus; returns {relative path: expected outcome} ('ok' or a reason)."""
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, tuple[bytes, str]] = {
        "ok/rgb.jpg": (_save(Image.new("RGB", (640, 480), (200, 30, 30)), "JPEG"), "ok"),
        "ok/alpha.png": (_save(Image.new("RGBA", (300, 200), (0, 0, 255, 128)), "PNG"), "ok"),
        "ok/palette.png": (
            _save(Image.new("RGB", (120, 90), (10, 200, 10)).convert("P"), "PNG"),
            "ok",
        ),
        "ok/cmyk.jpg": (_save(Image.new("CMYK", (200, 200), (0, 120, 120, 0)), "JPEG"), "ok"),
        "ok/sixteen-bit.png": (_save(Image.new("I;16", (100, 50), 40000), "PNG"), "ok"),
        "ok/tiny.webp": (_save(Image.new("RGB", (32, 32), (1, 2, 3)), "WEBP"), "ok"),
    }
    rotated = Image.new("RGB", (400, 200), (90, 90, 200))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° when displayed
    files["ok/exif-rotated.jpg"] = (_save(rotated, "JPEG", exif=exif.tobytes()), "ok")
    whole = _save(Image.effect_noise((512, 512), 64).convert("RGB"), "JPEG", quality=95)
    files["bad/cut-in-half.jpg"] = (whole[: len(whole) // 2], "truncated or corrupt image")
    files["bad/text-named.jpg"] = (b"this is a text file, not a picture\n", "not an image")
    files["bad/needle.png"] = (
        _save(Image.new("RGB", (1, 20000), (0, 0, 0)), "PNG"),
        "extreme aspect ratio",
    )
    files["bad/bomb.png"] = (_save(Image.new("L", (6000, 6000), 0), "PNG"), "image too large")
    files["bad/empty.jpg"] = (b"", "empty file")
    for rel, (data, _) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return {rel: outcome for rel, (_, outcome) in files.items()}
