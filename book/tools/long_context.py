"""``make long-context``: chapter 12's long-context study (:mod:`posenc.lab.long_context`), written to its files.

Usage (what ``make long-context`` runs)::

    nice -n 10 python -m book.tools.long_context --threads 2 --output posenc/lab/data/long_context.json
    nice -n 10 python -m book.tools.long_context --threads 2 --part window \\
        --output posenc/lab/data/long_context_window.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from posenc.lab import long_context as study
from posenc.lab.results import provenance


def write(path, record) -> None:
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {output}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=0, help="first token of the text window")
    parser.add_argument("--length", type=int, default=16384, help="tokens whose next token is predicted")
    parser.add_argument("--factor", type=float, default=2.0, help="scale s of PI, NTK-aware and YaRN")
    parser.add_argument("--bin", type=int, default=512, help="positions per bin of the loss curve")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--part",
        choices=("methods", "window"),
        default="methods",
        help="the rescaled tables (default) or the sliding-window baseline",
    )
    parser.add_argument("--window", type=int, default=None, help="baseline: tokens the model sees (default: trained)")
    parser.add_argument("--stride", type=int, default=1024, help="baseline: positions predicted per pass")
    parser.add_argument("--trained", type=int, default=study.TRAINED, help="(testing only) pretend this trained length")
    parser.add_argument("--output", default=str(study.RESULTS_FILE))
    args = parser.parse_args(argv)
    if args.length <= args.trained or args.length % args.bin:
        parser.error(f"--length must be > {args.trained} and a multiple of --bin")

    from posenc.lab import language_model as lm_module

    torch.set_num_threads(args.threads)
    lm = lm_module.load_language_model()
    ids = lm_module.text_window(lm, args.start, args.length + 1)
    text = {"source": study.TEXT_SOURCE, "tokens": [args.start, args.start + args.length + 1]}
    made = {
        **provenance(args.threads, "book.tools.long_context"),
        "model": {"name": lm.name, "source": Path(lm.info["source"]).name},
    }
    progress = lambda line: print(line, flush=True)  # noqa: E731
    if args.part == "window":
        window = args.trained if args.window is None else args.window
        part = study.run_window(lm, ids, window, args.stride, args.bin, args.trained, progress)
        record = {
            "what": "next-token loss (nats) of SmolLM2-135M-Instruct with its own RoPE, fed only the last `window` "
            "tokens before each prediction (the sliding-window baseline of the long-context result)",
            "text": text,
            "trained_length": args.trained,
            **part,
            "bands_note": "band a-b: mean loss of the predictions at positions a..b-1, each made from between "
            "context_seen[0] and context_seen[1] tokens (itself included)",
            **made,
        }
        write(args.output, record)
        print({band: round(math.exp(value), 3) for band, value in part["bands"].items()})
        return 0
    results = study.run_methods(
        lm, ids, args.factor, args.bin, args.trained, progress, partial=Path(args.output).with_suffix(".partial.json")
    )
    record = {
        "what": "next-token loss (nats) of SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32), posenc RoPE",
        "text": {**text, "total_tokens": int(lm_module.corpus_tokens(lm).numel())},
        "trained_length": args.trained,
        "factor": args.factor,
        "bin": args.bin,
        "bands_note": "band a-b: mean loss of the predictions at positions a..b-1; dynamic NTK from a pass of length b",
        "methods": results,
        **made,
    }
    write(args.output, record)
    for name, result in results.items():
        print(name, {band: round(math.exp(value), 2) for band, value in result["bands"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
