"""Memory of the device a batch ran on: allocated vs reserved on CUDA, RSS on CPU;
and how the process hands large blocks of host memory back once freed."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import subprocess

import torch
from django.conf import settings

from campaigns.runs.memory_errors import facts_at_failure
from campaigns.specs.software import software_versions


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


#: glibc's mallopt parameter: allocations of at least this many bytes get
#: pages of their own, unmapped when freed.
_M_MMAP_THRESHOLD = -3
MAP_ALLOCATIONS_FROM = 4 * 2**20


@functools.cache
def map_large_allocations() -> bool:
    """Give large allocations pages of their own, handed back to the system
    when freed (glibc's mmap threshold, fixed at MAP_ALLOCATIONS_FROM).

    By default glibc raises that threshold to the size of the first large
    block freed (up to 32 MiB), and later blocks of that size come from
    the allocating thread's heap and stay there once freed: a decoded
    image (Pillow's 16 MiB blocks) freed by a check thread stayed in that
    thread's heap, and the next large image of another thread came on top,
    so the image transform's peak grew with the threads that had touched a
    large image (bench/RESULTS.md, "Bounded memory on huge inputs and
    outputs"). False where the C library has no mallopt (not glibc).
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MAP_ALLOCATIONS_FROM))


def cpu() -> torch.device:
    return torch.device("cpu")


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def workers_per_device() -> int:
    return settings.WORKERS_PER_DEVICE


@functools.cache
def work_device() -> torch.device:
    """The device this process computes on (CUDA when there is one), its share taken.

    WORKERS_PER_DEVICE processes may feed one device: a batch's host work
    (reads, tokenising, writes, recording) runs under its process's GIL, and on
    a fast GPU it takes longer than the model (bench/RESULTS.md, "Two processes
    feed the device (`WORKERS_PER_DEVICE`) (2026-12-01)"), so a second
    process keeps the device busy meanwhile. Each keeps to its share: on CUDA
    the caching allocator refuses past 1/N of the memory, so a big batch in one
    process meets an out-of-memory split in that process instead of crashing
    the other; on the CPU each takes 1/N of the cores for torch's threads
    (unless OMP_NUM_THREADS says), as two processes with all the cores each
    run slower than one.
    """
    share = workers_per_device()
    if torch.cuda.is_available():
        if share > 1:
            torch.cuda.set_per_process_memory_fraction(1 / share)
        return torch.device("cuda")
    if share > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // share))
    return torch.device("cpu")


def device_and_dtype(dtype_name: str) -> tuple[torch.device, torch.dtype]:
    """The CUDA device when there is one; half precision only there."""
    device = work_device()
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
    work_device()  # its thread count, on the CPU
    facts = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        facts["cuda"] = torch.version.cuda
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["device"] = torch.cuda.get_device_name(0)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        facts["driver"] = _driver_version()
    facts["threads"] = torch.get_num_threads()
    facts["workers_per_device"] = workers_per_device()
    # The worker's own packages: a version records the portal's, and a worker
    # installed apart from it could differ.
    software = software_versions()
    facts.update({name: software[name] for name in _WORKER_PACKAGES})
    return facts


_WORKER_PACKAGES = ("transformers", "tokenizers", "pillow", "numpy", "git_commit")


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


def at_failure(error: str, *, tried: list[int], alone: bool) -> dict:
    """What an out-of-memory failure leaves on its attempt (`metrics["oom"]`):
    torch's message and its figures, with torch's own counters on CUDA for
    what the message does not say, the batch sizes tried, and how the process
    shares its device. Called while the failed pass's tensors still live, so
    allocated is what the failing pass held."""
    measured: dict[str, int | None] = {}
    device = work_device()
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            measured = {
                "allocated": torch.cuda.memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device),
                "free": free,
                "total": total,
            }
        except RuntimeError:
            # The counters only add to the message: a device left in a bad
            # state must not turn the unit's out_of_memory into another error.
            measured = {}
    return facts_at_failure(
        error,
        measured,
        tried=tried,
        alone=alone,
        workers_per_device=workers_per_device(),
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    )


def device_memory(device: torch.device) -> int | None:
    """This process's share of the device's memory (None on the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // workers_per_device()
    return None
