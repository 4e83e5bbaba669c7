"""Fit machine-profile parameters from measurement logs, scikit-learn style: each ``fit_*`` takes a
DataFrame and returns a model with ``predict``, ``scores`` and ``to_dict`` (``fit/spmm``,
``fit/collectives``, ``fit/gemm``, ``fit/epoch``, ``fit/quant``); ``fit/profile.fit_profile``
turns logs into a whole machine profile (see docs/architecture.md)."""
