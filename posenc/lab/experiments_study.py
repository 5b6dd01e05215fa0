"""Chapter 11's trained study: ALiBi's slope family and the budget check on fetch, and the chapter's attention probes.

Two parts, both in chapter 11's harness (:mod:`posenc.lab.experiments`, its default
:class:`~posenc.lab.experiments.ExperimentConfig`) and written by ``make experiments-study``
(``book/tools/experiments_study.py``) to :data:`RESULTS_FILE`, which chapter 11 reads:

* ``"slopes"``: ALiBi's family on both tasks at the chapter's budget and seeds: the standard schedule ``"alibi"``
  and the fixed schedules of :data:`SLOPE_FAMILY`. Each model is scored on the table's fixed sequences at every
  length, on a validation batch at 2L (:func:`validation_config`, which picks the best member) and on fresh
  sequences at 32L (:func:`fresh_config`), per sequence.
* ``"budget"``: every encoding that fails fetch at the chapter's 200 steps (:data:`BUDGET_NAMES`), trained again on
  :data:`BUDGET_SEEDS` with the chapter's steps and with :data:`BUDGET_FACTOR` times them, each scored at every
  length on the fresh sequences, per sequence, so that a failure at 200 steps is not read as what an encoding cannot
  do. Bidirectional NoPE is the control that must stay at the position-blind ceiling whatever the budget.
* ``"budget_copy_back"``: the same check on copy-back for the standard ALiBi schedule, which fails it at 200 steps,
  and causal NoPE, its no-encoding control (:data:`COPY_BACK_BUDGET_NAMES`), at :data:`BUDGET_FACTOR` times the
  chapter's steps, scored the same way (``make experiments-study`` remakes it alone with ``--only copy-back-budget``).
* ``"table"``: the models of the chapter's own table whose text scores them on fresh sequences
  (:data:`TABLE_NAMES`), trained again as the chapter trains them and scored per sequence on the fresh sequences at
  16L and 32L (:data:`TABLE_FACTORS`), so that the chapter reads these scores instead of computing them
  (``--only table`` remakes it alone). The chapter checks its own models' table accuracies against the file's.
* ``"families"``: xPos's damping scale, RoPE's base and the undamped Jordan block's base (with its coupling-free
  control at the same bases) judged as ALiBi's slopes are (:data:`FAMILIES`: the chapter's ``"xpos"``, ``B = 512``,
  ``"rope"``, ``"jordan"`` and ``"jordan-rotation"``, base ``10^4``, with the other members), on copy-back,
  :data:`FAMILY_SEEDS`,
  the chapter's steps; each model scored on the 2L validation batch and on the fresh sequences at every length
  (``--only families`` remakes it alone).

Training is seeded and deterministic on one CPU, and a model's numbers do not depend on what else is trained beside
it, so the chapter's live runs reproduce the file where the CPU, threads and torch match
(:func:`posenc.lab.results.same_platform`).
The probes :func:`far_attention` and :func:`attention_by_offset` read the last block's attention of trained models.
"""

from __future__ import annotations

import dataclasses
import fractions

import torch

from . import experiments as ex
from .results import DATA_DIR, read_json
from .tasks import CopyBack, FetchPosition

RESULTS_FILE = DATA_DIR / "experiments_study.json"
#: ALiBi's fixed four-head schedules besides the standard ``2^(-8h/n)`` (1/4, 1/16, 1/64, 1/256 for four heads)
SLOPE_FAMILY = {"alibi-1": (1.0, 0.5, 0.25, 0.125), "alibi-4": (4.0, 2.0, 1.0, 0.5)}
FAMILY = ("alibi", *SLOPE_FAMILY)
VALIDATION_SEED, FRESH_SEED = 1_000, 2_000  # offsets of the evaluation seed: sequences no table number uses
FRESH_SEQUENCES = 128  # at 32L; shorter lengths get 256 (the harness's cap), about as many tokens
BUDGET_FACTOR, BUDGET_SEEDS = 3, (0, 1, 2)
BUDGET_NAMES = ("nope-bidirectional", "nope-causal", "rope", "xpos", "alibi", *SLOPE_FAMILY)
COPY_BACK_BUDGET_NAMES = ("nope-causal", "alibi")
#: per task of :func:`chapter_tasks`, the table's encodings the chapter scores on fresh sequences, at these multiples
#: of the training length
TABLE_NAMES = (
    ("nope-causal", "jordan-damped", "jordan-rotation-damped"),
    ("nope-bidirectional", "nope-causal", "sinusoidal", "learned", "rope", "alibi", "xpos"),
)
TABLE_FACTORS = (16, 32)
#: xPos's damping scale ``B`` (the chapter's ``"xpos"`` has ``B = 512``) and RoPE's base (``"rope"`` has ``10^4``)
XPOS_SCALES = {"xpos-8": 8.0, "xpos-32": 32.0, "xpos-128": 128.0}
ROPE_BASES = {"rope-1e5": 1e5, "rope-1e6": 1e6, "rope-1e7": 1e7, "rope-1e8": 1e8}
#: the undamped Jordan block's base (``"jordan"`` has ``10^4``: frequencies 1 and 10^-2 at d_h = 8) and, at the same
#: bases, its control without the coupling (``"jordan-rotation"``)
JORDAN_BASES = {"jordan-1e5": 1e5, "jordan-1e6": 1e6, "jordan-1e8": 1e8}
JORDAN_ROTATION_BASES = {"jordan-rotation-1e5": 1e5, "jordan-rotation-1e6": 1e6, "jordan-rotation-1e8": 1e8}
FAMILIES = {
    "xpos": ("xpos", *XPOS_SCALES),
    "rope": ("rope", *ROPE_BASES),
    "jordan": ("jordan", *JORDAN_BASES),
    "jordan-rotation": ("jordan-rotation", *JORDAN_ROTATION_BASES),
}
FAMILY_SEEDS = (0, 1, 2)


def chapter_tasks() -> list:
    """Chapter 11's two tasks: copy 2 back (relative) and fetch position 1 (absolute)."""
    return [CopyBack(2), FetchPosition(1)]


def slope_label(slopes) -> str:
    """``"ALiBi, slopes 1, 1/2, 1/4, 1/8"``: the label of a fixed schedule, slopes as fractions."""
    return "ALiBi, slopes " + ", ".join(str(fractions.Fraction(m)) for m in slopes)


def register_slope_family() -> list:
    """Add the schedules of :data:`SLOPE_FAMILY` to the harness (:func:`~posenc.lab.experiments.add_encoding`, safe
    to call again); returns their names."""
    from ..alibi import ALiBi

    return [
        ex.add_encoding(name, slope_label(slopes), lambda c, slopes=slopes: ALiBi(c.n_heads, slopes=slopes))
        for name, slopes in SLOPE_FAMILY.items()
    ]


def _base_label(label: str, base: float) -> str:
    return f"{label}, base {base:.0e}".replace("e+0", "e")


def register_families() -> list:
    """Add the members of :data:`XPOS_SCALES`, :data:`ROPE_BASES`, :data:`JORDAN_BASES` and
    :data:`JORDAN_ROTATION_BASES` to the harness (safe to call again); returns their names."""
    from ..generators import jordan_generator, xpos_generator
    from ..group_encodings import GroupEncoding
    from ..rope import RotaryEmbedding

    names = [
        ex.add_encoding(
            name, f"xPos, B = {scale:g}", lambda c, s=scale: GroupEncoding(xpos_generator(c.head_dim, scale_base=s))
        )
        for name, scale in XPOS_SCALES.items()
    ]
    names += [
        ex.add_encoding(
            name,
            _base_label("RoPE", base),
            lambda c, b=base: RotaryEmbedding(c.head_dim, rope_parameters={"rope_type": "default", "rope_theta": b}),
        )
        for name, base in ROPE_BASES.items()
    ]
    names += [
        ex.add_encoding(
            name,
            _base_label("Jordan block", base),
            lambda c, b=base: GroupEncoding(jordan_generator(c.head_dim, base=b)),
        )
        for name, base in JORDAN_BASES.items()
    ]
    return names + [
        ex.add_encoding(
            name,
            _base_label("rotation at Jordan's frequencies", base),
            lambda c, b=base: GroupEncoding(ex.jordan_rotation_generator(c.head_dim, base=b)),
        )
        for name, base in JORDAN_ROTATION_BASES.items()
    ]


def validation_config(config: ex.ExperimentConfig) -> ex.ExperimentConfig:
    """``config`` with the validation batches: another evaluation seed, the harness's batch sizes."""
    return dataclasses.replace(config, eval_seed=config.eval_seed + VALIDATION_SEED)


def fresh_config(config: ex.ExperimentConfig) -> ex.ExperimentConfig:
    """``config`` with the fresh batches: another evaluation seed and :data:`FRESH_SEQUENCES` sequences at the
    longest length (more at shorter ones, up to ``eval_batch_size``)."""
    return dataclasses.replace(
        config, eval_seed=config.eval_seed + FRESH_SEED, eval_tokens=FRESH_SEQUENCES * max(config.eval_lengths)
    )


def _last_block_weights(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), ex.threads(1):
        model.eval()
        return model(tokens, return_weights=True)[1][-1]  # (B, H, L, L)


def _check_probe(models, tokens, from_query: int) -> None:
    if not models:
        raise ValueError("models must hold at least one trained model")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise TypeError(f"tokens must be a (B, L) tensor, got {getattr(tokens, 'shape', type(tokens).__name__)}")
    if not 0 <= from_query < tokens.shape[1]:
        raise ValueError(f"from_query must lie in [0, {tokens.shape[1]}), got {from_query}")


def far_attention(models: list, tokens: torch.Tensor, beyond: int, from_query: int) -> torch.Tensor:
    """Attention weight of each model's last block on keys more than ``beyond`` positions back, for the queries from
    ``from_query`` on, averaged over the sequences ``tokens`` ``(B, L)``, the heads and those queries: ``(models,)``."""
    _check_probe(models, tokens, from_query)
    length = tokens.shape[1]
    offsets = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # (L, L): query minus key
    return torch.tensor(
        [(_last_block_weights(m, tokens) * (offsets > beyond)).sum(-1)[..., from_query:].mean().item() for m in models]
    )


def attention_by_offset(models: list, tokens: torch.Tensor, from_query: int) -> torch.Tensor:
    """Each model's last-block attention at each offset ``0 .. L-1`` for the queries from ``from_query`` on: the
    weights on keys at that offset, summed, then averaged over the sequences ``tokens`` ``(B, L)``, the heads and
    the queries. Returns ``(models, L)``; a causal model's rows sum to 1."""
    _check_probe(models, tokens, from_query)
    length = tokens.shape[1]
    offsets = (torch.arange(length)[:, None] - torch.arange(length)[None, :])[from_query:].clamp(min=0)  # (Q, L)
    profiles = []
    for model in models:
        w = _last_block_weights(model, tokens)[..., from_query:, :].mean((0, 1))  # (Q, L)
        profiles.append(torch.zeros(length).scatter_add_(0, offsets.flatten(), w.flatten()) / w.shape[0])
    return torch.stack(profiles)


def _counts(models: list, task, length: int, data: ex.ExperimentConfig) -> tuple:
    """``(per model [per sequence correct targets], targets per sequence)`` on ``data``'s batch at ``length``."""
    mask = ex.evaluation_data(task, length, data)[2]
    targets = mask.sum(-1)
    if not (targets == targets[0]).all():
        raise ValueError(f"the sequences of {task.name} at {length} hold different numbers of targets")
    with ex.threads(1):
        per_sequence = ex.sequence_accuracies(models, *ex.evaluation_data(task, length, data), data)[1]
    correct = (per_sequence * targets).round().long()
    return correct.tolist(), int(targets[0])


def _per_seed(runs: list, names, tasks, config: ex.ExperimentConfig, fresh_lengths, progress=None) -> dict:
    """The record of trained ``runs``: per task and name, per seed the table's accuracy at every length, the final
    loss, and on the fresh sequences at ``fresh_lengths`` the correct targets per sequence (``"fresh"``:
    ``{length: [per seed [per sequence]]}``, of ``"fresh_targets"[length]`` targets each)."""
    fresh = fresh_config(config)
    out = {}
    for task in tasks:
        for name in names:
            group = [r for r in runs if r.task == task.name and r.encoding == name]
            if not group:
                continue
            counts = {str(n): _counts([r.model for r in group], task, n, fresh) for n in fresh_lengths}
            out.setdefault(task.name, {})[name] = {
                "seeds": [r.seed for r in group],
                "accuracy": {str(n): [r.accuracy[n] for r in group] for n in config.eval_lengths},
                "final_loss": [r.losses[-1] for r in group],
                "fresh": {n: correct for n, (correct, _) in counts.items()},
                "fresh_targets": {n: targets for n, (_, targets) in counts.items()},
            }
            if progress is not None:
                progress(task.name, name, out[task.name][name])
    return out


def fresh_accuracy(entry: dict, length: int, key: str = "fresh") -> torch.Tensor:
    """One record entry's per-sequence accuracies on its fresh (or ``key="validation"``) sequences at ``length``:
    ``(seeds, sequences)``, float64."""
    return torch.tensor(entry[key][str(length)], dtype=torch.float64) / entry[key + "_targets"][str(length)]


def slope_study(config: ex.ExperimentConfig | None = None, progress=None) -> dict:
    """ALiBi's family (:data:`FAMILY`) on both tasks, every seed of ``config`` (default: the chapter's): per task and
    member the table's accuracies, final losses, the 2L validation batch per sequence (``"validation"``) and the
    fresh 32L sequences (``"fresh"``), both as correct targets per sequence (:func:`fresh_accuracy` reads them)."""
    config = ex.ExperimentConfig() if config is None else config
    register_slope_family()
    tasks = chapter_tasks()
    with ex.threads(1):
        runs = ex.run_plan([(task, name) for task in tasks for name in FAMILY], config)
    result = _per_seed(runs, FAMILY, tasks, config, [max(config.eval_lengths)])
    _add_validation(result, runs, FAMILY, tasks, config, progress)
    return result


def _add_validation(result: dict, runs: list, names, tasks, config: ex.ExperimentConfig, progress=None) -> None:
    """Add to each ``result[task][name]`` its models' correct targets per sequence on the 2L validation batch."""
    validation, at = validation_config(config), 2 * config.train_length
    for task in tasks:
        for name in names:
            models = [r.model for r in runs if r.task == task.name and r.encoding == name]
            correct, targets = _counts(models, task, at, validation)
            result[task.name][name].update(validation={str(at): correct}, validation_targets={str(at): targets})
            if progress is not None:
                progress(task.name, name, result[task.name][name])


def families_study(config: ex.ExperimentConfig | None = None, progress=None, families=None) -> dict:
    """The families of :data:`FAMILIES` (or those named in ``families``) on copy-back, :data:`FAMILY_SEEDS`,
    ``config.steps``: ``{family: {name: per seed record}}`` with the table's accuracies, the 2L validation batch and
    the fresh sequences at every length, per sequence (:func:`fresh_accuracy` reads both)."""
    config = dataclasses.replace(ex.ExperimentConfig() if config is None else config, seeds=FAMILY_SEEDS)
    register_families()
    unknown = set(families or ()) - set(FAMILIES)
    if unknown:
        raise ValueError(f"families: {sorted(unknown)} are not in FAMILIES {list(FAMILIES)}")
    copy_back = chapter_tasks()[0]
    result = {}
    for family, names in FAMILIES.items():
        if families is not None and family not in families:
            continue
        with ex.threads(1):
            runs = ex.run_plan([(copy_back, name) for name in names], config)
        part = _per_seed(runs, names, [copy_back], config, config.eval_lengths)
        _add_validation(part, runs, names, [copy_back], config, progress)
        result[family] = part[copy_back.name]
    return result


def budget_study(config: ex.ExperimentConfig | None = None, progress=None) -> dict:
    """Fetch with every encoding of :data:`BUDGET_NAMES` on :data:`BUDGET_SEEDS`, at ``config.steps`` and at
    :data:`BUDGET_FACTOR` times them: ``{str(steps): {name: per seed record}}``, every length scored on the fresh
    sequences, per sequence."""
    config = ex.ExperimentConfig() if config is None else config
    register_slope_family()
    fetch = chapter_tasks()[1]
    result = {}
    for steps in (config.steps, BUDGET_FACTOR * config.steps):
        budget = dataclasses.replace(config, steps=steps, seeds=BUDGET_SEEDS)
        with ex.threads(1):
            runs = ex.run_plan([(fetch, name) for name in BUDGET_NAMES], budget)
        result[str(steps)] = _per_seed(runs, BUDGET_NAMES, [fetch], budget, config.eval_lengths, progress)[fetch.name]
    return result


def copy_back_budget_study(config: ex.ExperimentConfig | None = None, progress=None) -> dict:
    """Copy-back with every encoding of :data:`COPY_BACK_BUDGET_NAMES` on :data:`BUDGET_SEEDS` at
    :data:`BUDGET_FACTOR` times ``config.steps``: ``{str(steps): {name: per seed record}}``, every length scored on
    the fresh sequences, per sequence (the 200-step models are the slope part's and the table's)."""
    config = ex.ExperimentConfig() if config is None else config
    copy_back = chapter_tasks()[0]
    budget = dataclasses.replace(config, steps=BUDGET_FACTOR * config.steps, seeds=BUDGET_SEEDS)
    with ex.threads(1):
        runs = ex.run_plan([(copy_back, name) for name in COPY_BACK_BUDGET_NAMES], budget)
    part = _per_seed(runs, COPY_BACK_BUDGET_NAMES, [copy_back], budget, config.eval_lengths, progress)
    return {str(budget.steps): part[copy_back.name]}


def table_study(config: ex.ExperimentConfig | None = None, progress=None) -> dict:
    """The chapter's table models of :data:`TABLE_NAMES`, every seed of ``config`` (default: the chapter's), trained
    as the chapter trains them: ``{task: {name: per seed record}}``, scored per sequence on the fresh sequences at
    :data:`TABLE_FACTORS` times the training length (:func:`fresh_accuracy` reads them)."""
    config = ex.ExperimentConfig() if config is None else config
    tasks = chapter_tasks()
    with ex.threads(1):
        runs = ex.run_plan([(task, name) for task, names in zip(tasks, TABLE_NAMES) for name in names], config)
    lengths = [factor * config.train_length for factor in TABLE_FACTORS]
    result = {}
    for task, names in zip(tasks, TABLE_NAMES):
        result.update(_per_seed(runs, names, [task], config, lengths, progress))
    return result


def record(
    slopes: dict,
    budget: dict,
    config: ex.ExperimentConfig | None = None,
    budget_copy_back: dict | None = None,
    table: dict | None = None,
    families: dict | None = None,
) -> dict:
    """The results file: the configuration, the study's constants, the five parts and how it was made
    (:func:`posenc.lab.results.provenance`, one thread)."""
    from .results import provenance

    parts = {"slopes": slopes, "budget": budget, "budget_copy_back": budget_copy_back or {}, "table": table or {}}
    parts["families"] = families or {}
    fields = plan(config)
    assert not set(fields) & set(parts), "a part would overwrite a plan field"
    return {**fields, **parts, **provenance(1, "book.tools.experiments_study")}


def plan(config: ex.ExperimentConfig | None = None) -> dict:
    """What the file must have been made with (checked by :func:`load`): config, tasks, family, budget."""
    config = ex.ExperimentConfig() if config is None else config
    register_slope_family()
    register_families()
    return {
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()},
        "tasks": [task.name for task in chapter_tasks()],
        "family": {name: ex.encoding_label(name) for name in FAMILY},
        "slope_family": {name: list(slopes) for name, slopes in SLOPE_FAMILY.items()},
        "validation_seed": VALIDATION_SEED,
        "fresh_seed": FRESH_SEED,
        "fresh_sequences": FRESH_SEQUENCES,
        "budget_steps": [config.steps, BUDGET_FACTOR * config.steps],
        "budget_seeds": list(BUDGET_SEEDS),
        "budget_names": {name: ex.encoding_label(name) for name in BUDGET_NAMES},
        "budget_copy_back_names": {name: ex.encoding_label(name) for name in COPY_BACK_BUDGET_NAMES},
        "table_names": {task.name: list(names) for task, names in zip(chapter_tasks(), TABLE_NAMES)},
        "table_lengths": [factor * config.train_length for factor in TABLE_FACTORS],
        "family_members": {
            family: {name: ex.encoding_label(name) for name in names} for family, names in FAMILIES.items()
        },
        "family_seeds": list(FAMILY_SEEDS),
    }


def load(path=None) -> dict:
    """Read the committed study (default :data:`RESULTS_FILE`), checked: ValueError names a field that disagrees
    with this module's plan, a table model or length missing from ``"table"`` (or a member from ``"families"``), or
    an accuracy outside [0, 1]; FileNotFoundError says how to make the file."""
    path, data = read_json(RESULTS_FILE.name, path, "chapter 11 study", "`make experiments-study` remakes it")
    expected = plan()
    for key, value in expected.items():
        if data.get(key) != value:
            raise ValueError(f"{path.name}: field {key!r} is {data.get(key)!r}, the code says {value!r}: remake it")
    lengths = sorted(str(n) for n in expected["table_lengths"])
    for task, names in expected["table_names"].items():
        for name in names:
            entry = data.get("table", {}).get(task, {}).get(name, {})
            if entry.get("seeds") != expected["config"]["seeds"] or sorted(entry.get("fresh", {})) != lengths:
                raise ValueError(
                    f"{path.name}: table[{task!r}][{name!r}] must hold seeds {expected['config']['seeds']} scored at "
                    f"{lengths}: remake it with --only table"
                )
    lengths = sorted(str(n) for n in ex.ExperimentConfig(**expected["config"]).eval_lengths)
    for family, names in expected["family_members"].items():
        for name in names:
            entry = data.get("families", {}).get(family, {}).get(name, {})
            if entry.get("seeds") != expected["family_seeds"] or sorted(entry.get("fresh", {})) != lengths:
                raise ValueError(
                    f"{path.name}: families[{family!r}][{name!r}] must hold seeds {expected['family_seeds']} scored "
                    f"at {lengths}: remake it with --only families"
                )
    parts = [entry for key in ("slopes", "table") for per_task in data[key].values() for entry in per_task.values()]
    for key in ("budget", "budget_copy_back", "families"):
        parts += [entry for per_steps in data[key].values() for entry in per_steps.values()]
    for entry in parts:
        if not all(0 <= v <= 1 for per_length in entry["accuracy"].values() for v in per_length):
            raise ValueError(f"{path.name}: an accuracy outside [0, 1]")
        for key in ("fresh", "validation"):
            for n, rows in entry.get(key, {}).items():
                if not all(0 <= c <= entry[key + "_targets"][n] for row in rows for c in row):
                    raise ValueError(f"{path.name}: a {key} count outside [0, targets] at length {n}")
    return data


def runs_of(part: dict, task: str) -> list:
    """The table's accuracies of one part of the file (``data["slopes"]`` or ``data["budget"][steps]`` with its task
    name) as :class:`~posenc.lab.experiments.Run` objects without models, for
    :func:`~posenc.lab.experiments.accuracy_spread` and the results table."""
    runs = []
    for name, entry in part.items():
        for index, seed in enumerate(entry["seeds"]):
            accuracy = {int(n): values[index] for n, values in entry["accuracy"].items()}
            runs.append(ex.Run(task, name, seed, [entry["final_loss"][index]], accuracy))
    return runs


__all__ = [
    "RESULTS_FILE",
    "SLOPE_FAMILY",
    "FAMILY",
    "BUDGET_FACTOR",
    "BUDGET_SEEDS",
    "BUDGET_NAMES",
    "COPY_BACK_BUDGET_NAMES",
    "TABLE_NAMES",
    "TABLE_FACTORS",
    "XPOS_SCALES",
    "ROPE_BASES",
    "JORDAN_BASES",
    "JORDAN_ROTATION_BASES",
    "FAMILIES",
    "FAMILY_SEEDS",
    "chapter_tasks",
    "slope_label",
    "register_slope_family",
    "register_families",
    "validation_config",
    "fresh_config",
    "fresh_accuracy",
    "far_attention",
    "attention_by_offset",
    "slope_study",
    "budget_study",
    "copy_back_budget_study",
    "table_study",
    "families_study",
    "plan",
    "record",
    "load",
    "runs_of",
]
