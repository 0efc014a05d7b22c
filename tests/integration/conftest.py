from __future__ import annotations

import pytest

from tests.worker import Worker, purge_queue


@pytest.fixture
def start_worker(transactional_db, output_root, tmp_path):
    """Start real `celery worker` processes on the configured database and broker."""
    purge_queue()
    workers: list[Worker] = []

    def start(**kwargs) -> Worker:
        worker = Worker(tmp_path / f"worker-{len(workers)}.log", **kwargs)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
