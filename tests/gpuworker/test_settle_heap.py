"""A worker's loaded model and libraries are kept out of Python's full
garbage collections (gpuworker.processors.settle_heap): a full collection
over them is a pause of ~0.1 s in the middle of a batch."""

from __future__ import annotations

import gc
import weakref

from campaigns.specs.builtin import TEXT_EMBEDDING
from gpuworker.processors import forget_loaded, get_processor, settle_heap


def test_a_loaded_model_is_not_walked_by_a_full_collection():
    forget_loaded()
    gc.unfreeze()
    try:
        get_processor("text-embedding", TEXT_EMBEDDING.clean({"max_tokens": 16}))
        # The model's modules, parameters and the libraries' objects are frozen.
        assert gc.get_freeze_count() > 10_000
        assert len(gc.get_objects(generation=2)) < gc.get_freeze_count() / 10
    finally:
        forget_loaded()
        gc.unfreeze()


class _Cycle:
    def __init__(self):
        self.me = self


def test_what_was_frozen_and_let_go_is_freed_at_the_next_settling():
    gc.unfreeze()
    try:
        held = _Cycle()
        gone = weakref.ref(held)
        settle_heap()  # frozen while held, as a model in the cache
        del held  # the cache lets it go: only its own cycle holds it now
        gc.collect()
        assert gone() is not None  # a frozen cycle is not collected …
        settle_heap()  # … until the next model loads
        assert gone() is None
    finally:
        gc.unfreeze()
