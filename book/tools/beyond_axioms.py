"""``make beyond-axioms``: chapter 14's study (:mod:`posenc.lab.beyond_axioms`), written to its committed file.

Usage (``--budget-only`` remakes only ``"budget"`` in an existing file)::

    nice -n 10 python -m book.tools.beyond_axioms --output posenc/lab/data/beyond_axioms.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posenc.lab import beyond_axioms as study


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(study.RESULTS_FILE))
    parser.add_argument("--names", default=None, help="comma-separated encoding names (default: all)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: chapter 11's five)")
    parser.add_argument(
        "--budget-only",
        action="store_true",
        help='remake only the budget check and ALiBi\'s fixed slopes ("budget") in --output',
    )
    args = parser.parse_args(argv)
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
        record["budget"] = study.budget_check(record["names"], progress=progress)
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
    budget = study.budget_check(names, progress=progress)
    record = study.record(names, config, result, control, budget)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.output} ({result['seconds']:.0f} s for k = 2, {control['seconds']:.0f} s for k = 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
