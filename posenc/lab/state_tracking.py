"""Chapter 14's state-tracking study: the word problem of a non-abelian group against an abelian one of the same size.

The task is :class:`posenc.lab.tasks.WordProblem`: after a start token, letters drawn uniformly from a group, and at
every position the running product as the target. :data:`GROUPS` are S3 (the smallest non-abelian group) and its
control Z6 (abelian, the same six elements' worth of states): on Z6 the product does not depend on the order of the
letters, on S3 it does. PaTH's transport from a key to a query is a product of content-dependent maps that need not
commute; RoPE's is a rotation by the offset alone, and FoX's and CoPE's are sums over the tokens between (commuting).

:data:`NAMES` (causal NoPE, RoPE and chapter 14's three data-dependent encodings) are trained on both groups with
:func:`config` (chapter 11's model, training length :data:`TRAIN_LENGTH`, :data:`STEPS` steps, :data:`SEEDS`) and
evaluated on :data:`EVAL_SEQUENCES` fresh sequences at 1, 2 and 4 times the training length: per seed the accuracy and
its standard error over the sequences, and the accuracy per position (mean over seeds); the same for the **sign**
of the predicted state (:func:`signs`, the Z2 quotient a single reflection per token can carry) and, per seed, the
accuracy and sign accuracy at the positions beyond the training length; the fraction of the evaluation words at
the training length that some training batch of the seed held, and the accuracy on the others. PaTH is run twice:
``"path"`` (``w_t`` from token ``t`` alone, a simplification) and ``"path-conv"``, the authors' layer (``w`` through
a causal convolution of width :data:`CONV_WIDTH` and SiLU, :class:`posenc.data_dependent.PaTH` ``short_conv``).
The control for the algebra is :data:`PATH_COMMUTING` (:class:`CommutingPaTH`): PaTH with one learned ``w`` per head
shared by every token (``beta_t`` still read from the token), so that its factors commute; everything else as
``"path"``. That control is weak: every factor acts on one line, so the transport is one scalar channel per head.
:data:`PATH_DIAGONAL` (:class:`DiagonalPaTH`) is the full-rank commuting control: diagonal factors
``H_t = diag(1 - beta_{t,a})`` with one gate per coordinate, still set by the token.
The evaluation batch is one seeded batch shared by every encoding and seed. The **budget check** trains
every encoding again with three times the steps on :data:`BUDGET_SEEDS`. The **A5 probe** trains :data:`A5_NAMES`
on the word problem of A5 (60 states, non-solvable: the group of PaTH's NC1 claim) with the budget check's steps
and seeds (:func:`a5_config`). ``make beyond-axioms``
(``--part state-tracking``) writes the result to :data:`RESULTS_FILE`.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
from torch import nn

from posenc.data_dependent import PaTH

from .results import DATA_DIR

RESULTS_FILE = DATA_DIR / "state_tracking.json"
GROUPS = ("S3", "Z6")
NAMES = ("nope-causal", "rope", "cope", "fox", "path", "path-conv", "path-commuting", "path-diagonal")
PATH_CONV, CONV_WIDTH = "path-conv", 3
PATH_COMMUTING = "path-commuting"
PATH_DIAGONAL = "path-diagonal"
LABELS = {
    "path": "PaTH, simplified (w_t from token t alone)",
    PATH_CONV: "PaTH (authors' layer: short conv)",
    PATH_COMMUTING: "PaTH, commuting (one learned w per head)",
    PATH_DIAGONAL: "PaTH, commuting (diagonal, full rank)",
}
TRAIN_LENGTH, STEPS, LENGTH_FACTORS, SEEDS = 8, 300, (1, 2, 4), (0, 1, 2)
EVAL_SEQUENCES = 256
BUDGET_FACTOR, BUDGET_SEEDS = 3, (0, 1)
A5_NAMES = ("nope-causal", "rope", "path", "path-conv", "path-commuting")


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


def a5_config():
    """:func:`config` for the A5 probe: vocabulary 61 (60 letters and the start token), the budget check's steps and
    seeds."""
    return config(vocab_size=61, steps=BUDGET_FACTOR * STEPS, seeds=BUDGET_SEEDS)


def register_path_conv() -> str:
    """Register the authors' PaTH layer (:class:`posenc.data_dependent.PaTH` with ``short_conv=CONV_WIDTH``) as the
    encoding :data:`PATH_CONV` (:func:`posenc.lab.experiments.add_encoding`); returns the name. Chapter 14's
    counting study (:mod:`posenc.lab.beyond_axioms`) registers it here too."""
    from posenc.lab import experiments as ex

    return ex.add_encoding(
        PATH_CONV, LABELS[PATH_CONV], lambda c: PaTH(c.d_model, c.n_heads, c.head_dim, short_conv=CONV_WIDTH)
    )


class CommutingPaTH(PaTH):
    """PaTH whose Householder factors commute: ``w_t = normalize(u_h)`` for every token, ``u`` ``(H, D)`` learned
    (``shared_w``); ``beta_t`` from the token as in :class:`posenc.data_dependent.PaTH`. Every
    ``H_t = I - beta_t w w^T`` of a head is then a function of its one matrix ``w w^T``."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int):
        super().__init__(d_model, n_heads, head_dim)
        self.shared_w = nn.Parameter(torch.randn(n_heads, head_dim))

    def householder_parameters(self, hidden):
        w, beta = super().householder_parameters(hidden)  # (B, H, L, D), (B, H, L)
        shared = nn.functional.normalize(self.shared_w.to(w.dtype), dim=-1)[None, :, None, :]
        return shared.expand_as(w), beta


class DiagonalPaTH(PaTH):
    """A full-rank commuting transport: ``H_t = diag(1 - beta_{t,a})``, ``beta_{t,a} = 2 sigmoid(W x_t + b)_a`` per
    head and coordinate (``gate_weight`` ``(H * D, d_model)``, ``gate_bias`` ``(H * D,)``), so the logit is
    ``sum_a q_{i,a} k_{j,a} prod_{j < t <= i} (1 - beta_{t,a}) / sqrt(D)``. Diagonal factors commute, so the logit is
    blind to the order of the tokens between key and query, but unlike :class:`CommutingPaTH` every coordinate has
    its own content-set gate. PaTH's own ``w`` and ``beta`` parameters are created (the initial draws match the other
    PaTH rows') and unused."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int):
        super().__init__(d_model, n_heads, head_dim)
        self.gate_weight = nn.Parameter(nn.Linear(d_model, n_heads * head_dim).weight.detach().clone())
        self.gate_bias = nn.Parameter(torch.zeros(n_heads * head_dim))

    def content_logits(self, q, k, hidden=None, allowed=None):
        """``(B, H, Lq, Lk)`` as :class:`posenc.data_dependent.PaTH` (causal only), the product of the diagonal
        factors as ``exp`` of a difference of cumulative ``log|1 - beta|`` times the parity of the negative ones."""
        if allowed is None:
            raise ValueError("DiagonalPaTH multiplies over the tokens between key and query: use causal=True")
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        b, length, _ = hidden.shape
        gates = hidden.to(dtype) @ self.gate_weight.to(dtype).T + self.gate_bias.to(dtype)
        factor = 1 - 2 * torch.sigmoid(gates.view(b, length, self.n_heads, self.head_dim).transpose(1, 2))
        log_size = factor.abs().clamp_min(1e-6).log().cumsum(2)  # (B, H, L, D)
        negatives = (factor < 0).to(dtype).cumsum(2)
        lq = q.shape[-2]
        size = (log_size[:, :, -lq:, None] - log_size[:, :, None]).clamp(max=0).exp()  # (B, H, Lq, Lk, D)
        parity = 1 - 2 * torch.remainder(negatives[:, :, -lq:, None] - negatives[:, :, None], 2)
        below = torch.ones(lq, length, dtype=torch.bool, device=q.device).tril(length - lq)
        transport = size * parity * below[..., None]
        logits = torch.einsum("bhid,bhjd,bhijd->bhij", q.to(dtype), k.to(dtype), transport)
        return (logits / math.sqrt(q.shape[-1])).to(k.dtype)


def register_path_commuting() -> str:
    """Register :class:`CommutingPaTH` as the encoding :data:`PATH_COMMUTING`; returns the name."""
    from posenc.lab import experiments as ex

    return ex.add_encoding(
        PATH_COMMUTING, LABELS[PATH_COMMUTING], lambda c: CommutingPaTH(c.d_model, c.n_heads, c.head_dim)
    )


def register_path_diagonal() -> str:
    """Register :class:`DiagonalPaTH` as the encoding :data:`PATH_DIAGONAL`; returns the name."""
    from posenc.lab import experiments as ex

    return ex.add_encoding(
        PATH_DIAGONAL, LABELS[PATH_DIAGONAL], lambda c: DiagonalPaTH(c.d_model, c.n_heads, c.head_dim)
    )


def label(name: str) -> str:
    """The label of encoding ``name`` in chapter 14's results files: :data:`LABELS` (which tell the two PaTH layers
    apart), else the registry's."""
    from posenc.lab import experiments as ex

    return LABELS[name] if name in LABELS else ex.encoding_label(name)


def _register(names):
    from posenc.lab import beyond_axioms

    if beyond_axioms.ALIBI_SLOPES_NAME in names:
        beyond_axioms.register_alibi_slopes()
    if PATH_CONV in names:
        register_path_conv()
    if PATH_COMMUTING in names:
        register_path_commuting()
    if PATH_DIAGONAL in names:
        register_path_diagonal()


def signs(task, vocab_size: int) -> torch.Tensor:
    """``(vocab_size,)``: the sign (+1 or -1) of every element of ``task``'s group as a permutation, 0 for the other
    tokens. The sign is a homomorphism onto Z2 = {+1, -1}: on S3 the parity of the permutation, on Z6 (rotations of
    six points, a 6-cycle has sign -1) the parity of the sum mod 6."""
    table = torch.zeros(vocab_size)
    table[: task.size] = torch.linalg.det(torch.eye(len(task.elements[0]))[torch.tensor(task.elements)]).round()
    return table


def training_words(task, cfg, seed: int) -> set:
    """The words (letter tuples) of every training batch of seed ``seed`` under ``cfg``, drawn again as
    :func:`posenc.lab.experiments.train` draws them (one generator per seed, seeded with the seed)."""
    stream = torch.Generator().manual_seed(seed)
    words = set()
    for _ in range(cfg.steps):
        inputs = task.sample(cfg.batch_size, cfg.train_length, cfg.vocab_size, stream)[0]
        words.update(map(tuple, inputs.tolist()))
    return words


@torch.no_grad()
def evaluate(ensemble, tasks, config) -> dict:
    """Every model of ``ensemble`` (``tasks``: one per model) on the fixed evaluation batch of its task at every
    length of ``config``: ``{length: (correct (M, B, L), sign correct (M, B, L), mask (M, B, L))}``: the predicted
    state, and its sign (:func:`signs`), equal to the target's where ``mask`` (False at position 0, the start
    token)."""
    from posenc.lab import experiments as ex

    out = {}
    for n in config.eval_lengths:
        data = {id(t): ex.evaluation_data(t, n, config) for t in tasks}
        inputs, targets, mask = (torch.stack(parts) for parts in zip(*(data[id(t)] for t in tasks)))
        sign = torch.stack([signs(t, config.vocab_size) for t in tasks])[:, None]  # (M, 1, V)
        chunk = max(1, ex.EVAL_CHUNK_SCORES // (inputs.shape[1] * ensemble.n_heads * n * n))
        predicted = torch.cat(
            [
                ensemble.part(s, min(s + chunk, len(ensemble))).logits(inputs[s : s + chunk]).argmax(-1)
                for s in range(0, len(ensemble), chunk)
            ]
        )  # (M, B, L)
        target = targets.clamp(min=0)
        same_sign = sign.expand(-1, predicted.shape[1], -1).gather(-1, predicted) == sign.expand(
            -1, target.shape[1], -1
        ).gather(-1, target)
        out[n] = ((predicted == targets) & mask, same_sign & mask, mask)
    return out


def _seen_words(tasks, cfg) -> dict:
    """Per group, which evaluation words at the training length occur in each seed's training stream:
    ``{group: (seeds, B) bool}``."""
    from posenc.lab import experiments as ex

    seen = {}
    for task in tasks:
        words = list(map(tuple, ex.evaluation_data(task, cfg.train_length, cfg)[0].tolist()))
        trained = [training_words(task, cfg, seed) for seed in cfg.seeds]
        seen[task.group] = torch.tensor([[w in stream for w in words] for stream in trained])
    return seen


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
    n_train = cfg.train_length
    seen = _seen_words(dict.fromkeys(t for t, _ in plan), cfg)
    result = {}
    for p, (task, name) in enumerate(plan):
        part = slice(p * seeds, (p + 1) * seeds)
        entry = result.setdefault(
            task.group,
            {
                "accuracy": {},
                "sequence_se": {},
                "position": {},
                "sign_position": {},
                "beyond": {"accuracy": {}, "sign": {}},
                "unseen_accuracy": {},
                "seen_fraction": seen[task.group].double().mean(1).tolist(),
                "final_loss": {},
            },
        )
        correct, same_sign, mask = ({n: scores[n][i][part] for n in cfg.eval_lengths} for i in range(3))
        per_sequence = {n: correct[n].sum(-1) / mask[n].sum(-1) for n in cfg.eval_lengths}
        entry["accuracy"][name] = {str(n): acc.mean(1).tolist() for n, acc in per_sequence.items()}
        entry["sequence_se"][name] = {
            str(n): (acc.std(1) / acc.shape[1] ** 0.5).tolist() for n, acc in per_sequence.items()
        }
        for key, hits in (("position", correct), ("sign_position", same_sign)):
            entry[key][name] = {
                str(n): (hits[n].sum(1) / mask[n].sum(1).clamp(min=1)).mean(0).tolist() for n in cfg.eval_lengths
            }
        for key, hits in (("accuracy", correct), ("sign", same_sign)):  # positions >= n_train, never trained on
            entry["beyond"][key][name] = {
                str(n): (hits[n][..., n_train:].sum((1, 2)) / mask[n][..., n_train:].sum((1, 2))).tolist()
                for n in cfg.eval_lengths
                if n > n_train
            }
        unseen = ~seen[task.group]
        entry["unseen_accuracy"][name] = (
            (per_sequence[n_train] * unseen).sum(1) / unseen.sum(1)
        ).tolist()  # accuracy at the training length on the words no training batch of the seed held
        entry["final_loss"][name] = losses[part, -1].tolist()
        if progress is not None:
            progress(f"{task.group} {name:14s} loss " + " ".join(f"{v:.3f}" for v in entry["final_loss"][name]))
    result["seconds"] = time.perf_counter() - start
    return result


def record(names=NAMES, groups=GROUPS, progress=print) -> dict:
    """The results file: the task, the configuration, ``run`` at :data:`STEPS` and the budget check (``run`` at
    ``BUDGET_FACTOR`` times the steps on :data:`BUDGET_SEEDS`) under ``"budget"``, the A5 probe (``run`` of
    :data:`A5_NAMES` with :func:`a5_config`) under ``"a5"``, and how it was made
    (:func:`posenc.lab.results.provenance`)."""
    from posenc.lab import tasks as task_module
    from posenc.lab.results import provenance

    names = list(names)
    cfg = config()
    main = run(names, groups, cfg, progress)
    budget_cfg = config(steps=BUDGET_FACTOR * cfg.steps, seeds=BUDGET_SEEDS)
    budget = run(names, groups, budget_cfg, progress)
    a5_cfg = a5_config()
    a5 = run(A5_NAMES, ["A5"], a5_cfg, progress)
    return {
        "task": {
            "name": "WordProblem",
            "groups": list(groups),
            "chance": {g: 1 / task_module.WordProblem(g).size for g in groups},
        },
        "config": {key: list(v) if isinstance(v, tuple) else v for key, v in dataclasses.asdict(cfg).items()},
        "names": names,
        "labels": {name: label(name) for name in names},
        **main,
        "budget": {"steps": budget_cfg.steps, "seeds": list(BUDGET_SEEDS), **budget},
        "a5": {
            "steps": a5_cfg.steps,
            "seeds": list(a5_cfg.seeds),
            "vocab_size": a5_cfg.vocab_size,
            "chance": 1 / task_module.WordProblem("A5").size,
            "names": list(A5_NAMES),
            **a5,
        },
        **provenance(1, "book.tools.beyond_axioms"),
    }
