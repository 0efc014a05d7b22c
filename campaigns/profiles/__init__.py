"""Batch-size profiles without torch: the sample of the hardest inputs, the
corpus's costs, memory tiers, the estimate, the report and its charts, and the
Advisor interface through which portal turns measured figures into rental advice."""
