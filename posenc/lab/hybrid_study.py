"""Chapter 13's trained comparison of layer patterns, in chapter 11's harness (:mod:`posenc.lab.experiments`).

Five four-layer models on chapter 11's two tasks and one content task (copy the token after the first marker, which
falls within the first few tokens at every length; :func:`deep_marker_data` moves it deep), with chapter 11's sizes,
budget and seeds (only ``n_layers`` differs):
RoPE in every layer, causal NoPE in every layer, the 3:1 hybrid (layers 0-2 RoPE, layer 3 NoPE: SmolLM3's pattern,
Llama 4's without its chunks), RNoPE-SWA (the hybrid with its RoPE layers in a sliding window of :data:`WINDOW`
tokens) and its control, the same windowed RoPE in every layer. :func:`train_study` trains them;
``book/tools/todays_models.py`` (``make todays-models``) writes the result to :data:`RESULTS_FILE`, which ships
with the package, and :func:`load_results` reads it back, checked. The 3x-budget check (:func:`train_budget`, the
target's ``--part budget``) retrains the models the chapter's trained claims are about (fetch, the marker task,
NoPE on copy-back) with 600 steps on three seeds into :data:`BUDGET_FILE` (:func:`load_budget`); the controls
(:func:`train_controls`, ``--part controls``) train the marker task's RoPE models at other bases and RNoPE-SWA with a
window as long as the training sequences into :data:`CONTROLS_FILE` (:func:`load_controls`), and in the same file
(:func:`train_controls_budget`) fetch's four models with RoPE layers and the marker task's RoPE and hybrid at θ = 10⁶
with the 3x budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

from ..layer_patterns import LocalWindow
from ..rope import RotaryEmbedding
from . import experiments as ex
from .results import DATA_DIR, cpu_name, read_json
from .tasks import CopyAfterMarker, CopyBack, FetchPosition

N_LAYERS = 4
#: The marker task's depth-varied evaluation: ``(length, depth D)`` pairs. In the ordinary evaluation the first marker,
#: and with it the source, falls within the first few tokens at every length, so longer evaluations vary only the
#: distance; :func:`deep_marker_data` moves it to depth D.
DEPTHS = ((64, 32), (256, 128), (256, 224))
WINDOW = 8  # the RoPE layers' sliding window in RNoPE-SWA: half the training length of 16
# the three the chapter compares, then RNoPE-SWA and its control (windowed RoPE in all four layers)
NAMES = ("rope", "nope-causal", "hybrid", "rnope-swa", "rope-window")
RESULTS_FILE = DATA_DIR / "todays_models.json"
#: The fresh evaluation (run by :func:`train_study`): :data:`FRESH_SEQUENCES` new sequences per length of
#: :data:`FRESH_LENGTHS` (and per depth
#: probe of :data:`DEPTHS`), drawn with seeds offset by :data:`FRESH_SEED` from the harness's fixed batches, which hold
#: only 64, 16 and 8 sequences at 4L, 16L and 32L. Every run records the pooled accuracy and the spread of its
#: per-sequence accuracies.
FRESH_LENGTHS = (64, 256, 512)
FRESH_SEQUENCES = 128
FRESH_SEED = 1_000_003


def study_config() -> ex.ExperimentConfig:
    """Chapter 11's :class:`~posenc.lab.experiments.ExperimentConfig` with :data:`N_LAYERS` layers."""
    return replace(ex.ExperimentConfig(), n_layers=N_LAYERS)


def study_tasks() -> list:
    """Chapter 11's tasks, copy-back by 2 (relative) and fetch position 1 (absolute), and copy after the first marker
    (content: the source is wherever the first marker fell, near the start at every length; at long lengths beyond any
    window)."""
    return [CopyBack(2), FetchPosition(1), CopyAfterMarker(1)]


def register() -> None:
    """Add ``"rope-window"`` (RoPE with a causal sliding window of :data:`WINDOW`, in every layer where it is used)
    and ``"rnope-swa"`` (three such layers, then causal NoPE, repeated) to the harness, and the models of
    :data:`CONTROLS_PLAN`; safe to call again."""
    _register_family("", {}, WINDOW)
    _register_family("-1e6", {"rope_theta": CONTROL_BASE}, WINDOW)
    _register_family("-1e5", {"rope_theta": 1e5}, None)
    _register_family(f"-w{WIDE_WINDOW}", {}, WIDE_WINDOW, with_full=False)


def _register_family(suffix: str, parameters: dict, window: int | None, with_full: bool = True) -> None:
    """RoPE with ``parameters`` (``{}``: the harness's, θ = 10⁴) as ``"rope" + suffix`` and the 3:1 ``"hybrid" +
    suffix`` (when ``with_full``; ``suffix`` ``""`` names the harness's own, which are built in), and with a window of
    ``window`` (``None``: none) as ``"rope-window" + suffix`` and ``"rnope-swa" + suffix`` (three windowed RoPE layers,
    then causal NoPE)."""
    base = f"θ = {parameters['rope_theta']:,.0f}, " if parameters else ""
    if suffix and with_full:
        ex.add_encoding(f"rope{suffix}", f"RoPE, {base[:-2]}", lambda c: RotaryEmbedding(c.head_dim, parameters))
        ex.add_layer_pattern(f"hybrid{suffix}", (f"rope{suffix}",) * 3 + ("nope-causal",), f"hybrid 3:1, {base[:-2]}")
    if window is not None:
        ex.add_encoding(
            f"rope-window{suffix}",
            f"RoPE, {base}sliding window {window}",
            lambda c: LocalWindow(RotaryEmbedding(c.head_dim, parameters), window),
        )
        ex.add_layer_pattern(
            f"rnope-swa{suffix}",
            (f"rope-window{suffix}",) * 3 + ("nope-causal",),
            f"RNoPE-SWA ({base}RoPE window {window}, NoPE every 4th)",
        )


def train_study(seeds=None, names=NAMES, tasks=None, threads: int = 1, device=None) -> tuple:
    """Train ``names`` on ``tasks`` (default the three of :func:`study_tasks`) with ``seeds`` (default the config's
    five),
    all side by side: ``(config, runs)``, one :class:`~posenc.lab.experiments.Run` per task, name and seed."""
    config = study_config() if seeds is None else replace(study_config(), seeds=tuple(seeds))
    plan = [(task, name) for task in (study_tasks() if tasks is None else tasks) for name in names]
    return config, _train_and_evaluate(plan, config, threads, device)


def _train_and_evaluate(plan: list, config: ex.ExperimentConfig, threads: int, device) -> list:
    """:func:`~posenc.lab.experiments.run_plan` on ``plan``, then every run's fresh evaluation (``run.fresh``) and,
    on the marker task, its accuracy per :func:`depth_key` of :data:`DEPTHS` (``run.depth``)."""
    register()
    with ex.threads(threads):
        runs = ex.run_plan(plan, config, device)
        marker = study_tasks()[2]
        for run in runs:
            if run.task == marker.name and run.model is not None:
                run.depth = {depth_key(n, d): depth_accuracy(run.model, marker, n, d, config) for n, d in DEPTHS}
        tasks_by_name = {task.name: task for task in study_tasks()}
        for start in range(0, len(runs), len(config.seeds)):  # one group of seeds per task and name
            group = runs[start : start + len(config.seeds)]
            if all(run.model is not None for run in group):
                fresh = fresh_evaluation([run.model for run in group], tasks_by_name[group[0].task], config)
                for run, result in zip(group, fresh):
                    run.fresh = result
    return runs


#: The 3x-budget check (``make todays-models``, part ``budget``): :data:`BUDGET_STEPS` training steps (the study's
#: 200 times three) on the seeds :data:`BUDGET_SEEDS`, for the models the chapter's trained claims are about: the four
#: with RoPE layers on fetch and on the marker task (each the two-by-two design of NoPE layer and window), causal NoPE
#: on the marker task (its failure with the source deep) and on copy-back.
BUDGET_STEPS = 600
BUDGET_SEEDS = (0, 1, 2)
BUDGET_PLAN = (
    ("fetch position 1", ("rope", "hybrid", "rnope-swa", "rope-window")),
    ("copy after marker 1", ("rope", "hybrid", "rnope-swa", "rope-window", "nope-causal")),
    ("copy 2 back", ("nope-causal",)),
)
BUDGET_FILE = DATA_DIR / "todays_models_budget.json"

#: The controls of the marker task's verdicts (``make todays-models``, part ``controls``), at the study's 200 steps on
#: the seeds :data:`BUDGET_SEEDS`, evaluated as the study. The harness's RoPE has θ = 10⁴ on heads of d_h = 8 (four
#: pairs); here RoPE at θ = 10⁵ and the two-by-two design of NoPE layer and window (``-1e6`` names) at
#: :data:`CONTROL_BASE`, so that RoPE is judged by more than one base; and RNoPE-SWA with a window of
#: :data:`WIDE_WINDOW`, the training length, which no training sequence exceeds: its window is inactive in training.
CONTROL_BASE = 1e6
WIDE_WINDOW = 16
CONTROLS_PLAN = (
    (
        "copy after marker 1",
        ("rope-1e5", "rope-1e6", "hybrid-1e6", "rope-window-1e6", "rnope-swa-1e6", f"rnope-swa-w{WIDE_WINDOW}"),
    ),
)
#: The controls' 3x-budget part, trained as the 3x-budget check (:func:`budget_config`) and stored in the controls
#: file's ``"budget"`` field (:func:`load_controls` with ``budget=True``): fetch's two-by-two design and the marker
#: task's RoPE and hybrid, all at :data:`CONTROL_BASE`, so that the 600-step verdicts judge RoPE at its best base too.
CONTROLS_BUDGET_PLAN = (
    ("fetch position 1", ("rope-1e6", "hybrid-1e6", "rnope-swa-1e6", "rope-window-1e6")),
    ("copy after marker 1", ("rope-1e6", "hybrid-1e6")),
)
CONTROLS_FILE = DATA_DIR / "todays_models_controls.json"


def budget_config() -> ex.ExperimentConfig:
    """:func:`study_config` with :data:`BUDGET_STEPS` steps and the seeds :data:`BUDGET_SEEDS`."""
    return replace(study_config(), steps=BUDGET_STEPS, seeds=BUDGET_SEEDS)


def _plan(spec: tuple) -> list:
    """``spec`` (:data:`BUDGET_PLAN`, :data:`CONTROLS_PLAN`) as ``(task, name)`` pairs."""
    tasks = {task.name: task for task in study_tasks()}
    return [(tasks[task], name) for task, names in spec for name in names]


def train_budget(threads: int = 1, device=None) -> tuple:
    """Train the models of :data:`BUDGET_PLAN` with :func:`budget_config`, evaluated as :func:`train_study`'s (fresh
    sequences, depth probes): ``(config, runs)``."""
    config = budget_config()
    return config, _train_and_evaluate(_plan(BUDGET_PLAN), config, threads, device)


def load_budget(path=None) -> tuple:
    """Read the committed 3x-budget check (default :data:`BUDGET_FILE`): ``(record, runs)`` as :func:`load_results`'s,
    runs as :class:`~posenc.lab.experiments.Run` without models (:func:`fresh_view` gives the fresh evaluation's).
    Raises FileNotFoundError saying how to make the file, and ValueError naming the field that disagrees with this
    module or is missing or out of range."""
    plan = [(task.name, name) for task, name in _plan(BUDGET_PLAN)]
    return _load(BUDGET_FILE, path, budget_config(), plan, "budget check", "--part budget, 10 to 15 minutes")


def controls_config() -> ex.ExperimentConfig:
    """:func:`study_config` (200 steps) with the seeds :data:`BUDGET_SEEDS`."""
    return replace(study_config(), seeds=BUDGET_SEEDS)


def train_controls(threads: int = 1, device=None) -> tuple:
    """Train the models of :data:`CONTROLS_PLAN` with :func:`controls_config`, evaluated as :func:`train_study`'s:
    ``(config, runs)``."""
    config = controls_config()
    return config, _train_and_evaluate(_plan(CONTROLS_PLAN), config, threads, device)


def train_controls_budget(threads: int = 1, device=None) -> tuple:
    """Train the models of :data:`CONTROLS_BUDGET_PLAN` with :func:`budget_config`, evaluated as
    :func:`train_study`'s: ``(config, runs)``."""
    config = budget_config()
    return config, _train_and_evaluate(_plan(CONTROLS_BUDGET_PLAN), config, threads, device)


def load_controls(path=None, budget: bool = False) -> tuple:
    """Read the committed controls (default :data:`CONTROLS_FILE`): ``(record, runs)`` as :func:`load_budget`'s; with
    ``budget``, the file's ``"budget"`` field (:data:`CONTROLS_BUDGET_PLAN` at :func:`budget_config`)."""
    if not isinstance(budget, bool):
        raise TypeError(f"budget must be a bool, got {type(budget).__name__}")
    spec, config = (CONTROLS_BUDGET_PLAN, budget_config()) if budget else (CONTROLS_PLAN, controls_config())
    plan = [(task.name, name) for task, name in _plan(spec)]
    how = "--part controls, about ten minutes"
    return _load(CONTROLS_FILE, path, config, plan, "controls", how, "budget" if budget else None)


def fresh_data(task, length: int, config: ex.ExperimentConfig, sequences: int = FRESH_SEQUENCES):
    """``sequences`` new sequences of ``task`` at ``length`` (none shared with the harness's fixed batch of
    :func:`~posenc.lab.experiments.evaluation_data`): ``(inputs, targets, mask)``, each ``(sequences, length)``.
    Seeded by ``config.eval_seed + FRESH_SEED + length``: the same sequences for every model."""
    import torch

    generator = torch.Generator().manual_seed(config.eval_seed + FRESH_SEED + length)
    return task.sample(sequences, length, config.vocab_size, generator)


def evaluation_batch(task, length: int, config: ex.ExperimentConfig, depth: int = 0):
    """The batch the chapter's numbers at ``length`` rest on: :func:`fresh_data` at a length of
    :data:`FRESH_LENGTHS` (with ``depth``, its :func:`deep_marker_data`), else the harness's fixed batch (at L and 2L,
    256 and 128 sequences). Returns ``(inputs, targets, mask)``."""
    fresh = length in FRESH_LENGTHS
    if depth:
        return deep_marker_data(task, length, depth, config, fresh=fresh)
    return fresh_data(task, length, config) if fresh else ex.evaluation_data(task, length, config)


def fresh_view(runs: list) -> list:
    """Copies of ``runs`` (from :func:`load_results`) whose accuracies at :data:`FRESH_LENGTHS` and depth probes are
    the fresh evaluation's (the fixed batch's at the other lengths), and with ``sequence_sd`` (key -> the spread of
    the per-sequence accuracies) added; the runs themselves keep the fixed batch's, which a retraining reproduces."""
    view = []
    for run in runs:
        copy = ex.Run(run.task, run.encoding, run.seed, list(run.losses), dict(run.accuracy))
        copy.sequence_sd = {}
        for key, entry in run.fresh.items():
            if "@" in key:
                copy.depth = dict(getattr(copy, "depth", None) or run.depth)
                copy.depth[key] = entry["accuracy"]
            else:
                copy.accuracy[int(key)] = entry["accuracy"]
            copy.sequence_sd[key] = entry["sequence_sd"]
        view.append(copy)
    return view


def fresh_evaluation(models: list, task, config: ex.ExperimentConfig) -> list:
    """Each of ``models`` on :func:`fresh_data` at every length of :data:`FRESH_LENGTHS` and, for the marker task, on
    the fresh depth probes of :data:`DEPTHS` (key :func:`depth_key`): one dict per model, ``{key: {"accuracy": pooled,
    "sequence_sd": standard deviation of its per-sequence accuracies, "sequences": count}}``, lengths as strings."""
    batches = {str(n): fresh_data(task, n, config) for n in FRESH_LENGTHS}
    if isinstance(task, CopyAfterMarker):
        batches.update({depth_key(n, d): deep_marker_data(task, n, d, config, fresh=True) for n, d in DEPTHS})
    results = [{} for _ in models]
    for key, batch in batches.items():
        pooled, per_sequence = ex.sequence_accuracies(models, *batch, config)
        for index, result in enumerate(results):
            values = per_sequence[index][~per_sequence[index].isnan()]
            result[key] = {
                "accuracy": pooled[index].item(),
                "sequence_sd": values.std().item(),
                "sequences": len(values),
            }
    return results


def deep_marker_data(task: CopyAfterMarker, length: int, depth: int, config: ex.ExperimentConfig, fresh: bool = False):
    """The marker task's evaluation batch at ``length`` (with ``fresh``, the :func:`fresh_data` batch) with its source
    moved to depth ``depth``: every marker before ``depth`` replaced by an ordinary token, a marker forced at ``depth``
    and an ordinary token after it (the source). Returns ``(inputs, targets, mask)``, each ``(B, length)`` (mask: where
    there is a target, from ``depth + 1`` on). Seeded by ``config.eval_seed``, ``length`` and ``depth`` (and
    :data:`FRESH_SEED` with ``fresh``): the same batch for every model."""
    import torch

    if not isinstance(task, CopyAfterMarker) or task.k != 1:
        raise TypeError(f"task must be CopyAfterMarker(1), got {task!r}")
    if isinstance(length, bool) or not isinstance(length, int) or isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"length and depth must be ints, got {length!r} and {depth!r}")
    if not 0 <= depth <= length - 2:
        raise ValueError(f"depth must be in [0, length - 2] = [0, {length - 2}], got {depth}")
    if not isinstance(fresh, bool):
        raise TypeError(f"fresh must be a bool, got {fresh!r}")
    inputs = (fresh_data(task, length, config) if fresh else ex.evaluation_data(task, length, config))[0].clone()
    marker = task.marker(config.vocab_size)
    generator = torch.Generator().manual_seed(config.eval_seed + 1000 * length + depth + (FRESH_SEED if fresh else 0))
    ordinary = torch.randint(marker, inputs.shape, generator=generator)  # tokens 0 .. marker - 1
    head = inputs[:, : depth + 2]
    inputs[:, : depth + 2] = torch.where(head == marker, ordinary[:, : depth + 2], head)
    inputs[:, depth] = marker
    sources = task.sources_of(inputs, config.vocab_size)
    mask = sources >= 0
    targets = torch.where(mask, torch.gather(inputs, 1, sources.clamp(min=0)), torch.zeros_like(inputs))
    return inputs, targets, mask


def depth_accuracy(model, task: CopyAfterMarker, length: int, depth: int, config: ex.ExperimentConfig) -> float:
    """``model``'s accuracy on :func:`deep_marker_data` (the most likely token against every target)."""
    return ex.batch_accuracy(model, *deep_marker_data(task, length, depth, config))[0]


def last_tokens_rule(task: CopyAfterMarker, inputs, targets, mask, window: int, vocab_size: int) -> float:
    """The marker task's less-context baseline, untrained: at each position, the token after the earliest marker
    among the last ``window`` tokens (the position itself included), or no answer when that window holds no marker
    with its next token. ``inputs``, ``targets``, ``mask``: ``(B, T)`` as :func:`deep_marker_data` returns them.
    Returns the accuracy over the targets of ``mask`` (no answer counts as wrong)."""
    import torch

    if not isinstance(task, CopyAfterMarker) or task.k != 1:
        raise TypeError(f"task must be CopyAfterMarker(1), got {task!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2, got {window!r}")
    if not (inputs.shape == targets.shape == mask.shape) or inputs.dim() != 2:
        raise ValueError(
            f"inputs, targets and mask must share one (B, T) shape, got {inputs.shape}, "
            f"{targets.shape} and {mask.shape}"
        )
    length = inputs.shape[1]
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    reach = (key < query) & (key > query - window)  # (T, T): a marker at key with its next token inside the window
    candidates = reach & (inputs == task.marker(vocab_size))[:, None, :]  # (B, T, T)
    found = candidates.any(-1)
    earliest = candidates.int().argmax(-1)  # the first True along the keys
    answer = torch.gather(inputs, 1, (earliest + 1).clamp(max=length - 1))
    right = found & (answer == targets) & mask
    return right.sum().item() / mask.sum().item()


def depth_key(length: int, depth: int) -> str:
    """The record's key of one depth-varied evaluation: ``"length@depth"``."""
    return f"{length}@{depth}"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def results_record(config: ex.ExperimentConfig, runs: list, **extra) -> dict:
    """The JSON record of a study: the config, the window, the names, the tasks and every run's final loss and
    accuracy per evaluation length (the marker task's runs also their ``depth`` accuracies), plus ``extra`` fields
    (machine, versions, time)."""
    return {
        "config": {key: _plain(value) for key, value in asdict(config).items()},
        "window": WINDOW,
        "depths": [list(pair) for pair in DEPTHS],
        "fresh": {"lengths": list(FRESH_LENGTHS), "sequences": FRESH_SEQUENCES, "seed_offset": FRESH_SEED},
        "names": list(NAMES),
        "tasks": [task.name for task in study_tasks()],
        "runs": [
            {
                "task": r.task,
                "encoding": r.encoding,
                "seed": r.seed,
                "final_loss": r.losses[-1],
                "accuracy": {str(n): a for n, a in r.accuracy.items()},
                **({"depth": dict(r.depth)} if getattr(r, "depth", None) else {}),
                **({"fresh": dict(r.fresh)} if getattr(r, "fresh", None) else {}),
            }
            for r in runs
        ],
        **extra,
    }


def machine(threads: int = 1) -> dict:
    """This machine as the study's record stores it: ``{"cpu": model name, "threads": threads}``."""
    return {"cpu": cpu_name(), "threads": threads}


def _is_fraction(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= 1


def _run_of(entry: dict, where: str, lengths: list, with_depth: bool) -> ex.Run:
    """One entry of the results file as a :class:`~posenc.lab.experiments.Run`, every figure checked (accuracies
    at ``lengths``, the final loss, the depth accuracies where ``with_depth``, the fresh evaluations); ``where``
    names the entry in an error (``"todays_models.json: runs[3]"``)."""
    accuracy = entry.get("accuracy", {})
    for n in lengths:
        if not _is_fraction(accuracy.get(n)):
            raise ValueError(f"{where}.accuracy[{n!r}] must be a number in [0, 1], got {accuracy.get(n)!r}")
    loss = entry.get("final_loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        raise ValueError(f"{where}.final_loss must be a finite number, got {loss!r}")
    task, name, seed = entry.get("task"), entry.get("encoding"), entry.get("seed")
    run = ex.Run(task, name, seed, [loss], {int(n): accuracy[n] for n in lengths})
    depth_keys = [depth_key(n, d) for n, d in DEPTHS] if with_depth else []
    if with_depth:
        depth = entry.get("depth", {})
        for key in depth_keys:
            if not _is_fraction(depth.get(key)):
                raise ValueError(f"{where}.depth[{key!r}] must be a number in [0, 1], got {depth.get(key)!r}")
        run.depth = {key: depth[key] for key in depth_keys}
    fresh_keys = [str(n) for n in FRESH_LENGTHS] + depth_keys
    fresh = entry.get("fresh", {})
    for key in fresh_keys:
        value = fresh.get(key, {})
        numbers = [value.get(field) for field in ("accuracy", "sequence_sd")] if isinstance(value, dict) else [None]
        if not all(map(_is_fraction, numbers)) or value.get("sequences") != FRESH_SEQUENCES:
            raise ValueError(
                f"{where}.fresh[{key!r}] must hold accuracy and sequence_sd in [0, 1] over {FRESH_SEQUENCES} "
                f"sequences, got {value!r}"
            )
    run.fresh = {key: dict(fresh[key]) for key in fresh_keys}
    return run


def load_results(path=None) -> tuple:
    """Read the committed study (default :data:`RESULTS_FILE`): ``(record, runs)``, runs as
    :class:`~posenc.lab.experiments.Run` without models. Raises FileNotFoundError saying how to make the file, and
    ValueError naming the field that disagrees with this module (config, window, names, tasks) or is missing or out of
    range (every task x name x seed present once, accuracies in [0, 1] at every evaluation length)."""
    plan = [(task.name, name) for task in study_tasks() for name in NAMES]
    return _load(RESULTS_FILE, path, study_config(), plan, "study result", "a few minutes")


def _load(default, path, config: ex.ExperimentConfig, plan: list, what: str, how: str, field=None) -> tuple:
    """:func:`load_results` and :func:`load_budget`: read and check ``path`` (default ``default``; its ``field`` when
    not None), made with ``config``, holding every ``(task name, encoding name)`` of ``plan`` with every seed of
    ``config``."""
    path, record = read_json(default.name, path, what, f"`make todays-models` remakes it ({how})")
    if field is not None:
        if not isinstance(record.get(field), dict):
            raise ValueError(f"{path.name}: field {field!r} is missing: remake the file with `make todays-models`")
        record = record[field]
    expected = results_record(config, [])
    for key in ("config", "window", "depths", "fresh", "names", "tasks"):
        if record.get(key) != expected[key]:
            raise ValueError(
                f"{path.name}: field {key!r} is {record.get(key)!r}, the code says {expected[key]!r}: "
                "remake the file with `make todays-models`"
            )
    lengths = [str(n) for n in config.eval_lengths]
    runs, seen = [], set()
    for index, entry in enumerate(record.get("runs", [])):
        key = (entry.get("task"), entry.get("encoding"), entry.get("seed"))
        if key in seen:
            raise ValueError(f"{path.name}: runs[{index}] repeats {key}")
        seen.add(key)
        runs.append(_run_of(entry, f"{path.name}: runs[{index}]", lengths, key[0] == expected["tasks"][2]))
    wanted = {(task, name, seed) for task, name in plan for seed in config.seeds}
    if seen != wanted:
        missing = sorted(wanted - seen, key=str)[:3]
        raise ValueError(
            f"{path.name}: runs must hold every task x name x seed once; missing e.g. {missing}, "
            f"{len(seen - wanted)} unexpected"
        )
    return record, runs


__all__ = [
    "N_LAYERS",
    "DEPTHS",
    "FRESH_LENGTHS",
    "FRESH_SEQUENCES",
    "FRESH_SEED",
    "fresh_data",
    "fresh_evaluation",
    "evaluation_batch",
    "fresh_view",
    "deep_marker_data",
    "depth_accuracy",
    "depth_key",
    "last_tokens_rule",
    "WINDOW",
    "NAMES",
    "RESULTS_FILE",
    "study_config",
    "study_tasks",
    "register",
    "train_study",
    "results_record",
    "machine",
    "load_results",
    "BUDGET_STEPS",
    "BUDGET_SEEDS",
    "BUDGET_PLAN",
    "BUDGET_FILE",
    "budget_config",
    "train_budget",
    "load_budget",
    "CONTROL_BASE",
    "WIDE_WINDOW",
    "CONTROLS_PLAN",
    "CONTROLS_BUDGET_PLAN",
    "CONTROLS_FILE",
    "controls_config",
    "train_controls",
    "train_controls_budget",
    "load_controls",
]
