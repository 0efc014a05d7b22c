"""Every hand-written SQL statement of the app, fenced here: the counter triggers
(counters.py), the import's staging table, the pages' hottest reads, the worker's
per-batch statements, set-based inserts and updates. The rest of the app uses the ORM."""
