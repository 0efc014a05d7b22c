"""What each processor accepts, checks and costs, known without importing torch:
the web form and the CLI validate parameters with it, the worker loads by it."""
