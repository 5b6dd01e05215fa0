"""RoPE frequency tables: one function per ``rope_type``, all with one signature, in one registry.

Every function has the signature::

    fn(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None)
        -> (inv_freq, attention_factor)

* ``inv_freq``: float32 tensor of shape ``(rotary_dim // 2,)``, the angle per unit of position for each
  feature pair, where ``rotary_dim = int(head_dim * partial_rotary_factor)``.
* ``attention_factor``: float that multiplies cos and sin, so every logit is multiplied by its square (YaRN's
  sqrt(1/t) = 0.1 ln s + 1 for the paper's softmax temperature t; LongRoPE's sqrt(1 + ln s / ln L); 1.0 otherwise).

``rope_parameters`` uses the key names and defaults of Hugging Face transformers' ``rope_parameters``
(``rope_theta``, ``factor``, ``original_max_position_embeddings``, ``beta_fast``, ...), and the tables are
computed the same way, operation for operation, so they are equal to transformers' own bit for bit.

:data:`ROPE_TYPES` is the one table of what each ``rope_type`` reads. :func:`rope_frequencies` checks
``rope_parameters`` against it before computing anything: a key the ``rope_type`` would ignore, a required key
that is missing, or a value transformers warns about is a ValueError, never a silently different table.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, cast

import torch

from ._checks import check_head_dim, require_int

DEFAULT_THETA = 10_000.0


def _param(rope_parameters: dict, key: str):
    value = rope_parameters.get(key)
    if value is None:
        raise ValueError(f"rope_parameters[{key!r}] is required for rope_type={rope_parameters.get('rope_type')!r}")
    return value


def _rotary_dim(head_dim: int, rope_parameters: dict) -> int:
    dim = int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
    if dim < 2 or dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor must be an even number >= 2, got "
            f"{head_dim} * {rope_parameters.get('partial_rotary_factor', 1.0)} = {dim}"
        )
    return dim


def _geometric_inv_freq(base: float, dim: int, device) -> torch.Tensor:
    # theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1, in float32 as transformers does
    # made on the device (not on the host and copied, as transformers does): the same integers, so the same table
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (base**exponents)


def _original_length(rope_parameters: dict, max_position_embeddings: int) -> int:
    return rope_parameters.get("original_max_position_embeddings") or max_position_embeddings


def default_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """The original RoPE: theta_i = rope_theta^(-2i/d)."""
    base = rope_parameters.get("rope_theta", DEFAULT_THETA)
    return _geometric_inv_freq(base, _rotary_dim(head_dim, rope_parameters), device), 1.0


def linear_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """Position interpolation: every frequency divided by ``factor``."""
    factor = _param(rope_parameters, "factor")
    inv_freq, _ = default_frequencies(head_dim, rope_parameters, max_position_embeddings, device=device)
    return inv_freq / factor, 1.0


def dynamic_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """Dynamic NTK: the base grows with the current length once it passes ``max_position_embeddings``."""
    factor = _param(rope_parameters, "factor")
    base = rope_parameters.get("rope_theta", DEFAULT_THETA)
    dim = _rotary_dim(head_dim, rope_parameters)
    if isinstance(seq_len, torch.Tensor):
        # the same arithmetic on a 0-d float64 tensor (Python floats are doubles): no host sync, traceable, and
        # the same table bit for bit (tests/test_rope.py)
        length = seq_len.to(device=device, dtype=torch.float64).clamp(min=max_position_embeddings)
        scaled = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        return _geometric_inv_freq(scaled.float(), dim, device), 1.0
    seq_len = max_position_embeddings if seq_len is None else max(int(seq_len), max_position_embeddings)
    base = base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    return _geometric_inv_freq(base, dim, device), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """YaRN: interpolate low frequencies, keep high ones, ramp in between; attention factor 0.1 ln(s) + 1.

    The ramp is transformers' (the authors' code), not the paper's formula: the pair indices where a pair turns
    ``beta_fast`` and ``beta_slow`` times in the original context are rounded outwards (``truncate``, default
    True), clamped to ``[0, dim - 1]``, and the blend is linear in the pair index between them. On small heads
    the clamp decides which pairs are kept (head_dim 8, base 1e4, 16 positions: the low end -1.10 becomes -2,
    then 0, so pair 0 is kept).
    """
    base = rope_parameters.get("rope_theta", DEFAULT_THETA)
    dim = _rotary_dim(head_dim, rope_parameters)
    original = _original_length(rope_parameters, max_position_embeddings)
    factor = rope_parameters.get("factor")
    if factor is None:
        if "factor" not in rope_parameters:
            _param(rope_parameters, "factor")
        factor = max_position_embeddings / original
    attention_factor = rope_parameters.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope_parameters.get("mscale"), rope_parameters.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = rope_parameters.get("beta_fast") or 32
    beta_slow = rope_parameters.get("beta_slow") or 1

    def dim_of_rotations(rotations):
        # the pair index whose wavelength fits `rotations` times into the original context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of_rotations(beta_fast), dim_of_rotations(beta_slow)
    if rope_parameters.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp.to(device=device, dtype=torch.float)

    wavelength_base = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolated = 1.0 / wavelength_base
    interpolated = 1.0 / (factor * wavelength_base)
    return interpolated * (1 - keep) + extrapolated * keep, attention_factor


def longrope_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """LongRoPE: a searched factor per pair, ``short_factor`` up to the original length, ``long_factor`` past it."""
    base = rope_parameters.get("rope_theta", DEFAULT_THETA)
    dim = _rotary_dim(head_dim, rope_parameters)
    long_factor, short_factor = _param(rope_parameters, "long_factor"), _param(rope_parameters, "short_factor")
    for key, value in (("long_factor", long_factor), ("short_factor", short_factor)):
        if len(value) != dim // 2:
            raise ValueError(f"rope_parameters[{key!r}] must have {dim // 2} entries (one per pair), got {len(value)}")
    original = _original_length(rope_parameters, max_position_embeddings)
    factor = rope_parameters.get("factor")
    if factor is None:
        factor = max_position_embeddings / original
    attention_factor = rope_parameters.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim

    def table(chosen):
        return 1.0 / (torch.tensor(chosen, dtype=torch.float32, device=device) * base**exponents)

    if isinstance(seq_len, torch.Tensor):  # both tables, picked on the device: no host sync, traceable
        return torch.where(seq_len.to(device) > original, table(long_factor), table(short_factor)), attention_factor
    return table(long_factor if seq_len and seq_len > original else short_factor), attention_factor


def llama3_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """Llama 3: long wavelengths divided by ``factor``, short ones kept, a smooth blend between."""
    factor = _param(rope_parameters, "factor")
    low_freq_factor = _param(rope_parameters, "low_freq_factor")
    high_freq_factor = _param(rope_parameters, "high_freq_factor")
    original = _original_length(rope_parameters, max_position_embeddings)
    inv_freq, _ = default_frequencies(head_dim, rope_parameters, max_position_embeddings, device=device)

    low_freq_wavelen, high_freq_wavelen = original / low_freq_factor, original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, blended, scaled), 1.0


def proportional_frequencies(head_dim, rope_parameters, max_position_embeddings, seq_len=None, device=None):
    """p-RoPE: the first ``partial_rotary_factor`` of the pairs keep their RoPE frequency (exponent over the full
    ``head_dim``), the remaining lowest-frequency pairs get frequency 0 and are never rotated. The table always
    covers the whole head: shape ``(head_dim // 2,)``."""
    base = rope_parameters.get("rope_theta", DEFAULT_THETA)
    proportion = rope_parameters.get("partial_rotary_factor", 1.0)
    rotated_pairs = int(proportion * head_dim // 2)
    exponents = torch.arange(0, 2 * rotated_pairs, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / head_dim
    inv_freq = 1.0 / (base**exponents)
    unrotated = head_dim // 2 - rotated_pairs
    if unrotated > 0:
        inv_freq = torch.cat((inv_freq, torch.zeros(unrotated, dtype=torch.float32, device=device)))
    return inv_freq, 1.0


RopeFrequencyFn = Callable[..., "tuple[torch.Tensor, float]"]


@dataclass(frozen=True)
class RopeType:
    """What one ``rope_type`` reads from ``rope_parameters``.

    ``required``: keys without a default; ``optional``: keys it reads when present (``rope_theta`` and
    ``partial_rotary_factor`` are optional for every type); ``uses_seq_len``: its table depends on the current
    sequence length, so a model recomputes it as the sequence grows.
    """

    function: RopeFrequencyFn
    required: tuple[str, ...]
    optional: tuple[str, ...]
    uses_seq_len: bool

    def keys(self) -> tuple[str, ...]:
        """Every key this rope_type accepts, ``rope_type`` included."""
        return ("rope_type", *COMMON_KEYS, *self.required, *self.optional)


COMMON_KEYS = ("rope_theta", "partial_rotary_factor")

# The key sets are transformers' own (RotaryEmbeddingConfigMixin._validate_<rope_type>_rope_parameters), with
# one difference: transformers also requires rope_theta (all types) and original_max_position_embeddings (yarn,
# longrope, llama3), but fills both in from the model config before it checks; posenc fills them in from
# DEFAULT_THETA and the max_position_embeddings argument, so here they are optional.
#: Every ``rope_type`` with its frequency function, required and optional keys of ``rope_parameters``, and whether its
#: table depends on the sequence length (:class:`RopeType`).
ROPE_TYPES: dict[str, RopeType] = {
    # rope_type: RopeType(function, required keys, optional keys, whether the table depends on seq_len)
    "default": RopeType(default_frequencies, (), (), False),
    "linear": RopeType(linear_frequencies, ("factor",), (), False),
    "dynamic": RopeType(dynamic_frequencies, ("factor",), (), True),
    "yarn": RopeType(
        yarn_frequencies,
        ("factor",),
        (
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
        False,
    ),
    "longrope": RopeType(
        longrope_frequencies,
        ("short_factor", "long_factor"),
        ("original_max_position_embeddings", "attention_factor", "factor"),
        True,
    ),
    "llama3": RopeType(
        llama3_frequencies,
        ("factor", "low_freq_factor", "high_freq_factor"),
        ("original_max_position_embeddings",),
        False,
    ),
    "proportional": RopeType(proportional_frequencies, (), (), False),
}

#: The registry, rope_type -> function (derived from the table above, so the two cannot disagree).
ROPE_FREQUENCY_FUNCTIONS: dict[str, RopeFrequencyFn] = {name: spec.function for name, spec in ROPE_TYPES.items()}


def _is_number(value: Any) -> bool:
    # finite, written with comparisons rather than math.isfinite so that torch.compile can trace it
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float, numbers.Real))
        and -math.inf < cast(float, value) < math.inf
    )


# What each key must hold, as (test, what was expected). None is accepted for optional keys (transformers reads
# a None the same as a missing key for these), except where the table reads None differently from absent.
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "rope_theta": (lambda v: _is_number(v) and v > 1, "a number > 1"),
    "partial_rotary_factor": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "factor": (lambda v: _is_number(v) and v >= 1, "a number >= 1"),
    "low_freq_factor": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "high_freq_factor": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "original_max_position_embeddings": (
        lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1,
        "an int >= 1",
    ),
    "attention_factor": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "beta_fast": (_is_number, "a number"),
    "beta_slow": (_is_number, "a number"),
    "mscale": (_is_number, "a number"),
    "mscale_all_dim": (_is_number, "a number"),
    "truncate": (lambda v: isinstance(v, bool), "True or False"),
    "short_factor": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_number, v)), "a list of numbers"),
    "long_factor": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_number, v)), "a list of numbers"),
}
_NONE_IS_NOT_ABSENT = {"rope_theta", "partial_rotary_factor", "truncate"}


def _unknown_key_message(key, rope_type: str, spec: RopeType) -> str:
    valid = sorted(spec.keys())
    message = f"rope_parameters has the key {key!r}, which rope_type={rope_type!r} does not use"
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    message += f"; did you mean {close[0]!r}?" if close else "."
    message += f" Valid keys for rope_type={rope_type!r}: {', '.join(valid)}."
    owners = [name for name, other in ROPE_TYPES.items() if key in other.required + other.optional]
    if owners:
        message += f" {key!r} belongs to rope_type {', '.join(map(repr, owners))}."
    return message


def check_rope_parameters(rope_parameters: dict | None) -> dict:
    """Validate ``rope_parameters`` and return a copy with ``rope_type`` set (the legacy key ``type`` moved there).

    Raises ValueError naming the key for: an unknown ``rope_type``; a key the ``rope_type`` does not use (with
    that type's valid keys and the closest name); a missing required key; a value transformers refuses or warns
    about (``factor < 1``, ``high_freq_factor <= low_freq_factor``, ``beta_fast < beta_slow``, ...).
    """
    if rope_parameters is not None and not isinstance(rope_parameters, dict):
        raise TypeError(f"rope_parameters must be a dict, got {type(rope_parameters).__name__}")
    rope_parameters = dict(rope_parameters or {})
    nested = per_layer_types(rope_parameters)
    if nested:
        raise ValueError(
            f"rope_parameters holds one dict per layer type ({', '.join(map(repr, nested))}), as "
            "Gemma 3's config does, where one set of parameters is expected: pass one of them, e.g. "
            f"rope_parameters[{nested[0]!r}], or posenc.rope_parameters_from_config(config, "
            "layer_type=...)"
        )
    if "type" in rope_parameters:  # the legacy name (rope_scaling = {"type": ...}), as transformers accepts it
        legacy = rope_parameters.pop("type")
        if rope_parameters.setdefault("rope_type", legacy) != legacy:
            raise ValueError(
                f"rope_parameters['type'] (the legacy name of 'rope_type') is {legacy!r} but "
                f"rope_parameters['rope_type'] is {rope_parameters['rope_type']!r}: give one of them"
            )
    rope_type = rope_parameters.setdefault("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        close = difflib.get_close_matches(str(rope_type), list(ROPE_TYPES), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown rope_type {rope_type!r}{hint}; known rope types: {', '.join(sorted(ROPE_TYPES))}")
    spec = ROPE_TYPES[rope_type]
    accepted = set(spec.keys())
    for key in rope_parameters:
        if key not in accepted:
            raise ValueError(_unknown_key_message(key, rope_type, spec))
    for key in spec.required:
        if rope_parameters.get(key) is None:
            raise ValueError(
                f"rope_parameters[{key!r}] is required for rope_type={rope_type!r}: expected "
                f"{_VALUE_RULES[key][1]}. Valid keys for rope_type={rope_type!r}: "
                f"{', '.join(sorted(accepted))}."
            )
    for key, value in rope_parameters.items():
        if key == "rope_type" or (value is None and key not in _NONE_IS_NOT_ABSENT):
            continue
        test, expected = _VALUE_RULES[key]
        if not test(value):
            raise ValueError(f"rope_parameters[{key!r}] must be {expected} for rope_type={rope_type!r}, got {value!r}")
    low, high = rope_parameters.get("low_freq_factor"), rope_parameters.get("high_freq_factor")
    if low is not None and high is not None and not high > low:
        raise ValueError(
            f"rope_parameters['high_freq_factor'] must be greater than 'low_freq_factor', got {high!r} and {low!r}"
        )
    beta_fast, beta_slow = rope_parameters.get("beta_fast") or 32, rope_parameters.get("beta_slow") or 1
    if beta_fast < beta_slow:
        raise ValueError(
            f"rope_parameters['beta_fast'] (default 32) must be >= 'beta_slow' (default 1), got "
            f"{beta_fast!r} and {beta_slow!r}"
        )
    return rope_parameters


def per_layer_types(rope_parameters) -> list[str]:
    """The layer types of a nested ``rope_parameters`` (``{"sliding_attention": {...}, "full_attention": {...}}``,
    as in Gemma 3's config), sorted; ``[]`` for a flat one.

    A layer type is a key whose value is a dict (no flat key holds one). transformers 5.15 can leave flat keys
    beside the nested ones (a Gemma 3 config whose ``layer_types`` lack one of its rope types gains
    ``"rope_type": "default", "rope_theta": None``); the model reads only the nested dicts, and so does posenc.
    """
    if not isinstance(rope_parameters, dict):
        return []
    return sorted(key for key, value in rope_parameters.items() if isinstance(value, dict))


# legacy config attributes (before transformers gathered them in rope_parameters) -> rope_parameters keys
_LEGACY_ATTRIBUTES = {
    "rope_theta": "rope_theta",
    "partial_rotary_factor": "partial_rotary_factor",
    "rotary_pct": "partial_rotary_factor",
    "rotary_emb_base": "rope_theta",
}


def rope_parameters_from_config(config, layer_type: str | None = None) -> dict:
    """The ``rope_parameters`` of a transformers config (or its ``config.json`` dict), flat and checked.

    Reads ``config.rope_parameters``; for the per-layer-type form (Gemma 3: ``sliding_attention`` and
    ``full_attention``, each with its own ``rope_theta``) ``layer_type`` picks one, and leaving it out raises a
    ValueError naming the layer types. The legacy form is read too: ``rope_theta`` (or GPT-NeoX's
    ``rotary_emb_base``), ``rope_scaling`` (with ``type`` or ``rope_type``), ``partial_rotary_factor`` (or
    ``rotary_pct``) and ``original_max_position_embeddings`` as attributes of the config; a key inside
    ``rope_parameters`` wins over an attribute. A flat ``rope_parameters`` serves every layer type (``layer_type``,
    if given, must be one of ``config.layer_types``). ``partial_rotary_factor = 1.0`` is left out.
    """
    if isinstance(config, dict):
        get = config.get
    elif hasattr(config, "to_dict") or hasattr(config, "max_position_embeddings"):

        def get(key, default=None):
            return getattr(config, key, default)
    else:
        raise TypeError(f"config must be a transformers config or its dict, got {type(config).__name__}")
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be None or a str, got {type(layer_type).__name__}")
    parameters = get("rope_parameters", None)
    nested = per_layer_types(parameters)
    if nested:
        if layer_type is None:
            raise ValueError(
                f"this config has one rope_parameters per layer type ({', '.join(map(repr, nested))}): "
                "pass layer_type= one of them"
            )
        if layer_type not in nested:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, nested))}, got {layer_type!r}")
        parameters = cast(dict, parameters)[layer_type]
    elif layer_type is not None:
        types = get("layer_types", None)
        if types and layer_type not in set(types):
            raise ValueError(
                f"layer_type must be one of {', '.join(map(repr, sorted(set(types))))}, got {layer_type!r}"
            )
    parameters = dict(parameters or {})
    scaling = get("rope_scaling", None)
    if isinstance(scaling, dict) and not per_layer_types(scaling):
        for key, value in scaling.items():
            parameters.setdefault(key, value)
    for attribute, key in _LEGACY_ATTRIBUTES.items():
        value = get(attribute, None)
        if value is not None and key not in parameters:
            parameters[key] = value
    if "type" in parameters:
        parameters.setdefault("rope_type", parameters["type"])
        if parameters["rope_type"] == parameters["type"]:
            del parameters["type"]
    parameters.setdefault("rope_type", "default")
    if parameters.get("partial_rotary_factor") == 1.0:
        del parameters["partial_rotary_factor"]
    spec = ROPE_TYPES.get(parameters["rope_type"])
    original = get("original_max_position_embeddings", None)
    if spec is not None and original is not None and "original_max_position_embeddings" in spec.keys():
        parameters.setdefault("original_max_position_embeddings", original)
    return check_rope_parameters(parameters)


def rope_frequencies(
    head_dim: int,
    rope_parameters: dict | None = None,
    max_position_embeddings: int = 2048,
    seq_len: int | None = None,
    device=None,
) -> tuple[torch.Tensor, float]:
    """Look up ``rope_parameters['rope_type']`` (default ``"default"``) and compute its frequencies.

    ``seq_len`` (dynamic NTK and LongRoPE only) is an int, or a 0-d integer tensor: then the table is computed
    on the tensor's device without reading its value back (no host sync; traceable by ``torch.compile`` and
    ``torch.export``), equal bit for bit to the table of the same int.

    ``rope_parameters`` is checked first (:func:`check_rope_parameters`). Returns ``(inv_freq,
    attention_factor)`` with ``inv_freq`` of shape ``(rotary_dim // 2,)``, float32.

    Args:
        head_dim: ``D``, even.
        rope_parameters: a transformers ``rope_parameters`` dict (``rope_type``, ``rope_theta``, ``factor``, ...);
            None for the original RoPE with base 10000.
        max_position_embeddings: the model's context length (the default ``original_max_position_embeddings``).
        seq_len: the sequence length, for the types whose table depends on it.
        device: where the table lives.

    Returns:
        ``(inv_freq, attention_factor)``, a float32 tensor ``(rotary_dim // 2,)`` and a float.

    Example:
        >>> inv_freq, attention_factor = rope_frequencies(64, {"rope_type": "yarn", "factor": 4.0,
        ...                                                    "original_max_position_embeddings": 2048})
        >>> inv_freq.shape, inv_freq.dtype, round(attention_factor, 4)
        (torch.Size([32]), torch.float32, 1.1386)
    """
    check_head_dim(head_dim)
    require_int("max_position_embeddings", max_position_embeddings, minimum=1)
    if isinstance(seq_len, torch.Tensor):
        if seq_len.ndim != 0 or seq_len.is_floating_point() or seq_len.is_complex() or seq_len.dtype == torch.bool:
            raise TypeError(
                f"seq_len must be an int or a 0-d integer tensor, got {seq_len.dtype} {tuple(seq_len.shape)}"
            )
    elif seq_len is not None:
        seq_len = require_int("seq_len", seq_len, minimum=1)
    rope_parameters = check_rope_parameters(rope_parameters)
    rope_parameters.setdefault("rope_theta", DEFAULT_THETA)
    rope_type = rope_parameters["rope_type"]
    return ROPE_TYPES[rope_type].function(head_dim, rope_parameters, max_position_embeddings, seq_len, device)
