"""A worker's loaded model and libraries are kept out of Python's full
garbage collections (common.heap.settle_heap): a full collection
over them is a pause in the middle of a batch (bench/RESULTS.md, "A batch's
rows as one JSON document (2026-12-04)")."""

from __future__ import annotations

import gc
import weakref

from campaigns.specs.builtin import TEXT_EMBEDDING
from common.heap import settle_heap
from gpuworker.processors import forget_loaded, get_processor


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


def test_a_model_the_cache_lets_go_is_freed_though_it_holds_itself(settings):
    """The loaded-processor cache keeps four: the fifth load lets the first
    go. A model that refers to itself (a hook that is its own method, as the
    image classifier's) is freed then, not kept frozen with the heap."""
    from campaigns.specs import processors as processor_specs
    from gpuworker import processors

    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.paced_text.SPEC"]
    processor_specs._registry.cache_clear()
    forget_loaded()
    spec = processor_specs.get_spec("paced-text")
    try:
        first = get_processor("paced-text", spec.clean({"ms_per_batch": 0}))
        first.me = first  # a cycle: only the collector frees it
        gone = weakref.ref(first)
        del first
        for ms in range(1, 5):
            get_processor("paced-text", spec.clean({"ms_per_batch": ms}))
        assert processors._load.cache_info().currsize == 4
        assert gone() is None
    finally:
        forget_loaded()
        processor_specs._registry.cache_clear()
        gc.unfreeze()
