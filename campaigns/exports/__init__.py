"""What a campaign produced, as files: the inventory (manifest, results, errors,
batches), image predictions and features, streamed CSV."""
