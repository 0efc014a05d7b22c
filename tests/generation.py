"""A tiny causal language model and its tokenizer, made by a test and saved
to a folder: the text-generation processor loads it through the user's path
(a local Hugging Face folder, AutoModelForCausalLM). Random weights: tests
check the path (shapes, determinism, stops, flags), not the text's sense."""

from __future__ import annotations

from pathlib import Path

WORDS = "the quick brown fox jumps over the lazy dog while a cat sleeps in the sun"
#: A chat template of the usual shape: system and user turns, then the assistant's cue.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def tiny_causal_lm(
    folder: Path,
    *,
    chat: bool = False,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    pad: bool = True,
) -> Path:
    """A Llama (2 layers of hidden size 32 unless told) over a byte-level BPE
    of ~300 tokens (any text tokenizes), saved with tokenizer.json; `chat`:
    with a chat template; `pad=False`: a tokenizer without a pad token (the
    processor pads with the end token, as many models need).
    bench/generation.py makes a larger one the same way."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([WORDS] * 10, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        **({"pad_token": "<pad>"} if pad else {}),
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0 if pad else None,
        # Wide weights: the logits of a random model are far apart, so greedy
        # picks are not decided by float noise.
        initializer_range=0.5,
    )
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def written_completion(output_root, unit) -> dict:
    """The completion a unit's output path names: a line of its batch's row
    shard (or a file of its own), as every reader reads it."""
    from campaigns.storage.row_shards import RowReader

    record = RowReader(output_root, 1 << 20).record(unit.output_path, unit.uid)
    assert isinstance(record, dict)
    return record


def damage_line(output_root, unit) -> None:
    """One unit's line of its batch's shard made to fail its check (a
    finish_reason no worker writes); the other lines stay as written."""
    import json

    from campaigns.storage.vector_shards import split_member

    file_rel, row = split_member(unit.output_path)
    assert row is not None
    path = Path(output_root) / file_rel
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[row])
    record["finish_reason"] = "eaten"
    lines[row] = json.dumps(record).encode()
    path.write_bytes(b"\n".join(lines))
