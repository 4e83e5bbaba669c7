"""How many model-driven TPE trials reach within 1% of the exhaustive optimum.

Usage:
    python runners/benchmarks/bench_search.py [--dataset ogbn-papers100M] [--machine perlmutter]
        [--gpus 8..4096] [--trials 60] [--seeds 8] [--snap 128] [--encoding sizes]

For each objective (epoch, gpu-hours): the exhaustive optimum over every grid of every
G (one vectorized prediction), then for each seed a fresh in-memory study and the
1-based trial at which the best feasible value first came within 1% of it ("-" if
not within --trials), with the model evaluations the search used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="ogbn-papers100M")
    p.add_argument("--machine", default="perlmutter")
    p.add_argument("--gpus", default="8..4096")
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--snap", type=int, default=128, help="model-ranked rounding over this many nearest grids (1 = plain)")
    p.add_argument("--starts", type=int, default=5, help="enqueue the most cubic grid of this many G spread in log scale")
    p.add_argument("--encoding", default="sizes", choices=("sizes", "uv"))
    p.add_argument("--objectives", default="epoch,gpu-hours")
    args = p.parse_args(argv)

    import optuna

    from plexus_tune.model.machine import load_machine
    from plexus_tune.search import (
        ModelEvaluator, Objective, SearchSpace, spread_starts, warm_start, exhaustive_frame, make_sampler, objective_unit, parse_gpus, trials_to_reach,
    )
    from plexus_tune.model.workload import workload_from_dataset

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = workload_from_dataset(args.dataset)
    machine = load_machine(args.machine)
    space = SearchSpace(parse_gpus(args.gpus), encoding=args.encoding)
    model = ModelEvaluator(workload, machine)
    t0 = time.perf_counter()
    frame = exhaustive_frame(space, model)
    t_exh = time.perf_counter() - t0
    print(f"{args.dataset} on {machine.name}, G in {args.gpus}: {len(frame)} grids "
          f"({int(frame['feasible'].sum())} fit in memory), exhaustive prediction {t_exh:.2f} s")
    print(f"encoding {args.encoding}, snap {args.snap}, {args.starts} spread starts, {args.trials} trials, seeds 0..{args.seeds - 1}")
    failures = 0
    for objective in args.objectives.split(","):
        from plexus_tune.search import objective_value

        frame["value"] = objective_value(frame["total_ms"].to_numpy(), frame["gpus"].to_numpy(), objective)
        feas = frame[frame["feasible"]].sort_values("value")
        opt = float(feas["value"].iloc[0])
        within = int((feas["value"] <= opt + 0.01 * abs(opt)).sum())
        best = feas.iloc[0]
        print(f"\n[{objective}] exhaustive optimum {best['grid']} (G={int(best['gpus'])}): {opt:.6g} {objective_unit(objective)}; "
              f"epoch {best['total_ms']:.2f} ms, {best['memory_gib']:.1f} GiB; {within} configuration(s) within 1%")
        reached = []
        for seed in range(args.seeds):
            study = optuna.create_study(direction="minimize", sampler=make_sampler(seed))
            obj = Objective(space, model, objective, snap_neighbours=args.snap)
            warm_start(study, space, spread_starts(space, args.starts))
            t0 = time.perf_counter()
            study.optimize(obj, n_trials=args.trials)
            dt = time.perf_counter() - t0
            vals = [t.value for t in study.trials]
            feasible = [t.user_attrs.get("memory_excess_gib", 0.0) <= 0 for t in study.trials]
            # within 1% in absolute terms of |opt| (the same as value <= 1.01 opt for a positive optimum)
            shifted = [None if v is None else (v - opt) / abs(opt) + 1.0 for v in vals]
            n = trials_to_reach(shifted, 1.0, 0.01, feasible)
            reached.append(n)
            print(f"  seed {seed}: trials to 1% = {n if n else '-':>3}  best {study.best_trial.user_attrs['config']:>10} "
                  f"{study.best_value:.6g}  model evaluations {obj.model_evaluations + obj.evaluations}  {dt:.1f} s")
        ok = [n for n in reached if n]
        failures += len(reached) - len(ok)
        med = statistics.median([n if n else args.trials + 1 for n in reached])
        print(f"  reached 1% within {args.trials} trials: {len(ok)}/{len(reached)} seeds; median trials {med:g}"
              f"{'' if med <= args.trials else ' (> trials)'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
