"""How a transformers model rotates, read from its structure (for :mod:`posenc.transformers_rope`).

Nothing here trusts a class name. A model is supported when

* one of its modules (the decoder) holds ``rotary_emb`` and ``layers``, and ``rotary_emb(x, position_ids)`` returns
  real ``(cos, sin)`` tables ``(B, L, R)``;
* each layer has one attention child whose ``forward`` takes ``position_embeddings``, and that forward calls
  module-level functions of ``(q, k, cos, sin, ...)``;
* each such function, run on a probe with the model's own tables, computes one of the rotations of :data:`LAYOUTS`.

transformers is never imported here; the model brings it.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass

import torch

from .rope import apply_rope

# The rotations a probe can recognise: the layout posenc rotates in, and how the function's input is read.
# "deinterleaved" is DeepSeek-V3's `rope_interleave`: pairs (x0, x1), (x2, x3), ... of the input, returned in the
# half layout (first members, then second members).
LAYOUTS = ("half", "interleaved", "deinterleaved")
PROBE_LENGTH = 5


@dataclass(frozen=True)
class Rotation:
    """One module-level rotation function an attention forward calls: its global ``name``, the ``function``
    itself, its ``layout`` (one of :data:`LAYOUTS`) and its ``signature``."""

    name: str
    function: types.FunctionType
    layout: str
    signature: inspect.Signature


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Features ``(x0, x1, x2, x3, ...)`` of the last axis reordered to ``(x0, x2, ..., x1, x3, ...)``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def find_decoder(model) -> tuple[str, torch.nn.Module]:
    """``(name, module)`` of the one module of ``model`` that holds ``rotary_emb`` and ``layers`` (for a multimodal
    model, its language model). TypeError when there is none, or several and none is the language model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"use_posenc_rope needs a transformers model (a torch.nn.Module), got {type(model).__name__}")
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(getattr(module, "rotary_emb", None), torch.nn.Module)
        and isinstance(getattr(module, "layers", None), torch.nn.ModuleList)
    ]
    if len(found) > 1:
        found = [(name, module) for name, module in found if "language_model" in name or "text" in name] or found
    if not found:
        raise TypeError(
            f"use_posenc_rope patches a transformers model whose decoder holds `rotary_emb` (returning "
            f"cos and sin) and `layers`; {type(model).__name__} has no such module"
        )
    if len(found) > 1:
        raise TypeError(
            f"use_posenc_rope found several decoders with `rotary_emb` and `layers` in "
            f"{type(model).__name__} ({', '.join(repr(name) for name, _ in found)}); patch one of them"
        )
    return found[0]


def _takes(function, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def rotary_takes_layer_type(rotary: torch.nn.Module) -> bool:
    """Whether ``rotary_emb.forward`` has a table per layer type (Gemma 3: ``forward(x, position_ids, layer_type)``)."""
    return _takes(type(rotary).forward, "layer_type")


def own_tables(rotary: torch.nn.Module, layer_type=None, length: int = PROBE_LENGTH):
    """The model's own ``(cos, sin)``, each ``(1, length, R)`` float32, at positions ``0 .. length - 1``, from the
    class's forward (not a patch). TypeError when ``rotary_emb`` returns something else (Llama 4: one complex
    tensor)."""
    buffer = next(iter(rotary.buffers()), None)
    device = buffer.device if buffer is not None else torch.device("cpu")
    x = torch.zeros(1, length, 1, device=device)
    positions = torch.arange(length, device=device)[None]
    extra = () if layer_type is None else (layer_type,)
    with torch.no_grad():
        tables = type(rotary).forward(rotary, x, positions, *extra)
    if not (isinstance(tables, tuple) and len(tables) == 2 and all(isinstance(t, torch.Tensor) for t in tables)):
        what = (
            f"a {tables.dtype} tensor of shape {tuple(tables.shape)}"
            if isinstance(tables, torch.Tensor)
            else type(tables).__name__
        )
        why = (
            " (a complex table: the model rotates by a complex product, as Llama 4 does, which posenc's real "
            "cos/sin rotation does not replace)"
            if isinstance(tables, torch.Tensor) and tables.is_complex()
            else ""
        )
        raise TypeError(
            f"use_posenc_rope replaces rotations by cos/sin tables; {type(rotary).__name__} returns {what}{why}"
        )
    cos, sin = tables
    if cos.is_complex() or cos.ndim != 3 or cos.shape != sin.shape or cos.shape[-1] % 2:
        raise TypeError(
            f"use_posenc_rope expects {type(rotary).__name__} to return real (cos, sin) tables "
            f"(B, L, R) with R even, got {cos.dtype} {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    return cos.float(), sin.float()


def attention_of(layer: torch.nn.Module) -> torch.nn.Module:
    """The child of a decoder layer whose ``forward`` takes ``position_embeddings`` (TypeError if none)."""
    for child in layer.children():
        if _takes(type(child).forward, "position_embeddings"):
            return child
    raise TypeError(
        f"use_posenc_rope found no attention in {type(layer).__name__}: none of its children takes "
        f"`position_embeddings`"
    )


def _classify(function, cos: torch.Tensor, sin: torch.Tensor) -> str | None:
    """The layout of :data:`LAYOUTS` whose posenc rotation ``function(q, k, cos, sin)`` computes, else None."""
    rotary_dim = cos.shape[-1]
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3, PROBE_LENGTH, rotary_dim, generator=generator).to(cos.device)
    k = torch.randn(1, 1, PROBE_LENGTH, rotary_dim, generator=generator).to(cos.device)
    try:
        with torch.no_grad():
            got_q, got_k = function(q, k, cos, sin)
    except Exception:  # noqa: BLE001 - any failure on the probe means "not a rotation we know"
        return None
    half = rotary_dim // 2
    tables = {
        "half": (cos[..., :half], sin[..., :half]),
        "interleaved": (cos[..., 0::2], sin[..., 0::2]),
        "deinterleaved": (cos[..., :half], sin[..., :half]),
    }
    for layout in LAYOUTS:
        table_cos, table_sin = tables[layout]
        inputs = (deinterleave(q), deinterleave(k)) if layout == "deinterleaved" else (q, k)
        rotate_as = "interleaved" if layout == "interleaved" else "half"
        expected = [apply_rope(x, table_cos, table_sin, rotate_as, seq_dim=-2) for x in inputs]
        if all(
            isinstance(g, torch.Tensor) and g.shape == e.shape and torch.allclose(g.float(), e, atol=1e-5)
            for g, e in zip((got_q, got_k), expected)
        ):
            return layout
    return None


def rotations_of(attention: torch.nn.Module, cos: torch.Tensor, sin: torch.Tensor):
    """``(forward, [Rotation, ...])``: the plain function under ``type(attention).forward`` and the module-level
    rotation functions it calls, each classified on a probe with the model's tables ``cos``, ``sin``
    ``(1, L, R)``. TypeError naming what was found when a function rotates another way, or none is called."""
    forward = inspect.unwrap(type(attention).forward)
    if not isinstance(forward, types.FunctionType):
        raise TypeError(f"use_posenc_rope cannot read the forward of {type(attention).__name__}")
    rotations, unknown = [], []
    for name in forward.__code__.co_names:
        value = forward.__globals__.get(name)
        if isinstance(value, types.FunctionType) and _takes(value, "cos") and _takes(value, "sin"):
            layout = _classify(value, cos, sin)
            if layout is None:
                unknown.append(name)
            else:
                rotations.append(Rotation(name, value, layout, inspect.signature(value)))
    where = f"{type(attention).__name__}.forward ({forward.__module__})"
    if unknown:
        raise TypeError(
            f"use_posenc_rope: {where} calls {', '.join(unknown)}, which on a probe with the model's "
            f"own cos/sin computes none of posenc's rotations ({', '.join(LAYOUTS)} layouts)"
        )
    if not rotations:
        raise TypeError(
            f"use_posenc_rope: {where} calls no module-level function of (q, k, cos, sin) that it could replace"
        )
    return forward, rotations


def bind_forward(attention: torch.nn.Module, forward: types.FunctionType, replacements: dict) -> None:
    """Give ``attention`` (this instance only) a copy of ``forward`` whose global names ``replacements`` resolve to
    other functions; the modeling module and every other instance keep the original."""
    namespace = dict(forward.__globals__)
    namespace.update(replacements)
    # without `__name__`, torch.compile reads this dict's globals as the function's own scope (as for namedtuple's
    # generated code) instead of importing the modeling module by name and reading the originals from it
    namespace.pop("__name__", None)
    copy = types.FunctionType(forward.__code__, namespace, forward.__name__, forward.__defaults__, forward.__closure__)
    copy.__kwdefaults__ = forward.__kwdefaults__
    copy.__qualname__, copy.__doc__ = forward.__qualname__, forward.__doc__
    attention.forward = types.MethodType(copy, attention)
