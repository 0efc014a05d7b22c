"""Runs: campaign and version setup, weighing and planning batches, sending them,
pause and resume, leases, and recording what a batch produced (the service the
worker calls)."""
