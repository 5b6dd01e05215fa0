"""Perplexity of SmolLM2-135M-Instruct beyond its trained 8,192 tokens with posenc's context-extension tables.

One forward pass per method over ``--length`` tokens of the offline text (``pydoc_data.topics``, see
:func:`posenc.lab.language_model.corpus_tokens`) gives the next-token loss at every position. A causal model's loss at
position ``t`` depends only on tokens ``<= t``, so for a frequency table that does not depend on the sequence
length the losses of one 16k pass are those of every shorter horizon. Dynamic NTK does depend on it: its band
``[a, b)`` is read from a pass of length ``b`` (an 8k pass is plain RoPE, a 16k pass is NTK-aware with s = 2, and
one extra 12k pass gives ``[8k, 12k)``).

``--part window`` computes the control instead: the unmodified model (its own RoPE table) fed only the last
``--window`` tokens (default the trained 8,192) before each prediction. The text beyond the trained length is cut
into blocks of ``--stride`` positions; block ``[a, a + stride)`` is predicted by one pass over the ``window``
tokens that end at ``a + stride``, so every prediction there sees between ``window - stride + 1`` and ``window``
tokens, and none from further back. A method that beats this baseline in a band uses the far context; one that
only matches it has merely stopped breaking. It is written to its own file (``long_context_window.json``).

Usage (what ``make long-context`` runs)::

    nice -n 10 python -m book.tools.long_context --threads 2 --output posenc/lab/data/long_context.json
    nice -n 10 python -m book.tools.long_context --threads 2 --part window --output posenc/lab/data/long_context_window.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from posenc.lab.results import cpu_name

ROOT = Path(__file__).resolve().parents[2]
TRAINED = 8192
HEAD_TOKENS = 256  # the cheap point the chapter recomputes live


def methods(factor: float) -> dict:
    """Name -> (rope_parameters, seq_len) for posenc.rope_frequencies (head_dim 64, theta 1e5, 8,192 trained)."""
    theta = 100000.0
    return {
        "RoPE": ({"rope_type": "default", "rope_theta": theta}, None),
        # NTK-aware with scale s is the dynamic-NTK table (f = 1) computed at length s * 8192 (chapter 10)
        "NTK-aware": ({"rope_type": "dynamic", "rope_theta": theta, "factor": 1.0}, int(factor * TRAINED)),
        "YaRN": ({"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                  "original_max_position_embeddings": TRAINED}, None),
        "PI": ({"rope_type": "linear", "rope_theta": theta, "factor": factor}, None),
    }


def band_means(losses: torch.Tensor, bands) -> dict:
    """Mean loss over predicted positions ``[a, b)`` (the loss at index t predicts token t + 1)."""
    return {f"{a}-{b}": losses[a:b].double().mean().item() for a, b in bands if b <= losses.numel()}


def window_losses(lm, ids: torch.Tensor, begin: int, end: int, window: int, stride: int, run) -> torch.Tensor:
    """Losses ``(end - begin,)`` at predicted positions ``[begin, end)``, each from at most ``window`` tokens.

    ``ids``: the text ``(N,)`` with ``N > end``; ``run(ids)`` returns the ``(len(ids) - 1,)`` losses of one pass.
    Block ``[a, a + stride)`` comes from one pass over ``ids[a + stride - window : a + stride + 1]``.
    """
    if (end - begin) % stride or stride > window or begin + stride < window:
        raise ValueError(f"need (end - begin) % stride == 0, stride <= window and begin + stride >= window, "
                         f"got begin={begin}, end={end}, stride={stride}, window={window}")
    blocks = []
    for a in range(begin, end, stride):
        first = a + stride - window
        losses = run(ids[first:a + stride + 1])  # loss index i predicts position first + i
        blocks.append(losses[a - first:])
    return torch.cat(blocks)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(args, lm, posenc) -> dict:
    import transformers

    return {
        "machine": {"platform": platform.platform(), "cpu": cpu_name(), "cores": os.cpu_count(),
                    "threads": args.threads},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "posenc": posenc.__version__,
                     "git_commit": git_commit()},
        "command": " ".join([Path(sys.executable).name, "-m", "book.tools.long_context"] + list(sys.argv[1:])),
        "model": {"name": lm.name, "source": Path(lm.info["source"]).name},
    }


def write(path, record) -> None:
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {output}")


def window_part(args, lm, ids, bands, posenc, lm_module) -> int:
    """The sliding-window baseline (see the module docstring), written to ``args.output``."""
    window = TRAINED if args.window is None else args.window
    passes = []

    def run(window_ids):
        start = time.perf_counter()
        losses = lm_module.token_losses(lm, window_ids)[0]  # the model's own table: plain RoPE
        passes.append(time.perf_counter() - start)
        print(f"window pass {len(passes)}: {window_ids.numel() - 1} tokens in {passes[-1]:.0f} s", flush=True)
        return losses

    losses = window_losses(lm, ids, TRAINED, args.length, window, args.stride, run)
    shifted = {f"{a}-{b}": losses[a - TRAINED:b - TRAINED].double().mean().item() for a, b in bands if a >= TRAINED}
    bins = losses.view(-1, args.bin).double().mean(-1)
    record = {
        "what": "next-token loss (nats) of SmolLM2-135M-Instruct with its own RoPE, fed only the last `window` "
                "tokens before each prediction (the sliding-window baseline of the long-context result)",
        "text": {"source": "pydoc_data.topics, every entry sorted by key, joined by blank lines",
                 "tokens": [args.start, args.start + args.length + 1]},
        "trained_length": TRAINED, "window": window, "stride": args.stride, "bin": args.bin,
        "context_seen": [window - args.stride + 1, window],
        "bands_note": "band a-b: mean loss of the predictions at positions a..b-1, each made from between "
                      "context_seen[0] and context_seen[1] tokens (itself included)",
        "bands": shifted, "bin_means": bins.tolist(), "first_bin": TRAINED // args.bin,
        "seconds": round(sum(passes), 1), "passes": len(passes), **provenance(args, lm, posenc),
    }
    write(args.output, record)
    print({band: round(math.exp(value), 3) for band, value in shifted.items()})
    return 0


def main(argv=None) -> int:
    global TRAINED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=0, help="first token of the text window")
    parser.add_argument("--length", type=int, default=16384, help="tokens whose next token is predicted")
    parser.add_argument("--factor", type=float, default=2.0, help="scale s of PI, NTK-aware and YaRN")
    parser.add_argument("--bin", type=int, default=512, help="positions per bin of the loss curve")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("methods", "window"), default="methods",
                        help="the rescaled tables (default) or the sliding-window baseline")
    parser.add_argument("--window", type=int, default=None, help="baseline: tokens the model sees (default: trained)")
    parser.add_argument("--stride", type=int, default=1024, help="baseline: positions predicted per pass")
    parser.add_argument("--trained", type=int, default=TRAINED, help="(testing only) pretend this trained length")
    parser.add_argument("--output", default=str(ROOT / "posenc" / "data" / "long_context.json"))
    args = parser.parse_args(argv)
    TRAINED = args.trained
    if args.length <= TRAINED or args.length % args.bin:
        parser.error(f"--length must be > {TRAINED} and a multiple of --bin")

    import posenc
    from posenc.lab import language_model as lm_module

    torch.set_num_threads(args.threads)
    lm = lm_module.load_language_model()
    ids = lm_module.text_window(lm, args.start, args.length + 1)
    half = args.length // 2
    bands = lm_module.long_context_bands(TRAINED)
    if args.length > 2 * TRAINED:
        bands.append((2 * TRAINED, args.length))
    bands = [(a, b) for a, b in bands if b <= args.length]
    head_dim = lm.head_dim
    results, tables = {}, {}

    def run(name, parameters, seq_len, length):
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, parameters, TRAINED, seq_len)
        start = time.perf_counter()
        losses = lm_module.token_losses(lm, ids[:length + 1], inv_freq, attention_factor)[0]
        seconds = time.perf_counter() - start
        print(f"{name}: {length} tokens in {seconds:.0f} s, mean loss {losses.double().mean().item():.4f}",
              flush=True)
        tables[name] = (inv_freq, attention_factor)
        return losses, seconds

    if args.part == "window":
        return window_part(args, lm, ids, bands, posenc, lm_module)

    for name, (parameters, seq_len) in methods(args.factor).items():
        losses, seconds = run(name, parameters, seq_len, args.length)
        bins = losses.view(-1, args.bin).double().mean(-1)
        results[name] = {"rope_parameters": parameters, "seq_len": seq_len, "seconds": round(seconds, 1),
                         "attention_factor": tables[name][1],
                         "bands": band_means(losses, bands), "bin_means": bins.tolist(),
                         f"first_{HEAD_TOKENS}": losses[:HEAD_TOKENS].double().mean().item()}
        partial = Path(args.output).with_suffix(".partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(results, indent=1) + "\n")  # progress, in case the run is cut short

    # dynamic NTK (factor 1): the table of a pass depends on its length L (scale max(1, L / 8192))
    dynamic = {"rope_type": "dynamic", "rope_theta": 100000.0, "factor": 1.0}
    dynamic_bands, dynamic_seconds = {}, 0.0
    for a, b in bands:
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, dynamic, TRAINED, b)
        same = [name for name, table in tables.items()
                if torch.equal(table[0], inv_freq) and table[1] == attention_factor]
        if same:  # an identical table already ran over >= b tokens: causality gives the band
            dynamic_bands[f"{a}-{b}"] = results[same[0]]["bands"][f"{a}-{b}"]
            continue
        losses, seconds = run(f"dynamic NTK at {b}", dynamic, b, b)
        dynamic_seconds += seconds
        dynamic_bands[f"{a}-{b}"] = losses[a:b].double().mean().item()
    results["dynamic NTK"] = {"rope_parameters": dynamic, "seq_len": "length of the pass",
                              "seconds": round(dynamic_seconds, 1), "bands": dynamic_bands}

    record = {
        "what": "next-token loss (nats) of SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32), posenc RoPE",
        "text": {"source": "pydoc_data.topics, every entry sorted by key, joined by blank lines",
                 "tokens": [args.start, args.start + args.length + 1], "total_tokens": int(lm_module.corpus_tokens(lm).numel())},
        "trained_length": TRAINED, "factor": args.factor, "bin": args.bin,
        "bands_note": "band a-b: mean loss of the predictions at positions a..b-1; dynamic NTK from a pass of length b",
        "methods": results, **provenance(args, lm, posenc),
    }
    write(args.output, record)
    for name, result in results.items():
        print(name, {band: round(math.exp(value), 2) for band, value in result["bands"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
