"""Adaptation (fine-tuning) campaigns: start, stop and resume a training, use a checkpoint,
and draw its curves. The training loops themselves are gpuworker's (torch)."""
