"""Chapter 14's state-tracking study: the word problem of a non-abelian group against an abelian one of the same size.

The task is :class:`posenc.lab.tasks.WordProblem`: after a start token, letters drawn uniformly from a group, and at
every position the running product as the target. :data:`GROUPS` are S3 (the smallest non-abelian group) and its
control Z6 (abelian, the same six elements' worth of states): on Z6 the product does not depend on the order of the
letters, on S3 it does. PaTH's transport from a key to a query is a product of content-dependent maps that need not
commute; RoPE's is a rotation by the offset alone, and FoX's and CoPE's are sums over the tokens between (commuting).

:data:`NAMES` (causal NoPE, RoPE and chapter 14's three data-dependent encodings) are trained on both groups with
:func:`config` (chapter 11's model, training length :data:`TRAIN_LENGTH`, :data:`STEPS` steps, :data:`SEEDS`) and
evaluated on :data:`EVAL_SEQUENCES` fresh sequences at 1, 2 and 4 times the training length: per seed the accuracy and
its standard error over the sequences, and the accuracy per position (mean over seeds). The **budget check** trains
every encoding again with three times the steps on :data:`BUDGET_SEEDS`. ``make beyond-axioms``
(``--part state-tracking``) writes the result to :data:`RESULTS_FILE`.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .results import DATA_DIR

RESULTS_FILE = DATA_DIR / "state_tracking.json"
GROUPS = ("S3", "Z6")
NAMES = ("nope-causal", "rope", "cope", "fox", "path")
TRAIN_LENGTH, STEPS, LENGTH_FACTORS, SEEDS = 8, 300, (1, 2, 4), (0, 1, 2)
EVAL_SEQUENCES = 256
BUDGET_FACTOR, BUDGET_SEEDS = 3, (0, 1)


def config(**changes):
    """Chapter 11's model and seeds on the word problem: vocabulary ``|G| + 1`` (the start token), training length
    :data:`TRAIN_LENGTH`, :data:`STEPS` steps, :data:`EVAL_SEQUENCES` evaluation sequences at every length."""
    from posenc.lab import experiments as ex

    settings = dict(
        vocab_size=7,
        train_length=TRAIN_LENGTH,
        length_factors=LENGTH_FACTORS,
        steps=STEPS,
        seeds=SEEDS,
        eval_batch_size=EVAL_SEQUENCES,
        eval_tokens=EVAL_SEQUENCES * TRAIN_LENGTH * max(LENGTH_FACTORS),
    )
    settings.update(changes)
    return dataclasses.replace(ex.ExperimentConfig(), **settings)


def _register(names):
    from posenc.lab import beyond_axioms

    if beyond_axioms.ALIBI_SLOPES_NAME in names:
        beyond_axioms.register_alibi_slopes()


@torch.no_grad()
def evaluate(ensemble, tasks, config) -> dict:
    """Every model of ``ensemble`` (``tasks``: one per model) on the fixed evaluation batch of its task at every
    length of ``config``: ``{length: (per-sequence accuracy (M, B), per-position accuracy (M, L))}``, the latter 0 at
    position 0, which has no target (the start token)."""
    from posenc.lab import experiments as ex

    out = {}
    for n in config.eval_lengths:
        data = {id(t): ex.evaluation_data(t, n, config) for t in tasks}
        inputs, targets, mask = (torch.stack(parts) for parts in zip(*(data[id(t)] for t in tasks)))
        chunk = max(1, ex.EVAL_CHUNK_SCORES // (inputs.shape[1] * ensemble.n_heads * n * n))
        correct = (
            torch.cat(
                [
                    ensemble.part(s, min(s + chunk, len(ensemble))).logits(inputs[s : s + chunk]).argmax(-1)
                    == targets[s : s + chunk]
                    for s in range(0, len(ensemble), chunk)
                ]
            )
            & mask
        )  # (M, B, L)
        out[n] = (correct.sum(-1) / mask.sum(-1), correct.sum(1) / mask.sum(1).clamp(min=1))
    return out


def run(names=NAMES, groups=GROUPS, cfg=None, progress=print) -> dict:
    """Train ``names`` on the word problem of each of ``groups`` with every seed of ``cfg`` (default :func:`config`)
    and evaluate: ``{group: {"accuracy": {name: {length: [per seed]}}, "sequence_se": {...: [per seed]},
    "position": {name: {length: [per position, mean over seeds]}}, "final_loss": {name: [per seed]}}}`` and
    ``"seconds"``. ``sequence_se`` is the standard error of a seed's accuracy over the evaluation sequences."""
    from posenc.lab import experiments as ex
    from posenc.lab import tasks as task_module

    cfg = config() if cfg is None else cfg
    names, groups = list(names), list(groups)
    _register(names)
    plan = [(task_module.WordProblem(g), name) for g in groups for name in names]
    start, seeds = time.perf_counter(), len(cfg.seeds)
    with ex.threads(1):
        ensemble, losses = ex.train([t for t, _ in plan], [name for _, name in plan], cfg)
        scores = evaluate(ensemble, [t for t, _ in plan for _ in cfg.seeds], cfg)
    result = {}
    for p, (task, name) in enumerate(plan):
        part = slice(p * seeds, (p + 1) * seeds)
        entry = result.setdefault(task.group, {"accuracy": {}, "sequence_se": {}, "position": {}, "final_loss": {}})
        per_sequence = {n: scores[n][0][part] for n in cfg.eval_lengths}
        entry["accuracy"][name] = {str(n): acc.mean(1).tolist() for n, acc in per_sequence.items()}
        entry["sequence_se"][name] = {
            str(n): (acc.std(1) / acc.shape[1] ** 0.5).tolist() for n, acc in per_sequence.items()
        }
        entry["position"][name] = {str(n): scores[n][1][part].mean(0).tolist() for n in cfg.eval_lengths}
        entry["final_loss"][name] = losses[part, -1].tolist()
        if progress is not None:
            progress(f"{task.group} {name:14s} loss " + " ".join(f"{v:.3f}" for v in entry["final_loss"][name]))
    result["seconds"] = time.perf_counter() - start
    return result


def record(names=NAMES, groups=GROUPS, progress=print) -> dict:
    """The results file: the task, the configuration, ``run`` at :data:`STEPS` and the budget check (``run`` at
    ``BUDGET_FACTOR`` times the steps on :data:`BUDGET_SEEDS`) under ``"budget"``, and how it was made
    (:func:`posenc.lab.results.provenance`)."""
    from posenc.lab import experiments as ex
    from posenc.lab import tasks as task_module
    from posenc.lab.results import provenance

    names = list(names)
    cfg = config()
    main = run(names, groups, cfg, progress)
    budget_cfg = config(steps=BUDGET_FACTOR * cfg.steps, seeds=BUDGET_SEEDS)
    budget = run(names, groups, budget_cfg, progress)
    return {
        "task": {
            "name": "WordProblem",
            "groups": list(groups),
            "chance": {g: 1 / task_module.WordProblem(g).size for g in groups},
        },
        "config": {key: list(v) if isinstance(v, tuple) else v for key, v in dataclasses.asdict(cfg).items()},
        "names": names,
        "labels": {name: ex.encoding_label(name) for name in names},
        **main,
        "budget": {"steps": budget_cfg.steps, "seeds": list(BUDGET_SEEDS), **budget},
        **provenance(1, "book.tools.beyond_axioms"),
    }
