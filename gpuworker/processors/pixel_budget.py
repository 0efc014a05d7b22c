"""How many decoded pixels an image processor holds at once in a worker process.

Two budgets of settings.IMAGE_PIXEL_BUDGET pixels each (docs/processors.md,
"Memory"):

- `working`: images being decoded, transformed, encoded or checked. The
  runner's reader threads, its writer and its check threads each take their
  image's pixels before the work and give them back after it, waiting while
  the others hold too many; an image larger than the budget waits until
  nothing else is held and goes alone.
- `kept`: images kept decoded between a batch's reading and its writing (a
  thumbnail made as its input was read, a small input to enlarge). Taken
  without waiting — a batch's readers cannot wait for its writer, which only
  starts once they are done — and given back when the image is let go of; an
  image that does not fit is kept as its file's bytes instead, and decoded
  again when its output is made.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator

from django.conf import settings


class PixelBudget:
    def __init__(self) -> None:
        self._forget()
        # A process forked from this one (a pool child) has none of its threads.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self.used = 0
        # Reentrant: a kept image's finalizer gives its pixels back from
        # whichever thread lets go of it, possibly inside `keep` itself
        # (a garbage collection that runs there).
        self._cond = threading.Condition(threading.RLock())

    @property
    def limit(self) -> int:
        return int(settings.IMAGE_PIXEL_BUDGET)

    @contextlib.contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        """Wait until `pixels` fit beside what others hold (or nothing else
        is held), hold them while the block runs. Nothing to hold (an image
        made already, a file that is no image) waits for nothing."""
        with self._cond:
            self._cond.wait_for(
                lambda: not pixels or not self.used or self.used + pixels <= self.limit
            )
            self.used += pixels
        try:
            yield
        finally:
            self._give_back(pixels)

    def keep(self, image: object, pixels: int) -> bool:
        """Count `image`'s pixels until it is let go of, if they fit now; False
        (nothing counted) if they do not."""
        with self._cond:
            if self.used + pixels > self.limit:
                return False
            self.used += pixels
        weakref.finalize(image, self._give_back, pixels)
        return True

    def _give_back(self, pixels: int) -> None:
        with self._cond:
            self.used -= pixels
            self._cond.notify_all()


working = PixelBudget()
kept = PixelBudget()
