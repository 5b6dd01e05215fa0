"""Train small transformers with every encoding of the book on the tasks of :mod:`posenc.lab.tasks`.

Three rooms, every name re-exported here (the chapters read them as ``ex.NAME``):

* :mod:`~posenc.lab.experiments.registry`: the encodings by name, one registry with a group tag per name
  (:data:`ENCODINGS` chapter 11's, :data:`LAYER_PATTERNS` per-layer models, :data:`BEYOND_ENCODINGS` the
  data-dependent ones);
* :mod:`~posenc.lab.experiments.model`: the tiny transformer and its one forward pass, batched over a model axis;
* :mod:`~posenc.lab.experiments.training`: training many models side by side, evaluation, plans and tables;

and :mod:`~posenc.lab.experiments.config`, the sizes they share.
"""

from .config import ExperimentConfig, threads
from .model import Block, ModelStack, TinyTransformer, build_model, stacked_parameters
from .registry import (
    BEYOND_ENCODINGS,
    ENCODINGS,
    GROUPS,
    JORDAN_DAMPING,
    LAYER_PATTERNS,
    REGISTRY,
    EncodingGroup,
    Registered,
    add_encoding,
    add_layer_pattern,
    encoding_label,
    jordan_frequencies,
    jordan_rotation_generator,
    registered,
    remove_encoding,
)
from .training import (
    EVAL_CHUNK_SCORES,
    Ensemble,
    Run,
    accuracies,
    accuracy_spread,
    batch_accuracy,
    evaluate,
    evaluate_ensemble,
    evaluation_data,
    fine_tune,
    mean_position_accuracy,
    position_probe_r2,
    results_table,
    run_encoding,
    run_experiments,
    run_plan,
    sequence_accuracies,
    train,
    with_rope,
)

__all__ = [
    "ExperimentConfig",
    "threads",
    "GROUPS",
    "REGISTRY",
    "Registered",
    "EncodingGroup",
    "registered",
    "remove_encoding",
    "ENCODINGS",
    "LAYER_PATTERNS",
    "BEYOND_ENCODINGS",
    "add_encoding",
    "add_layer_pattern",
    "JORDAN_DAMPING",
    "jordan_frequencies",
    "jordan_rotation_generator",
    "with_rope",
    "fine_tune",
    "accuracies",
    "encoding_label",
    "Block",
    "TinyTransformer",
    "ModelStack",
    "stacked_parameters",
    "build_model",
    "Run",
    "Ensemble",
    "train",
    "evaluation_data",
    "evaluate",
    "batch_accuracy",
    "EVAL_CHUNK_SCORES",
    "evaluate_ensemble",
    "sequence_accuracies",
    "run_plan",
    "run_encoding",
    "run_experiments",
    "accuracy_spread",
    "mean_position_accuracy",
    "results_table",
    "position_probe_r2",
]
