"""Where outputs go and how they are written: path functions, atomic writes,
output checks, vector shards, training checkpoints on disk."""
