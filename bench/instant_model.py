"""The text embedding's model replaced by an instant stand-in, for benchmarks of
everything around it (claims, reads, shards, checks, recording).

    TextEmbeddingProcessor.embed = instant_embed(np.random.default_rng(0))
"""

from __future__ import annotations

import os

# Rows drawn once; a batch's vectors are rows of this pool, each made unique.
POOL_ROWS = 4096


def instant_embed(rng):
    """An `embed` that returns distinct unit vectors at once.

    Drawing fresh normals for every batch costs about as much as some of the
    host work being measured (~0.01 ms a unit), so the stand-in copies rows of
    a pool drawn once from `rng`; each pass through the pool adds one to the
    first value, so every vector of the run is distinct (the duplicate check
    would flag repeats) once normalised. A process forked after the first call
    draws a pool of its own on its first call, from `rng` as it reseeded it in
    place: forked processes' vectors do not repeat each other's.
    """
    import numpy as np

    from gpuworker.processors import text_embedding

    drawn: dict = {}  # the process that drew the pool, the pool, vectors handed out

    def embed(self, items):
        if drawn.get("pid") != os.getpid():  # the first call, or the first after a fork
            pool = rng.standard_normal((POOL_ROWS, 384)).astype(np.float32)
            drawn.update(
                pid=os.getpid(), pool=pool / np.linalg.norm(pool, axis=1, keepdims=True), made=0
            )
        n = len(items)
        serial = np.arange(drawn["made"], drawn["made"] + n)
        drawn["made"] += n
        vectors = drawn["pool"][serial % POOL_ROWS]  # a copy: fancy indexing
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
