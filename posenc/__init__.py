"""posenc: positional encodings for attention, the library under the book.

Modules, one concept each:

* :mod:`posenc.absolute`: integer, binary, sinusoidal and learned position vectors;
* :mod:`posenc.rope_frequencies`: RoPE frequency tables for every ``rope_type`` (registry);
* :mod:`posenc.rope`: the rotation in both layouts, weight permutation, :class:`RotaryEmbedding`;
* :mod:`posenc.alibi`: ALiBi slopes and biases;
* :mod:`posenc.encodings` and :mod:`posenc.attention`: plug-in encodings and attention that takes any of them;
* :mod:`posenc.embeddings`: real pretrained token and position embeddings (MiniLM offline);
* :mod:`posenc.interactive`: live and static sliders from one drawing function.
"""
from .absolute import (LearnedPositionalEmbedding, binary_encoding, integer_encoding, sinusoidal_encoding,
                       sinusoidal_frequencies)
from .alibi import alibi_bias, alibi_slopes
from .attention import attention, causal_mask, self_attention
from .encodings import ALiBi, LearnedInput, NoPE, PositionalEncoding, RoPE, SinusoidalInput
from .rope import (RotaryEmbedding, apply_rope, interleaved_to_half_permutation, permute_qk_weight, rope_angles,
                   rope_cos_sin, rope_matrix, rotate)
from .rope_frequencies import ROPE_FREQUENCY_FUNCTIONS, rope_frequencies

from . import embeddings, interactive

__version__ = "0.1.0"
