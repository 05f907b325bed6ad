"""What the goldens cannot show: seeded randomness, codecs' round trips, ragged methods,
errors naming their argument."""

import io
import subprocess
import sys

import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError

IMAGE = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)


@pytest.mark.parametrize("name, args", [
    ("stateless_random_crop", ([2, 3, 3],)),
    ("stateless_random_flip_left_right", ()),
    ("stateless_random_flip_up_down", ()),
    ("stateless_random_brightness", (0.3,)),
    ("stateless_random_contrast", (0.5, 1.5)),
])
def test_stateless_ops_repeat_for_a_seed(name: str, args: tuple) -> None:
    fn = getattr(cv.image, name)
    results = {fn(IMAGE, *args, seed=(s, 7)).tobytes() for s in range(8)}
    assert fn(IMAGE, *args, seed=(3, 7)).tobytes() == fn(IMAGE, *args, seed=(3, 7)).tobytes()
    assert len(results) > 1  # different seeds, different draws


def test_random_ops_keep_shape_and_dtype() -> None:
    assert cv.image.random_crop(IMAGE, [2, 2, 3], seed=1).shape == (2, 2, 3)
    batch = np.stack([IMAGE] * 16)
    flipped = cv.image.random_flip_left_right(batch, seed=5)
    kept = [(f == IMAGE).all() for f in flipped]
    assert 0 < sum(kept) < 16  # each image of a batch flips on its own
    assert cv.image.random_brightness(IMAGE, 0.2, seed=1).dtype == np.uint8
    with pytest.raises(InvalidArgumentError, match="seed"):
        cv.image.stateless_random_crop(IMAGE, [2, 2, 3], seed=3)
    with pytest.raises(InvalidArgumentError, match="lower"):
        cv.image.random_contrast(IMAGE, 1.5, 0.5)


def test_png_and_jpeg_round_trip() -> None:
    pytest.importorskip("PIL")
    np.testing.assert_array_equal(cv.io.decode_png(cv.io.encode_png(IMAGE)), IMAGE)
    np.testing.assert_array_equal(cv.io.decode_image(cv.io.encode_png(IMAGE[:, :, :1])),
                                  IMAGE[:, :, :1])
    jpeg = cv.io.encode_jpeg(np.full((8, 8, 3), 128, np.uint8), quality=100)
    assert np.abs(cv.io.decode_jpeg(jpeg).astype(int) - 128).max() <= 1


def test_gif_frames() -> None:
    image = pytest.importorskip("PIL.Image")
    frames = [image.fromarray(np.full((3, 4, 3), v, np.uint8)) for v in (0, 255)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    gif = out.getvalue()
    decoded = cv.io.decode_gif(gif)
    assert decoded.shape == (2, 3, 4, 3) and decoded.dtype == np.uint8
    assert cv.io.decode_image(gif, expand_animations=False).shape == (3, 4, 3)
    with pytest.raises(InvalidArgumentError, match="contents"):
        cv.io.decode_png(gif)


def test_missing_pillow_names_the_extra() -> None:
    code = ("import sys; sys.modules['PIL'] = None; import convoy as cv\n"
            "try: cv.io.decode_png(b'x')\nexcept ImportError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "pip install 'convoy[image]'" in out


def test_ragged_methods() -> None:
    rt = cv.RaggedTensor.from_row_lengths(np.array([1, 2, 3, 4]), [2, 0, 2])
    np.testing.assert_array_equal(rt.row_starts(), [0, 2, 2])
    np.testing.assert_array_equal(rt.row_limits(), [2, 2, 4])
    np.testing.assert_array_equal(rt.value_rowids(), [0, 0, 2, 2])
    assert rt.nrows() == 3
    assert rt.with_values(rt.values * 10).to_list() == [[10, 20], [], [30, 40]]
    nested = cv.ragged.constant([[[1], [2, 3]], [[4]]])
    assert nested.with_flat_values(nested.flat_values + 1).to_list() == [[[2], [3, 4]], [[5]]]
    assert cv.cast(nested, np.float32).dtype == np.float32
    assert cv.gather(rt, [2, 0]).to_list() == [[3, 4], [1, 2]]
    with pytest.raises(InvalidArgumentError, match="new_values"):
        rt.with_values([1, 2])


def test_python_values_take_tensorflows_dtypes() -> None:
    assert cv.stack([1, 2]).dtype == np.int32
    assert cv.concat([[1.5], [2.5]], 0).dtype == np.float32
    assert cv.stack([2 ** 40]).dtype == np.int64
    assert cv.unique([b"b", b"a", b"b"]).y.tolist() == [b"b", b"a"]
    assert cv.strings.length("héllo") == 6 and cv.strings.length("héllo").dtype == np.int32
    assert cv.strings.lower(np.array([b"AB"], dtype="S2")).dtype == object
    assert cv.sparse.to_dense(cv.sparse.from_dense([[0, 2]])).tolist() == [[0, 2]]


@pytest.mark.parametrize("call, argument", [
    (lambda: cv.gather([1, 2], [2]), "indices"),
    (lambda: cv.one_hot([0.5], 3), "indices"),
    (lambda: cv.pad([1, 2], [[3, 0]], mode="REFLECT"), "paddings"),
    (lambda: cv.reshape([1, 2, 3], [2, -1]), "reshape"),
    (lambda: cv.strings.to_number(["x1"]), "x1"),
    (lambda: cv.strings.substr("abc", 5, 1), "pos"),
    (lambda: cv.strings.to_hash_bucket_fast(["a"], 0), "num_buckets"),
    (lambda: cv.image.resize(IMAGE, [2, 2], method="cubic"), "method"),
    (lambda: cv.image.central_crop(IMAGE, 0.0), "central_fraction"),
    (lambda: cv.sparse.to_dense(cv.SparseTensor([[1], [0]], [1, 2], [3])), "sorted"),
])
def test_bad_input_names_the_argument(call, argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=argument):
        call()
