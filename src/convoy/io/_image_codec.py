"""Image files to numpy arrays and back, as ``tf.io.decode_*`` / ``encode_*`` do, with Pillow.

Images are ``[height, width, channels]`` uint8 arrays (``[frames, height, width, 3]`` for a
GIF). Pillow is an optional dependency: ``pip install 'convoy[image]'``.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from convoy.errors import InvalidArgumentError

__all__ = ["decode_bmp", "decode_gif", "decode_image", "decode_jpeg", "decode_png",
           "encode_jpeg", "encode_png"]

_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("image decoding needs Pillow: pip install 'convoy[image]'") from None
    return Image


def _contents(contents: Any) -> bytes:
    if isinstance(contents, np.ndarray) and contents.ndim == 0:
        contents = contents[()]
    if not isinstance(contents, (bytes, np.bytes_)):
        raise InvalidArgumentError(f"contents must be the bytes of one image file, got "
                                   f"{type(contents).__name__}")
    return bytes(contents)


def _open(contents: Any, formats: tuple[str, ...] | None = None) -> Any:
    image = _pil()
    try:
        opened = image.open(io.BytesIO(_contents(contents)), formats=formats)
        opened.load()
    except Exception as error:  # Pillow raises several kinds for bad data
        kinds = "/".join(formats) if formats else "a known image format"
        raise InvalidArgumentError(f"contents is not {kinds}: {error}") from None
    return opened


def _channels(channels: int | None, allowed: tuple[int, ...]) -> int:
    count = 0 if channels is None else int(channels)
    if count not in allowed:
        raise InvalidArgumentError(f"channels must be one of {list(allowed)}, got {channels}")
    return count


def _file_channels(picture: Any) -> int:
    bands = len(picture.getbands())
    if picture.mode == "P":
        return 4 if "transparency" in picture.info else 3
    return 3 if picture.mode in ("CMYK", "YCbCr", "LAB", "HSV") else min(bands, 4)


def _array(picture: Any, channels: int) -> np.ndarray:
    """``picture`` as a uint8 (uint16 for a 16-bit PNG) ``[height, width, channels]`` array,
    ``channels`` 0 meaning the file's."""
    count = channels or _file_channels(picture)
    if picture.mode in ("I;16", "I;16B", "I") and count == 1:
        return np.asarray(picture, dtype=np.uint16)[:, :, None]
    converted = picture.convert(_MODES[count]) if picture.mode != _MODES[count] else picture
    array = np.asarray(converted, dtype=np.uint8)
    return array.reshape(*array.shape[:2], count)


def decode_jpeg(contents: Any, channels: int = 0, ratio: int = 1, fancy_upscaling: bool = True,
                try_recover_truncated: bool = False, acceptable_fraction: float = 1,
                dct_method: str = "") -> np.ndarray:
    """uint8 ``[height, width, channels]`` of a JPEG file: ``channels`` 0 keeps the file's
    (1 or 3), 1 makes grey, 3 RGB. ``ratio`` (1, 2, 4, 8) downscales; the other arguments
    are accepted for TensorFlow's signature (libjpeg's defaults apply)."""
    count = _channels(channels, (0, 1, 3))
    if ratio not in (1, 2, 4, 8):
        raise InvalidArgumentError(f"ratio must be 1, 2, 4 or 8, got {ratio}")
    picture = _open(contents, ("JPEG",))
    if ratio != 1:
        picture.draft(picture.mode, (picture.width // ratio, picture.height // ratio))
    return _array(picture, count)


def _png_grey(picture: Any) -> np.ndarray:
    """A colour PNG in grey as libpng makes it for TensorFlow (its fixed-point weights of
    0.299, 0.587 and the rest, truncated), alpha dropped."""
    rgb = _array(picture, 3).astype(np.int64)
    grey = (rgb[..., 0] * 9797 + rgb[..., 1] * 19234 + rgb[..., 2] * 3737) >> 15
    return grey.astype(np.uint8)[..., None]


def decode_png(contents: Any, channels: int = 0, dtype: Any = np.uint8) -> np.ndarray:
    """``[height, width, channels]`` of a PNG file, uint8 or uint16 (``dtype``): ``channels``
    0 keeps the file's (1-4), 1 grey, 3 RGB, 4 RGBA."""
    count = _channels(channels, (0, 1, 3, 4))
    out = np.dtype(dtype)
    if out not in (np.uint8, np.uint16):
        raise InvalidArgumentError(f"dtype must be uint8 or uint16, got {out}")
    picture = _open(contents, ("PNG",))
    array = _png_grey(picture) if count == 1 and _file_channels(picture) >= 3 else \
        _array(picture, count)
    if out == np.uint16 and array.dtype == np.uint8:
        return array.astype(np.uint16) * 257
    if out == np.uint8 and array.dtype == np.uint16:
        return (array // 257).astype(np.uint8)
    return array


def decode_bmp(contents: Any, channels: int = 0) -> np.ndarray:
    """uint8 ``[height, width, channels]`` of a BMP file (``channels`` 0, 3 or 4)."""
    count = _channels(channels, (0, 3, 4))
    return _array(_open(contents, ("BMP",)), count)


def decode_gif(contents: Any) -> np.ndarray:
    """uint8 ``[frames, height, width, 3]``: each frame of a GIF as it is shown."""
    from PIL import ImageSequence

    picture = _open(contents, ("GIF",))
    frames = [np.asarray(frame.convert("RGB"), dtype=np.uint8)
              for frame in ImageSequence.Iterator(picture)]
    return np.stack(frames)


def decode_image(contents: Any, channels: int | None = None, dtype: Any = np.uint8,
                 expand_animations: bool = True) -> np.ndarray:
    """A JPEG, PNG, GIF or BMP file by its content: ``[height, width, channels]`` (a GIF
    ``[frames, height, width, 3]``, or its first frame if not ``expand_animations``), in
    ``dtype`` (uint8, uint16, or a float type scaled to [0, 1])."""
    from convoy._ops.image import convert_image_dtype

    count = _channels(channels, (0, 1, 3, 4))
    picture = _open(contents, ("JPEG", "PNG", "GIF", "BMP"))
    kind = picture.format
    if kind == "GIF":
        array = decode_gif(contents)
        array = array if expand_animations else array[0]
        if count == 1:
            raise InvalidArgumentError("channels must be 0, 3 or 4 for a GIF, got 1")
    else:
        array = _array(picture, count)
    out = np.dtype(dtype)
    if kind == "PNG" and out == np.uint16:
        return decode_png(contents, count, np.uint16)
    return convert_image_dtype(array, out)


def _image(image: Any, allowed: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] not in allowed:
        raise InvalidArgumentError(f"image must be [height, width, channels] with channels in "
                                   f"{list(allowed)}, got shape {list(array.shape)}")
    return array


def encode_jpeg(image: Any, format: str = "", quality: int = 95, progressive: bool = False,
                optimize_size: bool = False, chroma_downsampling: bool = True,
                density_unit: str = "in", x_density: int = 300, y_density: int = 300,
                xmp_metadata: str = "") -> bytes:
    """The JPEG file of a uint8 ``[height, width, 1 or 3]`` image."""
    array = _image(image, (1, 3))
    if array.dtype != np.uint8:
        raise InvalidArgumentError(f"image must be uint8, got dtype {array.dtype}")
    if not 0 <= int(quality) <= 100:
        raise InvalidArgumentError(f"quality must be in [0, 100], got {quality}")
    picture = _pil().fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    out = io.BytesIO()
    dpi = (x_density, y_density) if density_unit == "in" else None
    picture.save(out, "JPEG", quality=int(quality), progressive=progressive,
                 optimize=optimize_size, subsampling=2 if chroma_downsampling else 0,
                 **({"dpi": dpi} if dpi else {}))
    return out.getvalue()


def encode_png(image: Any, compression: int = -1) -> bytes:
    """The PNG file of a uint8 or uint16 ``[height, width, 1-4]`` image (``compression`` 0-9,
    -1 for the default)."""
    array = _image(image, (1, 2, 3, 4))
    if array.dtype not in (np.uint8, np.uint16):
        raise InvalidArgumentError(f"image must be uint8 or uint16, got dtype {array.dtype}")
    if not -1 <= int(compression) <= 9:
        raise InvalidArgumentError(f"compression must be in [-1, 9], got {compression}")
    image_module = _pil()
    if array.dtype == np.uint16:
        if array.shape[2] != 1:
            raise InvalidArgumentError("a uint16 PNG is written from one channel here")
        picture = image_module.fromarray(np.ascontiguousarray(array[:, :, 0]))
    else:
        picture = image_module.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    out = io.BytesIO()
    picture.save(out, "PNG", compress_level=6 if compression == -1 else int(compression))
    return out.getvalue()
