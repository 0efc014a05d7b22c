"""The batch runner, a module a phase of one batch.

`batch.run_batch` is the entry (the Celery task `gpuworker.tasks.run_batch`
calls it). In order: `claim` (the batch and its units, under a lease kept
alive by `lease`), `read` (inputs read, hashed and prepared; `prefetch`
prepares the next batch's while the model runs), `run` (the model, split in
halves on device out-of-memory), `write` (a shard a batch or a file a unit,
`threads` for the file work), `check` (every output loaded back before it
counts; outputs a dead worker left are adopted), then the recording, a
campaigns service (campaigns/runs/recording.py). `pipeline` holds a batch
between its model run and its recording, and the finisher thread that
overlaps the two on a CUDA worker.
"""
