"""GPU utilisation from NVIDIA's management library, where the driver is there.

nvidia-ml-py is a thin binding of the driver's libnvidia-ml: on a machine
without NVIDIA's driver (a CPU worker) its init fails, once, and every call
here answers None from then on.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger(__name__)


@functools.cache
def _handle():
    try:
        import pynvml

        pynvml.nvmlInit()
        # The process's device 0 is the first of CUDA_VISIBLE_DEVICES; NVML
        # numbers the machine's devices, so map it back when it is a number.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        if visible.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(visible))
        return pynvml.nvmlDeviceGetHandleByUUID(visible)
    except Exception as exc:  # no driver, no device, an old driver: no figure
        log.debug("NVML unavailable: %s", exc)
        return None


def utilization(since: float | None = None) -> int | None:
    """Percent of the time a kernel ran on this process's device: the mean of
    the driver's samples since `since` (seconds since the epoch: the batch's
    start, so the reads, tokenising and writes around the model count as the
    idle time they are), or the last sample period's (1/6 s to 1 s) without
    one or where the driver keeps no samples; None without NVML."""
    handle = _handle()
    if handle is None:
        return None
    import pynvml

    if since is not None:
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(since * 1_000_000)
            )
            values = [int(sample.sampleValue.uiVal) for sample in samples]
            if values:
                return round(sum(values) / len(values))
        except Exception as exc:  # no samples kept (NVML_ERROR_NOT_FOUND), an old driver
            log.debug("NVML samples: %s", exc)
    try:
        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception as exc:
        log.debug("NVML utilisation: %s", exc)
        return None
