"""``make experiments-study``: chapter 11's study (:mod:`posenc.lab.experiments_study`), written to its committed file.

Usage (``--steps`` and ``--seeds`` shrink the plan for a quick try; the committed file uses the defaults)::

    nice -n 10 python -m book.tools.experiments_study --output posenc/lab/data/experiments_study.json

``--only copy-back-budget`` (or ``--only table``, ``--only families``) retrains only the copy-back budget part (or
the chapter's table models, the ``"table"`` part, or the families of xPos, RoPE and the Jordan block,
``"families"``) and writes it into the existing file (the other parts' models do not depend on it, so the file is
what a full run would write).
``--only families --family jordan,jordan-rotation`` retrains those families alone and keeps the file's others.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from pathlib import Path

from posenc.lab import experiments as ex
from posenc.lab import experiments_study as study


def compact_json(record: dict) -> str:
    """``record`` as indented JSON with every list of numbers on one line (the per-sequence counts)."""
    text = json.dumps(record, indent=1)  # a list opens with "[" and a line break; a string holds no line break
    return re.sub(r"\[\n([-0-9.eE+,\s]*)\n\s*\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(study.RESULTS_FILE))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the chapter's 200)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the chapter's five)")
    parser.add_argument(
        "--only", choices=["copy-back-budget", "table", "families"], default=None, help="remake one part of --output"
    )
    parser.add_argument("--family", default=None, help="with --only families: comma-separated families to remake")
    args = parser.parse_args(argv)
    if args.family is not None and args.only != "families":
        parser.error("--family needs --only families")
    config = ex.ExperimentConfig()
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    if args.seeds is not None:
        config = dataclasses.replace(config, seeds=tuple(int(s) for s in args.seeds.split(",")))

    def progress(task, name, entry):
        longest = max(int(n) for n in entry["fresh"])
        fresh = study.fresh_accuracy(entry, longest).mean(1)
        print(
            f"{task:17s} {ex.encoding_label(name):36s} final loss {' '.join(f'{v:.3f}' for v in entry['final_loss'])}"
            f"  fresh at {longest}: {' '.join(f'{v:.3f}' for v in fresh.tolist())}",
            flush=True,
        )

    start = time.perf_counter()
    if args.only is not None:
        data = json.loads(Path(args.output).read_text())
        parts = {key: data.get(key) for key in ("budget_copy_back", "table", "families")}
        if args.only == "copy-back-budget":
            parts["budget_copy_back"] = study.copy_back_budget_study(config, progress)
        elif args.only == "table":
            parts["table"] = study.table_study(config, progress)
        else:
            chosen = None if args.family is None else args.family.split(",")
            parts["families"] = {**(parts["families"] or {}), **study.families_study(config, progress, chosen)}
            parts["families"] = {name: parts["families"][name] for name in study.FAMILIES}
        new = study.record(data["slopes"], data["budget"], config, **parts)
        Path(args.output).write_text(compact_json(new))
        print(f"wrote the {args.only} part into {args.output} ({time.perf_counter() - start:.0f} s)")
        return 0
    slopes = study.slope_study(config, progress)
    print(f"ALiBi's family: {time.perf_counter() - start:.0f} s; budget check on fetch", flush=True)
    budget = study.budget_study(config, progress)
    copy_back = study.copy_back_budget_study(config, progress)
    table = study.table_study(config, progress)
    families = study.families_study(config, progress)
    Path(args.output).write_text(compact_json(study.record(slopes, budget, config, copy_back, table, families)))
    print(f"wrote {args.output} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
