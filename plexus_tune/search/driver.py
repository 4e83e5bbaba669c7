"""One search study at one communication precision: its name, objective, warm start and trials.

The command line parses its arguments and prints what :func:`run_study` returns; scripts
and notebooks call the same function (docs/architecture.md, Search).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from plexus_tune.errors import Interrupted, UserError
from plexus_tune.search.space import SearchSpace, check_objective
from plexus_tune.search.study import (
    Objective,
    best_configs,
    default_study_name,
    finished_trials,
    open_study,
    run_search,
    spread_starts,
    warm_start,
)


@dataclass
class StudyOutcome:
    """What one study did: its name, the study, trials run now and before, and its best objective value."""

    name: str
    study: object
    ran: int
    before: int
    evaluations: int
    best_value: float | None


def _interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Ctrl-C, or an error raised while handling it (Optuna, stopped while it
    records a trial, fails in its own clean-up)."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__context__ or exc.__cause__, seen + 1
    return False


def check_study_name(name: str | None) -> None:
    """UserError if a study name is given but empty (None: the default name)."""
    if name is not None and not name.strip():
        raise UserError("the study name is empty; give a name, or leave it out for the default name of these settings",
                        parameter="study")


def study_name(dataset: str, machine: str, space: SearchSpace, objective: str, *, measured: bool,
               precision: str = "fp32", name: str | None = None) -> str:
    """``name``, else the default study name of these settings; a reduced precision adds ``-comm-P``."""
    check_study_name(name)
    base = name or default_study_name(dataset, machine, space.gpus, objective, measured, space.block_rows_range)
    return base if precision == "fp32" else f"{base}-comm-{precision}"


@dataclass(frozen=True)
class StudyOptions:
    """One study's settings: its ``name``, ``objective`` and total ``trials`` (a resumed study
    runs only the missing ones); the sampler ``seed``; ``attrs`` stored with it; measured:
    the model's best ``warm_start_k`` configurations first; model-driven: ``starts``
    configurations spread over the space first, each trial the best predicted of the
    ``snap_neighbours`` allowed grids nearest the sampled point; ``show_progress``:
    Optuna's progress bar."""

    name: str
    objective: str
    trials: int
    seed: int | None = None
    attrs: dict | None = None
    warm_start_k: int = 0
    snap_neighbours: int = 0
    starts: int = 0
    show_progress: bool = False

    def __post_init__(self):
        check_study_name(self.name)
        check_objective(self.objective)
        if int(self.trials) < 1:
            raise UserError(f"a study runs at least 1 trial, not {self.trials}", parameter="trials")
        for key in ("warm_start_k", "snap_neighbours", "starts"):
            if int(getattr(self, key)) < 0:
                raise UserError(f"{key} must be at least 0, not {getattr(self, key)}", parameter=key)


def run_study(options: StudyOptions, storage, space: SearchSpace, model, *, measured=None, launcher=None,
              callbacks=None) -> StudyOutcome:
    """Open (or resume) study ``options.name`` and run it until it has ``options.trials`` finished trials.

    Model-driven (``measured`` None): the objective evaluates ``model`` and the study is
    warm-started with ``starts`` configurations spread over the space. Measured
    (``measured`` a :class:`~plexus_tune.search.measured.MeasuredEvaluator`): runs already
    in its log count as trials, and the model's best ``warm_start_k`` configurations are
    tried first; ``launcher`` stays open for every run.
    """
    name, objective, trials = options.name, options.objective, options.trials
    warm_start_k, snap_neighbours, show_progress = options.warm_start_k, options.snap_neighbours, options.show_progress
    study = open_study(name, storage, objective=objective, seed=options.seed, attrs=options.attrs)
    if measured is not None:
        target = Objective(space, measured, objective, study=study, known=measured.known_runs())
        if warm_start_k > 0:
            warm_start(study, space, model.top_k(space, warm_start_k, objective))
    else:
        target = Objective(space, model, objective, study=study, snap_neighbours=snap_neighbours)
        warm_start(study, space, spread_starts(space, options.starts))
    before = len(finished_trials(study))
    try:
        with launcher if launcher is not None else contextlib.nullcontext():
            ran = run_search(study, target, trials, callbacks=callbacks, show_progress=show_progress)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        kept = f"study {name} keeps its {len(finished_trials(study))} finished trials"
        if measured is not None:
            kept += f"; the finished runs are in {measured.log_path}"
        raise Interrupted(kept) from None
    evaluations = target.evaluations if measured is not None else target.evaluations + target.model_evaluations
    best = best_configs(study, 1)
    return StudyOutcome(name, study, ran, before, evaluations, None if best.empty else float(best["value"].iloc[0]))
