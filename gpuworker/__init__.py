"""Everything that touches PyTorch. Imported by workers and model-running commands only."""
