"""Measurements: typed records and their log, trainer campaigns and microbenchmarks
(see docs/records.md)."""
