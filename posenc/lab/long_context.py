"""Chapter 12's long-context study: SmolLM2-135M-Instruct beyond its trained 8,192 tokens, with posenc's
context-extension tables, and the sliding-window control.

One forward pass per method over ``length`` tokens of the offline text (``pydoc_data.topics``, see
:func:`posenc.lab.language_model.corpus_tokens`) gives the next-token loss at every position. A causal model's loss at
position ``t`` depends only on tokens ``<= t``, so for a frequency table that does not depend on the sequence
length the losses of one 16k pass are those of every shorter horizon. Dynamic NTK does depend on it: its band
``[a, b)`` is read from a pass of length ``b`` (an 8k pass is plain RoPE, a 16k pass is NTK-aware with s = 2, and
one extra 12k pass gives ``[8k, 12k)``): :func:`run_methods`.

The control (:func:`run_window`): the unmodified model (its own RoPE table) fed only the last ``window`` tokens
(default the trained 8,192) before each prediction. The text beyond the trained length is cut into blocks of
``stride`` positions; block ``[a, a + stride)`` is predicted by one pass over the ``window`` tokens that end at
``a + stride``, so every prediction there sees between ``window - stride + 1`` and ``window`` tokens, and none from
further back. A method that beats this baseline in a band uses the far context; one that only matches it has merely
stopped breaking.

Both take tens of minutes, so ``make long-context`` (``book/tools/long_context.py``, a thin command line) writes them
to committed files under ``posenc/lab/data`` that the chapter reads with :func:`results` and :func:`window_results`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch

from .results import DATA_DIR, read_json

TRAINED = 8192
HEAD_TOKENS = 256  # the cheap point the chapter recomputes live
METHODS = ("RoPE", "NTK-aware", "YaRN", "PI", "dynamic NTK")
RESULTS_FILE = DATA_DIR / "long_context.json"
WINDOW_FILE = DATA_DIR / "long_context_window.json"
TEXT_SOURCE = "pydoc_data.topics, every entry sorted by key, joined by blank lines"


def methods(factor: float, trained: int = TRAINED) -> dict:
    """Name -> (rope_parameters, seq_len) for posenc.rope_frequencies (head_dim 64, theta 1e5, ``trained`` tokens)."""
    theta = 100000.0
    return {
        "RoPE": ({"rope_type": "default", "rope_theta": theta}, None),
        # NTK-aware with scale s is the dynamic-NTK table (f = 1) computed at length s * trained (chapter 10)
        "NTK-aware": ({"rope_type": "dynamic", "rope_theta": theta, "factor": 1.0}, int(factor * trained)),
        "YaRN": (
            {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": trained},
            None,
        ),
        "PI": ({"rope_type": "linear", "rope_theta": theta, "factor": factor}, None),
    }


def band_means(losses: torch.Tensor, bands) -> dict:
    """Mean loss over predicted positions ``[a, b)`` (the loss at index t predicts token t + 1)."""
    return {f"{a}-{b}": losses[a:b].double().mean().item() for a, b in bands if b <= losses.numel()}


def window_losses(ids: torch.Tensor, begin: int, end: int, window: int, stride: int, run) -> torch.Tensor:
    """Losses ``(end - begin,)`` at predicted positions ``[begin, end)``, each from at most ``window`` tokens.

    ``ids``: the text ``(N,)`` with ``N > end``; ``run(ids)`` returns the ``(len(ids) - 1,)`` losses of one pass.
    Block ``[a, a + stride)`` comes from one pass over ``ids[a + stride - window : a + stride + 1]``.
    """
    if (end - begin) % stride or stride > window or begin + stride < window:
        raise ValueError(
            f"need (end - begin) % stride == 0, stride <= window and begin + stride >= window, "
            f"got begin={begin}, end={end}, stride={stride}, window={window}"
        )
    blocks = []
    for a in range(begin, end, stride):
        first = a + stride - window
        losses = run(ids[first : a + stride + 1])  # loss index i predicts position first + i
        blocks.append(losses[a - first :])
    return torch.cat(blocks)


def study_bands(length: int, trained: int = TRAINED) -> list[tuple[int, int]]:
    """The bands a run over ``length`` predicted positions reports: :func:`bands`, and beyond twice the trained
    length one more band up to ``length``."""
    chosen = bands(trained) + ([(2 * trained, length)] if length > 2 * trained else [])
    return [(a, b) for a, b in chosen if b <= length]


def _dynamic_ntk(run, head_dim: int, chosen, trained: int, tables: dict, results: dict) -> dict:
    """Dynamic NTK's entry of the record (factor 1): the table of a pass depends on its length ``L`` (scale
    ``max(1, L / trained)``), so band ``[a, b)`` comes from a pass of ``b`` tokens (``run(name, parameters, seq_len,
    size)``), or from a method of ``tables`` (name -> (inv_freq, attention_factor)) that already ran the identical
    table over at least ``b`` tokens (causality gives the band)."""
    import posenc

    dynamic = {"rope_type": "dynamic", "rope_theta": 100000.0, "factor": 1.0}
    bands_of, seconds_of = {}, 0.0
    for a, b in chosen:
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, dynamic, trained, b)
        same = [
            name for name, table in tables.items() if torch.equal(table[0], inv_freq) and table[1] == attention_factor
        ]
        if same:
            bands_of[f"{a}-{b}"] = results[same[0]]["bands"][f"{a}-{b}"]
            continue
        losses, seconds = run(f"dynamic NTK at {b}", dynamic, b, b)
        seconds_of += seconds
        bands_of[f"{a}-{b}"] = losses[a:b].double().mean().item()
    return {
        "rope_parameters": dynamic,
        "seq_len": "length of the pass",
        "seconds": round(seconds_of, 1),
        "bands": bands_of,
    }


def run_methods(
    lm,
    ids: torch.Tensor,
    factor: float = 2.0,
    bin_size: int = 512,
    trained: int = TRAINED,
    progress: Callable[[str], None] = print,
    partial: Path | None = None,
) -> dict:
    """Every method's losses over ``ids`` ``(length + 1,)``: the ``methods`` and ``bands_note`` fields of the record
    (``name -> rope_parameters, seq_len, seconds, bands, bin_means, first_256``; dynamic NTK: its bands).
    ``partial``: a file that receives the results so far after each method (in case a run is cut short)."""
    import json

    import posenc

    from . import language_model as lm_module

    length = ids.numel() - 1
    chosen = study_bands(length, trained)
    results, tables = {}, {}

    def run(name, parameters, seq_len, size):
        inv_freq, attention_factor = posenc.rope_frequencies(lm.head_dim, parameters, trained, seq_len)
        start = time.perf_counter()
        losses = lm_module.token_losses(lm, ids[: size + 1], inv_freq, attention_factor)[0]
        seconds = time.perf_counter() - start
        progress(f"{name}: {size} tokens in {seconds:.0f} s, mean loss {losses.double().mean().item():.4f}")
        tables[name] = (inv_freq, attention_factor)
        return losses, seconds

    for name, (parameters, seq_len) in methods(factor, trained).items():
        losses, seconds = run(name, parameters, seq_len, length)
        bins = losses.view(-1, bin_size).double().mean(-1)
        results[name] = {
            "rope_parameters": parameters,
            "seq_len": seq_len,
            "seconds": round(seconds, 1),
            "attention_factor": tables[name][1],
            "bands": band_means(losses, chosen),
            "bin_means": bins.tolist(),
            f"first_{HEAD_TOKENS}": losses[:HEAD_TOKENS].double().mean().item(),
        }
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(results, indent=1) + "\n")

    results["dynamic NTK"] = _dynamic_ntk(run, lm.head_dim, chosen, trained, tables, results)
    return results


def run_window(
    lm,
    ids: torch.Tensor,
    window: int = TRAINED,
    stride: int = 1024,
    bin_size: int = 512,
    trained: int = TRAINED,
    progress: Callable[[str], None] = print,
) -> dict:
    """The sliding-window control over ``ids`` ``(length + 1,)`` (see the module docstring): the record's fields
    ``window``, ``stride``, ``context_seen``, ``bands`` (those past the trained length), ``bin_means``,
    ``first_bin``, ``seconds`` and ``passes``."""
    from . import language_model as lm_module

    passes = []

    def run(window_ids):
        start = time.perf_counter()
        losses = lm_module.token_losses(lm, window_ids)[0]  # the model's own table: plain RoPE
        passes.append(time.perf_counter() - start)
        progress(f"window pass {len(passes)}: {window_ids.numel() - 1} tokens in {passes[-1]:.0f} s")
        return losses

    length = ids.numel() - 1
    losses = window_losses(ids, trained, length, window, stride, run)
    shifted = {
        f"{a}-{b}": losses[a - trained : b - trained].double().mean().item()
        for a, b in study_bands(length, trained)
        if a >= trained
    }
    return {
        "window": window,
        "stride": stride,
        "bin": bin_size,
        "context_seen": [window - stride + 1, window],
        "bands": shifted,
        "bin_means": losses.view(-1, bin_size).double().mean(-1).tolist(),
        "first_bin": trained // bin_size,
        "seconds": round(sum(passes), 1),
        "passes": len(passes),
    }


METHODS = ("RoPE", "NTK-aware", "YaRN", "PI", "dynamic NTK")
RESULTS_FILE = DATA_DIR / "long_context.json"
WINDOW_FILE = DATA_DIR / "long_context_window.json"


def bands(trained: int) -> list[tuple[int, int]]:
    """The position bands ``[a, b)`` the long-context result reports: within the trained length, then its next
    half and the half after (up to twice the trained length)."""
    return [(0, trained), (trained, trained * 3 // 2), (trained * 3 // 2, 2 * trained)]


def results(path: str | Path | None = None) -> dict:
    """The committed result of :func:`run_methods` (``make long-context``), checked.

    ``path``: the JSON file; default ``posenc/lab/data/long_context.json``, shipped with the package (so a pip
    install, as in Colab, has it). Raises ``FileNotFoundError`` saying how to make the file, and
    ``ValueError`` naming the first field that is missing or not finite. Per method (``METHODS``):
    ``bands`` (band ``"a-b"`` -> mean next-token loss in nats over predicted positions ``a .. b - 1``); every
    method but dynamic NTK also has ``bin_means`` (mean loss per ``bin`` positions) and ``first_256``.
    """
    path, record = read_json(
        RESULTS_FILE.name,
        path,
        "long-context result",
        "`make long-context` remakes it (about 10 minutes on 2 CPU cores)",
    )

    def finite(where: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{path.name}: {where} must be a finite number, got {value!r}")

    for key in ("trained_length", "factor", "bin", "text", "methods", "machine", "versions", "command"):
        if key not in record:
            raise ValueError(f"{path.name}: missing field {key!r}")
    trained, length = record["trained_length"], record["text"]["tokens"][1] - record["text"]["tokens"][0] - 1
    names = [f"{a}-{b}" for a, b in bands(trained)]
    for name in METHODS:
        result = record["methods"].get(name)
        if result is None:
            raise ValueError(f"{path.name}: missing method {name!r}")
        for band in names:
            finite(f"methods[{name!r}]['bands'][{band!r}]", result.get("bands", {}).get(band))
        if name != "dynamic NTK":
            finite(f"methods[{name!r}]['first_256']", result.get("first_256"))
            bins = result.get("bin_means", [])
            if len(bins) * record["bin"] != length:
                raise ValueError(
                    f"{path.name}: methods[{name!r}]['bin_means'] must cover the {length} positions "
                    f"in bins of {record['bin']}, got {len(bins)} bins"
                )
            for index, value in enumerate(bins):
                finite(f"methods[{name!r}]['bin_means'][{index}]", value)
    return record


def window_results(path: str | Path | None = None) -> dict:
    """The committed sliding-window baseline of :func:`run_window`, checked.

    ``path``: default ``posenc/lab/data/long_context_window.json`` (shipped with posenc). The model with its own RoPE,
    fed only the last ``window`` tokens before each prediction (between ``context_seen[0]`` and
    ``context_seen[1]``); ``bands`` (``"a-b"`` -> mean loss in nats, for the bands past the trained length) and
    ``bin_means`` (per ``bin`` positions from the trained length on). Raises ``FileNotFoundError`` saying how to
    make the file, ``ValueError`` naming the first field that is missing or not finite.
    """
    path, record = read_json(WINDOW_FILE.name, path, "sliding-window baseline", "`make long-context` remakes it")
    for key in (
        "trained_length",
        "window",
        "stride",
        "bin",
        "context_seen",
        "text",
        "bands",
        "bin_means",
        "machine",
        "versions",
        "command",
        "model",
    ):
        if key not in record:
            raise ValueError(f"{path.name}: missing field {key!r}")
    trained = record["trained_length"]
    expected = [f"{a}-{b}" for a, b in bands(trained) if a >= trained]
    for band in expected:
        value = record["bands"].get(band)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{path.name}: bands[{band!r}] must be a finite number, got {value!r}")
    length = record["text"]["tokens"][1] - record["text"]["tokens"][0] - 1
    if len(record["bin_means"]) * record["bin"] != length - trained:
        raise ValueError(
            f"{path.name}: bin_means must cover positions {trained} to {length} in bins of "
            f"{record['bin']}, got {len(record['bin_means'])} bins"
        )
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in record["bin_means"]):
        raise ValueError(f"{path.name}: bin_means must be finite numbers")
    return record
