"""posenc: positional encodings for attention, the library under the book.

Modules, one concept each, in the order of the chapters:

* :mod:`posenc.absolute`: integer, binary, sinusoidal and learned position vectors (and their input plug-ins);
* :mod:`posenc.encodings`: the plug-in protocol (:class:`PositionalEncoding`, ``kind``) and :class:`NoPE`;
* :mod:`posenc.multihead`: attention that takes any plug-in encoding;
* :mod:`posenc.rope_types`: RoPE frequency tables for every ``rope_type`` (registry and properties table);
* :mod:`posenc.rope`: the rotation in both layouts and its plain formula (``rope_reference``), :func:`pair_indices`,
  weight permutation, :class:`RotaryEmbedding` (the RoPE plug-in); its private engines are ``posenc._rope_dispatch``
  (the one dispatcher), ``_rope_kernels`` (CPU speed), ``_triton_rope`` (CUDA), ``_rope_cache`` (the module's tables)
  and ``_rope_positions``;
* :mod:`posenc.rope_analysis`: RoPE's long-range bound, per-pair logits, angle errors;
* :mod:`posenc.alibi`: ALiBi slopes, biases and its plug-in;
* :mod:`posenc.nd_rope`: RoPE for 2-D and N-D positions (axial, mixed, M-RoPE) and its plug-in :class:`NDRoPE`;
* :mod:`posenc.generators`: the generators ``X`` of every family (RoPE, xPos, RetNet, decay, Jordan, ALiBi) and
  their frequency laws;
* :mod:`posenc.xpos`: xPos as RoPE's elementwise pass with a per-pair scale (:func:`~posenc.xpos.apply_xpos_qk`) and
  its plug-in :class:`~posenc.xpos.XPos`, equal to ``GroupEncoding(xpos_generator(...))``;
* :mod:`posenc.group_encodings`: the maps ``exp(tX)`` and ``exp(sum_i p_i X_i)`` (the Lie view) and the plug-ins
  :class:`GroupEncoding`, :class:`MultiGroupEncoding`;
* :mod:`posenc.learned_generators`: learned generators for N-D positions, commuting (ComRoPE, Cayley-STRING) or not
  (LieRE), and how far from relative an encoding is;
* :mod:`posenc.data_dependent`: encodings that read the content (CoPE, FoX, PaTH), plug-ins of the kind "content";
* :mod:`posenc.jordan`: the numerical real Jordan form of a generator, i.e. the family of its encoding;
* :mod:`posenc.context_extension`: wavelengths, turns and trade-offs of stretched frequency tables;
* :mod:`posenc.layer_patterns`: models whose layers differ: hybrid RoPE/NoPE layers
  (:class:`~posenc.layer_patterns.LayerEncodings`), Llama 4's attention temperature for NoPE layers, the per-layer
  pattern of a transformers config;
* :mod:`posenc.mla`: DeepSeek's multi-head latent attention, why RoPE on the whole key blocks its absorption of
  ``W_UK`` and how the decoupled rope slice restores it (:class:`~posenc.mla.LatentAttention`);
* :mod:`posenc.transformers_rope`: a transformers model whose attention takes ``(cos, sin)`` (Llama, Mistral, Qwen,
  Gemma, Phi, Cohere, DeepSeek-V3, ...; decided by structure) run with posenc's RoPE, one instance at a time,
  unchanged or with changed tables, pairs or layers (:func:`use_posenc_rope`);
* :mod:`posenc.lab`: the book's plumbing (figures, experiments and their tasks and tables, pretrained embeddings,
  the language-model harness, the geometry of positional distributions); not imported by ``import posenc``.

The public surface below (``__all__``) is what chapters 1 to 6 use and every plug-in encoding; each name has one
home, the module it is imported from. Every library module is imported with the
package, so ``posenc.<module>`` works too; no public function shadows a module.

Import rule of the book's notebooks: ``import posenc`` and the names of ``__all__`` written ``posenc.<name>``; a
later chapter's own modules imported as ``from posenc import <module>``
(the library) or ``from posenc.lab import <module>`` (the lab), and their names written ``<module>.<name>``,
never ``from posenc.<module> import <name>``. Modules whose names the chapters also use for values keep one alias
book-wide: ``generators as gens``, ``tables as fmt``, ``tasks as order_tasks``, ``experiments as ex``,
``context_extension as ext``, ``language_model as lm_tools``. The one exception: the figure helpers,
``from posenc.lab.interactive import interactive_figure, show_figure``.
"""

from . import (
    absolute,
    alibi,
    context_extension,
    data_dependent,
    encodings,
    generators,
    group_encodings,
    jordan,
    layer_patterns,
    learned_generators,
    mla,
    multihead,
    nd_rope,
    rope,
    rope_analysis,
    rope_types,
    transformers_rope,
    xpos,
)
from .absolute import (
    LearnedInput,
    LearnedPositionalEmbedding,
    SinusoidalInput,
    binary_encoding,
    consecutive_distances,
    integer_encoding,
    sinusoidal_dot_product,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)
from .alibi import ALiBi, alibi_bias, alibi_slopes
from .data_dependent import CoPE, FoX, PaTH
from .encodings import KINDS, NoPE, PositionalEncoding
from .group_encodings import GroupEncoding, MultiGroupEncoding
from .learned_generators import CayleySTRING, ComRoPE, LieRE
from .multihead import attention, causal_mask, merge_heads, self_attention, split_heads
from .nd_rope import NDRoPE
from .rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_,
    apply_rope_qk,
    interleaved_to_half_permutation,
    pair_indices,
    permute_qk_weight,
    rope_angles,
    rope_cos_sin,
    rope_matrix,
    rotate,
)
from .rope_types import (
    ROPE_FREQUENCY_FUNCTIONS,
    ROPE_TYPES,
    check_rope_parameters,
    rope_frequencies,
    rope_parameters_from_config,
)
from .transformers_rope import use_posenc_rope
from .xpos import XPos

__version__ = "0.1.0"

__all__ = [
    # absolute encodings (chapters 2 to 4)
    "integer_encoding",
    "binary_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_encoding",
    "sinusoidal_dot_product",
    "consecutive_distances",
    "LearnedPositionalEmbedding",
    # the plug-in protocol and attention (chapter 1)
    "KINDS",
    "PositionalEncoding",
    "NoPE",
    "attention",
    "self_attention",
    "causal_mask",
    "split_heads",
    "merge_heads",
    # RoPE (chapters 5 and 6)
    "ROPE_TYPES",
    "ROPE_FREQUENCY_FUNCTIONS",
    "check_rope_parameters",
    "rope_frequencies",
    "pair_indices",
    "rope_angles",
    "rope_cos_sin",
    "apply_rope",
    "apply_rope_qk",
    "apply_rope_",
    "rotate",
    "rope_matrix",
    "interleaved_to_half_permutation",
    "permute_qk_weight",
    # ALiBi
    "alibi_slopes",
    "alibi_bias",
    # transformers models run with posenc's RoPE (chapter 12)
    "rope_parameters_from_config",
    "use_posenc_rope",
    # every plug-in encoding, with its family
    "SinusoidalInput",
    "LearnedInput",
    "RotaryEmbedding",
    "ALiBi",
    "NDRoPE",
    "XPos",
    "GroupEncoding",
    "MultiGroupEncoding",
    "ComRoPE",
    "CayleySTRING",
    "LieRE",
    "CoPE",
    "FoX",
    "PaTH",
]


def __getattr__(name):
    # the book's lab is loaded on first use: `import posenc` and help(posenc) show the library
    if name == "lab":
        import importlib

        return importlib.import_module(".lab", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
