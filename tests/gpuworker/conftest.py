from __future__ import annotations

import pytest
import torch

from gpuworker.memory import runtime_facts, work_device


@pytest.fixture
def fresh_device():
    """work_device() and runtime_facts() computed again under this test's settings
    (WORKERS_PER_DEVICE), and torch's thread count put back after it."""
    threads = torch.get_num_threads()
    work_device.cache_clear()
    runtime_facts.cache_clear()
    yield
    torch.set_num_threads(threads)
    work_device.cache_clear()
    runtime_facts.cache_clear()
