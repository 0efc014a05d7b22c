"""Long-lived objects kept out of Python's cyclic garbage collections.

A full collection walks every object the process tracks. Once a process has
loaded what it keeps for its whole life (Django's apps, URLconf and
templates in a web process; a model and its libraries in a worker) that is
a hundred thousand objects or more, and the pause falls into whichever
request or batch happens to trigger it (bench/RESULTS.md, "A batch's rows as
one JSON document (2026-12-04)" and "The web process's heap settled after its
first request (2026-12-04)"). Frozen (`gc.freeze`), they are not walked again.
"""

from __future__ import annotations

import gc

from django.core.signals import request_finished


def settle_heap() -> None:
    """What the process holds now kept out of the cyclic collections from
    here on. Unfrozen and collected first, so that what was let go since the
    last settling (a model a worker's cache dropped: an image classifier's
    hook makes it a cycle) is freed rather than kept frozen. Whatever else is
    alive at that moment is frozen with it, until the next settling."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def settle_after_first_request() -> None:
    """Settle this process's heap once its first request has been answered:
    that request loads what every later one uses (the URLconf, the
    templates, the caches' first entries). The collection runs after the
    response went out, once a process."""

    def settle(**_: object) -> None:
        request_finished.disconnect(settle)
        settle_heap()

    request_finished.connect(settle, weak=False)
