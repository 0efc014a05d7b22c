"""A tiny Whisper-style model and its processor, made by a test and saved to
a folder: the speech-to-text processor loads it through the user's path
(AutoModelForSpeechSeq2Seq, AutoProcessor). Random weights: tests check the
path (chunks, segments and their times, determinism, flags), not accuracy."""

from __future__ import annotations

from pathlib import Path

LANGUAGES = ("en", "fr")
SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    *(f"<|{code}|>" for code in LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]


def tiny_whisper(folder: Path, *, seed: int = 0) -> Path:
    """A 2-layer Whisper of width 32 over a byte-level BPE with Whisper's
    special and timestamp tokens, saved with its feature extractor."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Whisper's layout: the timestamp tokens right after <|notimestamps|>
    # (generate takes every id past it as a time), then the words.
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIALS) + len(stamps) + 120,
        special_tokens=[*SPECIALS, *stamps],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    end = "<|endoftext|>"
    fast = WhisperTokenizerFast(
        tokenizer_object=tokenizer, bos_token=end, eos_token=end, unk_token=end, pad_token=end
    )
    ids = {token: fast.convert_tokens_to_ids(token) for token in SPECIALS}
    common = {
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "eos_token_id": ids[end],
        "pad_token_id": ids[end],
        "bos_token_id": ids[end],
    }
    config = WhisperConfig(
        vocab_size=len(fast),
        num_mel_bins=80,
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=1500,
        max_target_positions=448,
        init_std=0.5,
        **common,
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        **common,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        is_multilingual=True,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        max_initial_timestamp_index=50,
        begin_suppress_tokens=[],
        suppress_tokens=[],
        max_length=448,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    WhisperProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=fast
    ).save_pretrained(folder)
    return folder
