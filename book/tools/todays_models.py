"""Chapter 13's trained comparison (:mod:`posenc.lab.hybrid_study`): five four-layer models (RoPE, causal NoPE, the
3:1 hybrid, RNoPE-SWA and windowed RoPE) on chapter 11's two tasks and copy-after-the-first-marker, with its five
seeds, written to ``posenc/lab/data/todays_models.json`` with the config and every seed's numbers; with ``--part
budget``, the 3x-budget check (:func:`posenc.lab.hybrid_study.train_budget`) to ``todays_models_budget.json``; with
``--part controls``, the marker task's controls (other RoPE bases, a window as long as the training sequences;
:func:`posenc.lab.hybrid_study.train_controls`) and, in its ``"budget"`` field, fetch and the marker task at θ = 10⁶
with 3x the steps (:func:`posenc.lab.hybrid_study.train_controls_budget`) to ``todays_models_controls.json``.

Usage (what ``make todays-models`` runs)::

    nice -n 10 python -m book.tools.todays_models --threads 1 --output posenc/lab/data/todays_models.json
    nice -n 10 python -m book.tools.todays_models --threads 1 --part budget \
        --output posenc/lab/data/todays_models_budget.json
    nice -n 10 python -m book.tools.todays_models --threads 1 --part controls \
        --output posenc/lab/data/todays_models_controls.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posenc.lab.results import provenance


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--part", choices=("study", "budget", "controls"), default="study")
    parser.add_argument("--output", default=None, help="default: the part's file in posenc/lab/data")
    args = parser.parse_args(argv)
    from posenc.lab import hybrid_study

    train, plan, default = {
        "study": (hybrid_study.train_study, None, hybrid_study.RESULTS_FILE),
        "budget": (hybrid_study.train_budget, hybrid_study.BUDGET_PLAN, hybrid_study.BUDGET_FILE),
        "controls": (hybrid_study.train_controls, hybrid_study.CONTROLS_PLAN, hybrid_study.CONTROLS_FILE),
    }[args.part]
    start = time.perf_counter()
    config, runs = train(threads=args.threads)
    budget = {}
    if args.part == "controls":  # and its 3x-budget part, in the same file
        budget_config, budget_runs = hybrid_study.train_controls_budget(threads=args.threads)
        budget_plan = [[task, list(names)] for task, names in hybrid_study.CONTROLS_BUDGET_PLAN]
        budget["budget"] = hybrid_study.results_record(budget_config, budget_runs, plan=budget_plan)
    seconds = time.perf_counter() - start
    made = provenance(args.threads, "book.tools.todays_models")  # versions and command as every results file
    record = hybrid_study.results_record(
        config,
        runs,
        seconds=round(seconds, 1),
        machine=hybrid_study.machine(args.threads),
        versions=made["versions"],
        command=made["command"],
        **({"plan": [[task, list(names)] for task, names in plan]} if plan else {}),
        **budget,
    )
    output = Path(args.output or f"posenc/lab/data/{default.name}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {output} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
