"""``make beyond-axioms``: chapter 14's studies, each written to its committed file.

``--part counting`` (the default): the counting task (:mod:`posenc.lab.beyond_axioms`); ``--budget-only`` remakes
only ``"budget"`` in an existing file. ``--part state-tracking``: the word problems of S3 and Z6 (and the A5 probe)
(:mod:`posenc.lab.state_tracking`). Usage::

    nice -n 10 python -m book.tools.beyond_axioms --output posenc/lab/data/beyond_axioms.json
    nice -n 10 python -m book.tools.beyond_axioms --part state-tracking --output posenc/lab/data/state_tracking.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posenc.lab import beyond_axioms as study


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("counting", "state-tracking"), default="counting")
    parser.add_argument("--output", default=None, help="the results file (default: the part's committed file)")
    parser.add_argument("--names", default=None, help="comma-separated encoding names (default: all)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: chapter 11's five)")
    parser.add_argument(
        "--budget-only",
        action="store_true",
        help='remake only the budget check and ALiBi\'s fixed slopes ("budget") in --output',
    )
    args = parser.parse_args(argv)
    if args.part == "state-tracking":
        from posenc.lab import state_tracking

        if args.budget_only or args.seeds is not None:
            parser.error("--budget-only and --seeds belong to --part counting")
        output = args.output or str(state_tracking.RESULTS_FILE)
        names = args.names.split(",") if args.names else state_tracking.NAMES
        start = time.perf_counter()
        record = state_tracking.record(names, progress=lambda line: print(line, flush=True))
        Path(output).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {output} ({time.perf_counter() - start:.0f} s)")
        return 0
    args.output = args.output or str(study.RESULTS_FILE)
    names = args.names.split(",") if args.names else study.encoding_names()
    config = (
        study.chapter_config()
        if args.seeds is None
        else study.chapter_config(seeds=tuple(int(s) for s in args.seeds.split(",")))
    )

    from posenc.lab import experiments as ex

    def progress(pair):
        print(
            f"{ex.encoding_label(pair[0].encoding):42s} final loss per seed "
            + " ".join(f"{r.losses[-1]:.3f}" for r in pair),
            flush=True,
        )

    if args.budget_only:
        record = json.loads(Path(args.output).read_text())
        start = time.perf_counter()
        record["budget"] = study.budget_check(record["names"], record["k1"], progress=progress)
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote the budget check into {args.output} ({time.perf_counter() - start:.0f} s)")
        return 0
    result = study.run(names, config, progress=progress)
    print("k = 1 control", flush=True)
    control = study.run(names, config, k=1, progress=progress)
    print(
        f"budget check: {study.BUDGET_STEPS} steps, seeds {study.BUDGET_SEEDS}; ALiBi at slopes {study.ALIBI_SLOPES}",
        flush=True,
    )
    budget = study.budget_check(names, control, progress=progress)
    record = study.record(names, config, result, control, budget)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.output} ({result['seconds']:.0f} s for k = 2, {control['seconds']:.0f} s for k = 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
