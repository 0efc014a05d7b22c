"""Memory of the device a batch ran on: allocated vs reserved on CUDA, RSS on CPU."""

from __future__ import annotations

import functools
import resource
import subprocess

import torch


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def cpu() -> torch.device:
    return torch.device("cpu")


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def device_and_dtype(dtype_name: str) -> tuple[torch.device, torch.dtype]:
    """The CUDA device when there is one; half precision only there."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = _DTYPES[dtype_name]
    if dtype != torch.float32 and device.type != "cuda":
        raise ValueError(
            f"dtype {dtype_name} needs a CUDA worker; this worker runs on the CPU "
            "(make a parameter version with dtype float32)"
        )
    return device, dtype


class MemoryProbe:
    def __init__(self, device: torch.device):
        self.device = device

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def snapshot(self) -> dict:
        # The host process's RSS on every device: on CUDA, decoding and
        # tokenising still live in host memory, and a host leak kills the
        # worker as surely as a device one.
        # ru_maxrss is the process peak in KiB on Linux; the kernel updates it
        # lazily, so it can lag the current RSS by a little.
        rss = _rss_bytes()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        host = {"rss": rss, "peak_rss": max(rss, peak)}
        if self.device.type == "cuda":
            return {
                "device": torch.cuda.get_device_name(self.device),
                "allocated": torch.cuda.memory_allocated(self.device),
                "reserved": torch.cuda.memory_reserved(self.device),
                "peak_allocated": torch.cuda.max_memory_allocated(self.device),
                "peak_reserved": torch.cuda.max_memory_reserved(self.device),
                **host,
            }
        return {"device": "cpu", **host}


@functools.cache
def _driver_version() -> str:
    # torch does not expose the driver; nvidia-smi ships with it.
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


@functools.cache
def runtime_facts() -> dict:
    facts = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        facts["cuda"] = torch.version.cuda
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["device"] = torch.cuda.get_device_name(0)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        facts["driver"] = _driver_version()
    facts["threads"] = torch.get_num_threads()
    return facts


def release_cached(device: torch.device) -> None:
    """Give freed memory back, so the next measurement starts from the baseline:
    the CUDA caching allocator's blocks, or glibc's free heap pages on CPU."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS may stay at its high-water mark


class StepMemory:
    """Peak memory of one step: allocated and reserved on CUDA; on CPU, the
    process RSS sampled every millisecond by a thread (RSS has no peak reset)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_allocated = self.peak_reserved = 0
        self._stop = None

    def __enter__(self) -> StepMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        import threading

        self._stop = threading.Event()
        self.peak_reserved = _rss_bytes()

        def sample() -> None:
            while not self._stop.wait(0.001):
                self.peak_reserved = max(self.peak_reserved, _rss_bytes())

        self._thread = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_allocated = torch.cuda.max_memory_allocated(self.device)
            self.peak_reserved = torch.cuda.max_memory_reserved(self.device)
            return
        self._stop.set()
        self._thread.join()
        self.peak_reserved = max(self.peak_reserved, _rss_bytes())
        self.peak_allocated = self.peak_reserved


def allocated_now(device: torch.device) -> int:
    """What the program keeps alive: allocated on CUDA, RSS after a trim on CPU."""
    release_cached(device)
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _rss_bytes()


def device_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None
