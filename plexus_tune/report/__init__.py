"""The report stage: predicted against observed (docs/architecture.md, "Report").

:mod:`~plexus_tune.report.metrics` scores predictions against observations (Spearman,
regret, MAPE, median ratio, R^2 about y = x), :mod:`~plexus_tune.report.validation`
validates a profile on logged runs (leave one grid choice problem out) and
:mod:`~plexus_tune.report.figures` draws figures from runs tables, the cost model and
search trials. Everything takes plain data (runs tables, DataFrames, profiles).
"""
