"""WORKERS_PER_DEVICE: each of N processes on one device keeps to its share of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from campaigns.models import Profile
from gpuworker.memory import runtime_facts, work_device
from gpuworker.profiler import record_device

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


def test_processes_sharing_the_cpu_take_their_share_of_the_cores(
    settings, monkeypatch, fresh_device
):
    settings.WORKERS_PER_DEVICE = 2
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    device = work_device()

    assert device.type == "cpu"
    assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) // 2)
    facts = runtime_facts()
    assert facts["workers_per_device"] == 2
    assert facts["threads"] == torch.get_num_threads()


def test_omp_num_threads_wins_over_the_share(settings, monkeypatch, fresh_device):
    settings.WORKERS_PER_DEVICE = 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)

    work_device()

    assert torch.get_num_threads() == 3


@pytest.mark.django_db
def test_a_profile_measures_against_its_share_of_the_budget_and_says_so(settings, fresh_device):
    settings.WORKERS_PER_DEVICE = 2
    settings.PROFILE_CPU_MEMORY_BUDGET_MB = 8192
    profile = Profile()

    budget = record_device(profile, torch.device("cpu"))

    assert budget == profile.memory_budget == 4096 * MiB
    assert (
        profile.runtime["budget_source"] == "PROFILE_CPU_MEMORY_BUDGET_MB ÷ 2 (WORKERS_PER_DEVICE)"
    )
    assert profile.runtime["workers_per_device"] == 2
    # a budget given for the profile is what it says, not shared again
    given = Profile(memory_budget=1000 * MiB)
    assert record_device(given, torch.device("cpu")) == 1000 * MiB
    assert given.runtime["budget_source"] == "given"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_process_sharing_a_gpu_is_refused_past_its_share():
    # In a process of its own: the allocator's cap stays with that process.
    code = (
        "import django, torch; django.setup()\n"
        "from gpuworker.memory import device_memory, work_device\n"
        "device = work_device()\n"
        "share = device_memory(device)\n"
        "total = torch.cuda.get_device_properties(device).total_memory\n"
        "assert share == total // 2, (share, total)\n"
        "kept = torch.empty(int(share * 0.8), dtype=torch.uint8, device=device)\n"
        "try:\n"
        "    torch.empty(int(share * 0.4), dtype=torch.uint8, device=device)\n"
        "except torch.OutOfMemoryError:\n"
        "    print('refused past the share')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "WORKERS_PER_DEVICE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused past the share" in result.stdout
