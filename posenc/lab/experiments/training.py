"""Train and evaluate the small transformers of :mod:`~posenc.lab.experiments.model` on the tasks of
:mod:`posenc.lab.tasks`, many at once.

Training and evaluation run many models side by side in an :class:`Ensemble` (a
:class:`~posenc.lab.experiments.model.ModelStack` that also keeps the models and their names); :func:`run_plan`
trains any list of ``(task, encoding)`` pairs together. Everything is seeded: one plan always gives the same
numbers on one machine.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..._checks import require_int
from ...rope import RotaryEmbedding
from .. import tables
from ..tasks import IGNORE_INDEX, CopyTask
from .config import ExperimentConfig
from .model import ModelStack, TinyTransformer, build_model, stacked_parameters
from .registry import encoding_label, registered


@dataclass
class Run:
    """One trained model: its training losses and accuracy per evaluation length."""

    task: str
    encoding: str
    seed: int
    losses: list
    accuracy: dict = field(default_factory=dict)  # length -> accuracy over all targets
    position_accuracy: dict = field(default_factory=dict)  # length -> (L,) accuracy per position (NaN: no target)
    model: nn.Module | None = None  # the trained model


def _learning_rate_factor(step: int, config: ExperimentConfig) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * progress))


class Ensemble(ModelStack):
    """Several models of one configuration trained side by side: every parameter stacked along a leading model
    axis, one batched operation per step of the forward pass instead of one per model (:class:`ModelStack`).

    ``name``: an encoding name (one model per seed of ``config``) or a list of names (one group of
    ``len(config.seeds)`` models per name, in that order: model ``g * n_seeds + s`` has name ``g`` and seed
    ``s``). ``models``: one model per name and seed to continue from instead (a fine-tune; they are copied, the
    originals stay as they are).

    The models never mix: each has its own initialisation, data and loss, and AdamW updates every parameter entry
    on its own, so this is the same computation as training them one by one, up to float rounding (a batched
    matrix product may add in another order), with far fewer Python calls. Consecutive models whose encodings
    are equivalent (no parameters, same class, equal tables) share one call of the encoding; an encoding with
    parameters (the learned table; the "content" encodings CoPE, FoX, PaTH) is called once per model, through
    ``vmap``.
    """

    def __init__(self, name, config: ExperimentConfig, device=None, models=None):
        names = [name] if isinstance(name, str) else list(name)
        for each in names:
            registered(each)
        if models is None:
            models = [build_model(each, config, seed, device) for each in names for seed in config.seeds]
        else:  # continue from trained models (a fine-tune): copies, so the originals stay as they are
            if len(models) != len(names) * len(config.seeds):
                raise ValueError(
                    f"models must hold one model per seed ({len(config.seeds)}) and encoding name, got {len(models)}"
                )
            models = [copy.deepcopy(model).to(device) for model in models]
        self.name, self.names = name, [each for each in names for _ in config.seeds]
        self._stack(models, config)

    @classmethod
    def from_models(cls, models: list, config: ExperimentConfig) -> Ensemble:
        """A stack of copies of built :class:`TinyTransformer` models of ``config``, with any encodings."""
        if not models or not all(isinstance(model, TinyTransformer) for model in models):
            raise TypeError("models must be a non-empty list of TinyTransformer")
        ensemble = cls.__new__(cls)
        ensemble.name, ensemble.names = None, [None] * len(models)
        ensemble._stack([copy.deepcopy(model) for model in models], config)
        return ensemble

    def _stack(self, models: list, config: ExperimentConfig):
        self.config, self.models = config, models
        first = models[0]
        super().__init__(*stacked_parameters(models), first.blocks[0].n_heads, len(first.blocks))

    def part(self, start: int, stop: int) -> Ensemble:
        """Models ``start .. stop - 1`` as an ensemble that shares this one's parameters (views, no copy)."""
        part = super().part(start, stop)
        part.names, part.models = self.names[start:stop], self.models[start:stop]
        return part

    def parameters(self) -> list:
        """Every stacked parameter tensor, for the optimiser."""
        return list(self.params.values()) + [p for group in self.encoding_params for p in group.values()]

    def trained_models(self) -> list:
        """One ordinary :class:`TinyTransformer` per model, holding the trained weights."""
        with torch.no_grad():
            for index, model in enumerate(self.models):
                for key, parameter in model.named_parameters():
                    if not key.startswith("encoding."):
                        parameter.copy_(self.params[key][index])
            for (start, stop, _, _), params in zip(self.groups, self.encoding_params):
                for index in range(start, stop):
                    for key, parameter in self.models[index].encoding.named_parameters():
                        parameter.copy_(params[key][index - start])
        return self.models


def train(task, name, config: ExperimentConfig, device=None, models=None):
    """Train one model per seed and encoding with AdamW on freshly drawn batches of length
    ``config.train_length``, all of them side by side in one :class:`Ensemble`.

    ``name``: an encoding name or a list of them; ``task``: one task for all, or a list with one task per name.
    ``models``: one model per name and seed to continue from (a fine-tune; copied, not changed), else fresh ones.
    Each seed draws its data from its own generator, so a seed sees the same batches whatever else is trained.
    Returns the :class:`Ensemble` and the losses, a float tensor ``(n_models, steps)``.
    """
    ensemble = Ensemble(name, config, device, models)
    names = [name] if isinstance(name, str) else list(name)
    task_list = list(task) if isinstance(task, (list, tuple)) else [task] * len(names)
    if len(task_list) != len(names) or not all(isinstance(t, CopyTask) for t in task_list):
        raise ValueError(f"task must be a CopyTask or a list of {len(names)} CopyTasks (one per name), got {task!r}")
    # one data stream per (task, seed); model g * n_seeds + s reads stream (task g, seed s)
    keys = list(dict.fromkeys((id(t), seed) for t in task_list for seed in config.seeds))
    streams = {key: torch.Generator().manual_seed(key[1]) for key in keys}
    task_of = {id(t): t for t in task_list}
    reads = torch.tensor([keys.index((id(t), seed)) for t in task_list for seed in config.seeds])
    optimizer = torch.optim.AdamW(
        ensemble.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay, foreach=True
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate_factor(step, config))
    losses = []
    for _ in range(config.steps):
        batches = [
            task_of[key[0]].sample(config.batch_size, config.train_length, config.vocab_size, streams[key], device)
            for key in keys
        ]
        inputs, targets = (torch.stack(parts)[reads.to(parts[0].device)] for parts in list(zip(*batches))[:2])
        per_token = nn.functional.cross_entropy(
            ensemble.logits(inputs).flatten(0, 2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(len(reads), -1)
        per_model = per_token.sum(1) / (targets != IGNORE_INDEX).flatten(1).sum(1)
        optimizer.zero_grad(set_to_none=True)
        per_model.sum().backward()  # the models share no parameter, so each gets the gradient of its own loss
        optimizer.step()
        schedule.step()
        losses.append(per_model.detach())
    return ensemble, torch.stack(losses, dim=1).cpu()


def evaluation_data(task: CopyTask, length: int, config: ExperimentConfig, device=None):
    """The fixed evaluation batch at ``length`` (the same for every encoding and seed)."""
    generator = torch.Generator().manual_seed(config.eval_seed + length)
    return task.sample(config.eval_batch(length), length, config.vocab_size, generator, device)


@torch.no_grad()
def evaluate(model: TinyTransformer, task: CopyTask, length: int, config: ExperimentConfig):
    """Accuracy of the most likely token on the evaluation batch: ``(overall, per_position (L,))``."""
    device = next(model.parameters()).device
    return batch_accuracy(model, *evaluation_data(task, length, config, device))


@torch.no_grad()
def batch_accuracy(model: TinyTransformer, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """Accuracy of ``model``'s most likely token on one batch ``inputs``, ``targets``, ``mask`` (each ``(B, L)``):
    ``(overall, per_position (L,))``, per position NaN where there is no target."""
    model.eval()
    correct = (model(inputs).argmax(dim=-1) == targets) & mask
    per_position = correct.sum(0).float() / mask.sum(0).float()
    return (correct.sum() / mask.sum()).item(), per_position.cpu()


#: Largest attention-score tensor (elements) one evaluation chunk of stacked models may build (128 MB in float32).
EVAL_CHUNK_SCORES = 2**25


@torch.no_grad()
def evaluate_ensemble(ensemble: Ensemble, tasks, length: int, config: ExperimentConfig):
    """:func:`evaluate` for every model of ``ensemble`` at once (in chunks of models, see
    :data:`EVAL_CHUNK_SCORES`): ``tasks`` one task for all or one per model. Returns ``(overall (M,),
    per_position (M, L))`` on the CPU."""
    tasks = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks] * len(ensemble)
    if len(tasks) != len(ensemble):
        raise ValueError(f"tasks must hold one task per model ({len(ensemble)}), got {len(tasks)}")
    data = {id(task): evaluation_data(task, length, config, ensemble.device) for task in tasks}
    batch = config.eval_batch(length)
    chunk = max(1, EVAL_CHUNK_SCORES // (batch * ensemble.n_heads * length * length))
    overall, per_position = [], []
    for start in range(0, len(ensemble), chunk):
        stop = min(start + chunk, len(ensemble))
        inputs, targets, mask = (torch.stack(parts) for parts in zip(*(data[id(t)] for t in tasks[start:stop])))
        correct = (ensemble.part(start, stop).logits(inputs).argmax(dim=-1) == targets) & mask  # (m, B, L)
        overall.append(correct.flatten(1).sum(1) / mask.flatten(1).sum(1))
        per_position.append(correct.sum(1).float() / mask.sum(1).float())  # NaN where no target
    return torch.cat(overall).cpu(), torch.cat(per_position).cpu()


def accuracies(models: list, task: CopyTask, config: ExperimentConfig, lengths=None) -> torch.Tensor:
    """Accuracy of each model (one per seed) at each of ``lengths`` (default ``config.eval_lengths``):
    ``(n_models, n_lengths)``, all models evaluated together."""
    lengths = config.eval_lengths if lengths is None else tuple(lengths)
    ensemble = Ensemble.from_models(models, config)
    return torch.stack([evaluate_ensemble(ensemble, task, length, config)[0] for length in lengths], dim=1)


@torch.no_grad()
def sequence_accuracies(models: list, inputs, targets, mask, config: ExperimentConfig, max_scores: int = 2**22):
    """Each model's most-likely-token accuracy on each sequence of one batch ``inputs``, ``targets``, ``mask`` (each
    ``(B, L)``): ``models`` (built :class:`TinyTransformer` of ``config``) run side by side as one :class:`Ensemble`,
    in chunks of sequences whose attention scores stay under ``max_scores`` elements. Returns ``(pooled (M,), per
    sequence (M, B))``: pooled over all targets, per sequence float64 and NaN where a row has no target."""
    ensemble = Ensemble.from_models(models, config)
    n_models, length = len(models), inputs.shape[1]
    step = max(1, max_scores // (n_models * ensemble.n_heads * length * length))
    correct = []
    for start in range(0, len(inputs), step):
        batch = [part[start : start + step].expand(n_models, -1, -1) for part in (inputs, targets, mask)]
        correct.append((ensemble.logits(batch[0]).argmax(dim=-1) == batch[1]) & batch[2])  # (M, b, L)
    correct = torch.cat(correct, dim=1)
    per_sequence = correct.sum(2).double() / mask.sum(1).double()
    return correct.flatten(1).sum(1) / mask.sum(), per_sequence


def run_plan(plan, config: ExperimentConfig, device=None, progress=None) -> list:
    """Train every ``(task, encoding name)`` of ``plan`` with every seed, all side by side in one
    :class:`Ensemble`, and evaluate them at every length: one :class:`Run` per pair and seed, in plan order.
    ``progress(runs)`` is called with the runs of each pair once all are evaluated."""
    plan = list(plan)
    for _, name in plan:
        registered(name)
    tasks = [task for task, _ in plan]
    ensemble, losses = train(tasks, [name for _, name in plan], config, device)
    per_model = [task for task in tasks for _ in config.seeds]
    results = {length: evaluate_ensemble(ensemble, per_model, length, config) for length in config.eval_lengths}
    models, seeds, runs = ensemble.trained_models(), len(config.seeds), []
    for index, (task, name) in enumerate(plan):
        pair = []
        for offset, seed in enumerate(config.seeds):
            m = index * seeds + offset
            run = Run(task.name, name, seed, losses[m].tolist(), model=models[m])
            for length, (overall, positions) in results.items():
                run.accuracy[length], run.position_accuracy[length] = overall[m].item(), positions[m]
            pair.append(run)
        runs.extend(pair)
        if progress is not None:
            progress(pair)
    return runs


def run_encoding(task: CopyTask, name: str, config: ExperimentConfig, device=None) -> list:
    """Train encoding ``name`` on ``task`` with every seed, evaluate at every length: one :class:`Run` per seed."""
    return run_plan([(task, name)], config, device)


def run_experiments(tasks, names, config: ExperimentConfig, device=None, progress=None) -> list:
    """Every task x encoding x seed of ``config``, trained together (:func:`run_plan`); ``progress(runs)`` is
    called with the runs of each task and encoding."""
    return run_plan([(task, name) for task in tasks for name in names], config, device, progress)


def accuracy_spread(runs: list, task: str, name: str, length: int) -> tuple:
    """``(mean, min, max)`` accuracy over the seeds of one task and encoding at one length."""
    values = [run.accuracy[length] for run in runs if run.task == task and run.encoding == name]
    if not values:
        raise ValueError(f"no run of encoding {name!r} on task {task!r}")
    return sum(values) / len(values), min(values), max(values)


def mean_position_accuracy(runs: list, task: str, name: str, length: int) -> torch.Tensor:
    """Accuracy per position ``(length,)`` averaged over the seeds (NaN where there is no target)."""
    values = [run.position_accuracy[length] for run in runs if run.task == task and run.encoding == name]
    if not values:
        raise ValueError(f"no run of encoding {name!r} on task {task!r}")
    return torch.stack(values).mean(0)


def with_rope(models: list, rope_parameters: dict, original_length: int) -> list:
    """Copies of RoPE models whose rotary table is rebuilt from ``rope_parameters`` (a transformers-style dict such
    as ``{"rope_type": "yarn", "factor": 4.0}``), with ``original_length`` as the trained context (transformers'
    ``max_position_embeddings``; the dict may also name ``original_max_position_embeddings``)."""
    extended = []
    for model in models:
        if not isinstance(model.encoding, RotaryEmbedding):
            raise TypeError(f"models must use RoPE, got {type(model.encoding).__name__}")
        rotary = model.encoding
        base = rotary.rope_parameters.get("rope_theta", 10_000.0)
        copy_ = copy.deepcopy(model)
        copy_.encoding = RotaryEmbedding(
            rotary.head_dim,
            {"rope_theta": base, **rope_parameters},
            max_position_embeddings=original_length,
            layout=rotary.layout,
        ).to(rotary.inv_freq.device)
        extended.append(copy_)
    return extended


def fine_tune(
    models: list, task: CopyTask, config: ExperimentConfig, length: int, *, steps: int, device=None, **changes
):
    """Continue training copies of ``models`` (one per seed of ``config``) for ``steps`` steps at ``length``, with
    the optimiser and schedule of :func:`train` (warm-up over a tenth of the steps); ``changes``: other fields of
    ``config`` for the fine-tune (``batch_size=16``, ``learning_rate=...``). Returns the fine-tuned copies."""
    tuned = replace(
        config,
        train_length=require_int("length", length, minimum=1),
        steps=require_int("steps", steps, minimum=1),
        warmup_steps=max(1, steps // 10),
        **changes,
    )
    require_int("batch_size", tuned.batch_size, minimum=1)
    ensemble, _ = train(task, "rope", tuned, device, models=models)
    return ensemble.trained_models()


def results_table(runs: list, config: ExperimentConfig, baselines: dict | None = None, html: bool = False) -> str:
    """One row per task and encoding, ``mean (min-max)`` accuracy in % at each length (see
    :func:`posenc.lab.tables.format_table`).

    ``baselines``: optional ``{task name: {row label: {length: accuracy}}}``, printed as extra rows of that task.
    """
    header = ["task", "encoding"] + [
        f"L = {length} ({length // config.train_length}x)" for length in config.eval_lengths
    ]
    rows = []
    for task in dict.fromkeys(run.task for run in runs):
        for name in dict.fromkeys(run.encoding for run in runs if run.task == task):
            cells = []
            for length in config.eval_lengths:
                mean, low, high = accuracy_spread(runs, task, name, length)
                cells.append(f"{100 * mean:5.1f} ({100 * low:.0f}-{100 * high:.0f})")
            rows.append([task, encoding_label(name)] + cells)
        for label, values in (baselines or {}).get(task, {}).items():
            rows.append([task, label] + [f"{100 * values[length]:5.1f}" for length in config.eval_lengths])
    return tables.format_table(header, rows, html)


def position_probe_r2(hidden: torch.Tensor) -> float:
    """How much of the absolute position a read-out recovers from hidden states ``(B, L, d)``.

    Least squares from the features ``[h, h * h, 1]`` (squares too: a norm can carry the position) to the
    position ``i`` on the first half of the sequences, scored on the other half by ``R^2 = 1 - SSE / SST``
    (1: exact, 0: no better than always guessing the mean position).
    """
    batch, length, _ = hidden.shape
    features = torch.cat((hidden, hidden * hidden, torch.ones_like(hidden[..., :1])), -1).flatten(0, 1)
    position = torch.arange(length, dtype=hidden.dtype, device=hidden.device).repeat(batch)[:, None]
    train = torch.arange(batch * length, device=hidden.device) < (batch // 2) * length
    fit = torch.linalg.lstsq(features[train], position[train]).solution
    error = features[~train] @ fit - position[~train]
    return (1 - (error**2).sum() / ((position[~train] - position[~train].mean()) ** 2).sum()).item()
