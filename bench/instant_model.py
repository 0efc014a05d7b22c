"""The text embedding's model replaced by an instant stand-in, for benchmarks of
everything around it (claims, reads, shards, checks, recording).

    TextEmbeddingProcessor.embed = instant_embed(np.random.default_rng(0))
"""

from __future__ import annotations


def instant_embed(rng):
    """An `embed` that returns random unit vectors drawn from `rng` at once (a
    process that forks may reseed `rng` in place: the stand-in draws from it)."""
    import numpy as np

    from gpuworker.processors import text_embedding

    def embed(self, items):
        vectors = rng.standard_normal((len(items), 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return text_embedding.EmbeddingBatch(
            vectors=vectors,
            norms=np.ones(len(items)),
            input_tokens=[50] * len(items),
            real_tokens=50 * len(items),
            padded_tokens=60 * len(items),
            seconds=0.0,
            memory=self.probe.snapshot(),
        )

    return embed
