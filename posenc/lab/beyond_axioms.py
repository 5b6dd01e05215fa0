"""Chapter 14's study: every encoding of chapter 11 and the three data-dependent ones on a counting task.

The task is :class:`posenc.lab.tasks.CopyAfterMarker` (copy the token after the ``k``-th marker). Every encoding of
:data:`posenc.lab.experiments.ENCODINGS` (chapter 11's) and of :data:`~posenc.lab.experiments.BEYOND_ENCODINGS`
(CoPE, FoX, PaTH with ``w_t`` from token ``t`` alone, a simplification) and the authors' PaTH layer (short
convolution, :data:`posenc.lab.state_tracking.PATH_CONV`) is trained with chapter 11's budget and seeds
(:class:`~posenc.lab.experiments.ExperimentConfig` defaults, evaluated at 1, 2 and 4 times the training length),
all side by side in one ensemble, then evaluated

* on the training distribution (marker rate ``--rate``) at every evaluation length, and
* on sparser markers (``--sparse-rate``): the ``k``-th marker then sits further from the start, often beyond the
  training length, at positions no training sequence had it.

It also records the one-layer position-blind bound (:func:`posenc.lab.tasks.position_blind_accuracy`, causal) on
each evaluation batch, and runs the whole comparison a second time on ``CopyAfterMarker(k=1)`` (same encodings,
budget, seeds and marker rates) as the control: k = 1 needs no counting, only the copy and its length
generalisation, so the drop from k = 1 to k = 2 is what counting costs. The result is a JSON file with the
configuration, the per-seed accuracies and the final losses (k = 2 at the top level, the k = 1 control under
``"k1"``); chapter 14 reads it and retrains one seed of a few encodings live as a spot check.

Two checks sit beside the comparison, under ``"budget"``:

* the **budget check**: every encoding again on k = 2 with three times the steps (``BUDGET_STEPS``) on three of
  the seeds (``BUDGET_SEEDS``), so that a failure at 200 steps is not read as what an encoding cannot do; and on
  the k = 1 control the same for every encoding that fails it at the chapter's budget (accuracy at the training
  length below ``K1_BUDGET_BAR`` on some seed, ALiBi's fixed slopes included);
* ALiBi at **fixed slopes** (``ALIBI_SLOPES``, one steep head per offset scale) besides the standard schedule
  ``2^(-8h/n)``, whose steepest head at 4 heads (slope 1/4) spreads its weight over several offsets: at the
  chapter's budget (k = 2 and the k = 1 control, every seed) and in the budget check.

``make beyond-axioms`` (``book/tools/beyond_axioms.py``, a thin command line; ``--budget-only`` remakes only
``"budget"`` in an existing file) writes it to ``posenc/lab/data/beyond_axioms.json`` (:data:`RESULTS_FILE`).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .results import DATA_DIR

RESULTS_FILE = DATA_DIR / "beyond_axioms.json"
K, RATE, SPARSE_RATE = 2, 0.25, 0.1
LENGTH_FACTORS = (1, 2, 4)
BUDGET_STEPS, BUDGET_SEEDS = 600, (1, 2, 4)
ALIBI_SLOPES = (4.0, 2.0, 1.0, 0.5)
ALIBI_SLOPES_NAME = "alibi-slopes"
K1_BUDGET_BAR = 0.9


def chapter_config(**changes):
    """Chapter 11's configuration, evaluated at 1, 2 and 4 times the training length (and ``changes``)."""
    from posenc.lab import experiments as ex

    return dataclasses.replace(ex.ExperimentConfig(), length_factors=LENGTH_FACTORS, **changes)


def encoding_names() -> list:
    """Chapter 11's encodings, then CoPE, FoX, PaTH (simplified) and the authors' PaTH layer (registered here, by
    :func:`posenc.lab.state_tracking.register_path_conv`); not ALiBi's fixed slopes, which only the checks train."""
    from posenc.lab import experiments as ex
    from posenc.lab import state_tracking

    path_conv = state_tracking.register_path_conv()
    names = [name for name in ex.ENCODINGS if name not in (ALIBI_SLOPES_NAME, path_conv)]
    return names + list(ex.BEYOND_ENCODINGS) + [path_conv]


def register_alibi_slopes() -> str:
    """Register ALiBi with the fixed slopes ``ALIBI_SLOPES`` (one per head) as the encoding ``ALIBI_SLOPES_NAME``
    (:func:`posenc.lab.experiments.add_encoding`); returns the name."""
    from posenc.alibi import ALiBi
    from posenc.lab import experiments as ex

    def factory(config):
        if config.n_heads != len(ALIBI_SLOPES):
            raise ValueError(f"ALIBI_SLOPES has {len(ALIBI_SLOPES)} slopes, the model {config.n_heads} heads")
        alibi = ALiBi(config.n_heads, causal=True)
        alibi.slopes.copy_(torch.tensor(ALIBI_SLOPES))
        return alibi

    label = "ALiBi, slopes (" + ", ".join(f"{s:g}" for s in ALIBI_SLOPES) + ")"
    return ex.add_encoding(ALIBI_SLOPES_NAME, label, factory)


def k1_failures(k1_accuracy: dict, train_length: int) -> list:
    """The names in ``k1_accuracy`` (``{name: {length: [per seed]}}``, the k = 1 control's ``"accuracy"``) below
    ``K1_BUDGET_BAR`` at ``train_length`` on some seed, in their order."""
    return [name for name, acc in k1_accuracy.items() if min(acc[str(train_length)]) < K1_BUDGET_BAR]


def budget_check(names, k1_control: dict, progress=print) -> dict:
    """The two checks of the module docstring: ``{"steps", "seeds", "names", "labels", "alibi_slopes",
    "alibi_slopes_name", "k2": run(...) of ALiBi's fixed slopes at the chapter's budget, "k1": the same on k = 1,
    "longer": run(...) of ``names`` and ALiBi's fixed slopes at BUDGET_STEPS on BUDGET_SEEDS (k = 2),
    "longer_k1": the same on k = 1 for the encodings :func:`k1_failures` picks from ``k1_control`` (the k = 1
    control's result) and "k1"}`` and how it was made (:func:`posenc.lab.results.provenance`)."""
    from posenc.lab import state_tracking
    from posenc.lab.results import provenance

    alibi = register_alibi_slopes()
    longer_names = list(names) + [alibi]
    longer_config = chapter_config(steps=BUDGET_STEPS, seeds=BUDGET_SEEDS)
    slopes_k1 = run([alibi], chapter_config(), k=1, progress=progress)
    failing = k1_failures(
        {**k1_control["accuracy"], **slopes_k1["accuracy"]}, chapter_config().train_length
    )  # the names of ``names`` with a k = 1 result, then ALiBi's fixed slopes
    return {
        "steps": BUDGET_STEPS,
        "seeds": list(BUDGET_SEEDS),
        "names": longer_names,
        "labels": {name: state_tracking.label(name) for name in longer_names},
        "alibi_slopes": list(ALIBI_SLOPES),
        "alibi_slopes_name": alibi,
        "k2": run([alibi], chapter_config(), progress=progress),
        "k1": slopes_k1,
        "longer": run(longer_names, longer_config, progress=progress),
        "k1_bar": K1_BUDGET_BAR,
        "longer_k1": run(failing, longer_config, k=1, progress=progress),
        **provenance(1, "book.tools.beyond_axioms"),  # --budget-only remakes this part alone, maybe elsewhere
    }


def run(names, config, k: int = K, rate: float = RATE, sparse_rate: float = SPARSE_RATE, progress=print) -> dict:
    """Train ``names`` with every seed of ``config`` on ``CopyAfterMarker(k, rate)`` and evaluate: a JSON-ready dict
    ``{"accuracy": {name: {length: [per seed]}}, "sparse": {...}, "sparse_last": {...}, "sparse_not_last": {...},
    "final_loss": {name: [per seed]}, "ceiling": {length: ...}, "sparse_ceiling": {length: ...}}``; "sparse_last"
    ("sparse_not_last") is the sparse accuracy on the sequences whose ``k``-th marker is (is not) their last."""
    from posenc.lab import experiments as ex
    from posenc.lab import tasks

    task, sparse = tasks.CopyAfterMarker(k, rate), tasks.CopyAfterMarker(k, sparse_rate)
    start = time.perf_counter()
    with ex.threads(1):
        runs = ex.run_plan([(task, name) for name in names], config, progress=progress)
        models = [r.model for r in runs]
        ensemble = ex.Ensemble.from_models(models, config)
        sparse_accuracy = {n: ex.evaluate_ensemble(ensemble, sparse, n, config)[0] for n in config.eval_lengths}
    seeds = len(config.seeds)
    result = {"accuracy": {}, "sparse": {}, "final_loss": {}}
    for g, name in enumerate(names):
        group = runs[g * seeds : (g + 1) * seeds]
        result["accuracy"][name] = {str(n): [r.accuracy[n] for r in group] for n in config.eval_lengths}
        result["sparse"][name] = {
            str(n): sparse_accuracy[n][g * seeds : (g + 1) * seeds].tolist() for n in config.eval_lengths
        }
        result["final_loss"][name] = [r.losses[-1] for r in group]
    # the sparse evaluation split by whether the k-th marker is also the last one (FoX's "forget before a marker")
    result["sparse_last"], result["sparse_not_last"] = {}, {}
    with ex.threads(1), torch.no_grad():
        for n in config.eval_lengths:
            inputs, targets, mask = ex.evaluation_data(sparse, n, config)
            last = (inputs == config.vocab_size - 1).sum(-1).eq(k)[:, None] & mask
            subsets = (("sparse_last", last), ("sparse_not_last", mask & ~last))
            for g, name in enumerate(names):
                for key, _ in subsets:
                    result[key].setdefault(name, {})[str(n)] = []
                for r in runs[g * seeds : (g + 1) * seeds]:
                    r.model.eval()
                    right = r.model(inputs).argmax(-1) == targets  # one forward pass serves both subsets
                    for key, subset in subsets:
                        correct = right & subset
                        result[key][name][str(n)].append(correct.sum().item() / max(subset.sum().item(), 1))
    for key, each in (("ceiling", task), ("sparse_ceiling", sparse)):
        result[key] = {
            str(n): tasks.position_blind_accuracy(
                each, ex.evaluation_data(each, n, config)[0], config.vocab_size, causal=True
            )
            for n in config.eval_lengths
        }
    result["seconds"] = time.perf_counter() - start
    return result


def record(names, config, result: dict, control: dict, budget: dict) -> dict:
    """The results file: the task, ``config``, ``names`` and their labels, ``result`` (k = 2) at the top level, the
    k = 1 ``control`` under ``"k1"``, the ``budget`` checks, and how it was made
    (:func:`posenc.lab.results.provenance`)."""
    from posenc.lab import state_tracking
    from posenc.lab.results import provenance

    made = provenance(1, "book.tools.beyond_axioms")
    return {
        "task": {"name": "CopyAfterMarker", "k": K, "rate": RATE, "sparse_rate": SPARSE_RATE},
        "config": {
            key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()
        },
        "names": names,
        "labels": {name: state_tracking.label(name) for name in names},
        **result,
        "k1": control,
        "budget": budget,
        **made,
    }
