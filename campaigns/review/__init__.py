"""Quality control: flag rules, the review queue and its decisions, checkpoints,
the holdout, and what a person sees of one unit."""
