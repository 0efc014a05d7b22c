"""The text embedding's model replaced by an instant stand-in, for benchmarks of
everything around it (claims, reads, shards, checks, recording).

    TextEmbeddingProcessor.embed = instant_embed(np.random.default_rng(0))
"""

from __future__ import annotations

# Rows drawn once; a batch's vectors are rows of this pool, each made unique.
POOL_ROWS = 4096


def instant_embed(rng):
    """An `embed` that returns distinct unit vectors at once.

    Drawing fresh normals for every batch costs about as much as some of the
    host work being measured (~0.01 ms a unit), so the stand-in copies rows of
    a pool drawn once from `rng`; each pass through the pool adds one to the
    first value, so every vector of the run is distinct (the duplicate check
    would flag repeats) once normalised. A process that forks
    may reseed `rng` in place: the pool is drawn on the first call.
    """
    import numpy as np

    from gpuworker.processors import text_embedding

    pool: list[np.ndarray] = []
    made = [0]  # vectors handed out so far

    def embed(self, items):
        if not pool:
            drawn = rng.standard_normal((POOL_ROWS, 384)).astype(np.float32)
            pool.append(drawn / np.linalg.norm(drawn, axis=1, keepdims=True))
        n = len(items)
        serial = np.arange(made[0], made[0] + n)
        made[0] += n
        vectors = pool[0][serial % POOL_ROWS]  # a copy: fancy indexing
        vectors[:, 0] += (serial // POOL_ROWS).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return text_embedding.EmbeddingBatch(
            vectors=vectors,
            norms=np.ones(n),
            input_tokens=[50] * n,
            real_tokens=50 * n,
            padded_tokens=60 * n,
            seconds=0.0,
            memory=self.probe.snapshot(),
        )

    return embed
