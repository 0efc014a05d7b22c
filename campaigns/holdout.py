"""The holdout: a deterministic share of units kept out of profiling and tuning.

Chosen by a hash of the unit id, so the same units are held out on every
import and every machine; reported at the checkpoint and at the end.
"""

from __future__ import annotations

import hashlib


def is_holdout(uid: str, share: float) -> bool:
    if share <= 0:
        return False
    bucket = int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest()[:4], "big")
    return bucket / 2**32 < share
