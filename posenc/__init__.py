"""posenc: positional encodings for attention, the library under the book.

Modules, one concept each:

* :mod:`posenc.absolute`: integer, binary, sinusoidal and learned position vectors;
* :mod:`posenc.rope_frequencies`: RoPE frequency tables for every ``rope_type`` (registry);
* :mod:`posenc.rope`: the rotation in both layouts, weight permutation, :class:`RotaryEmbedding`;
* :mod:`posenc.alibi`: ALiBi slopes and biases;
* :mod:`posenc.encodings` and :mod:`posenc.attention`: plug-in encodings and attention that takes any of them;
* :mod:`posenc.embeddings`: real pretrained token and position embeddings (MiniLM offline);
* :mod:`posenc.interactive`: live and static sliders from one drawing function;
* :mod:`posenc.nd_rope`: RoPE for 2-D and N-D positions (axial, mixed) and its Lie view;
* :mod:`posenc.rope_analysis`: RoPE's long-range bound, per-pair logits, angle errors;
* :mod:`posenc.context_extension`: wavelengths, turns and trade-offs of stretched frequency tables;
* :mod:`posenc.groups` (with :mod:`posenc.group_encodings`): one-parameter groups exp(tX), their classification
  and the encodings they give (RoPE, xPos, RetNet, ALiBi, the Jordan class);
* :mod:`posenc.geometry`: positional distributions, Hellinger distances, classical MDS, stress;
* :mod:`posenc.tasks` and :mod:`posenc.experiments`: synthetic order tasks and small transformers to train;
* :mod:`posenc.language_model`: a real Llama-architecture model (SmolLM2-135M) loaded offline and run with posenc's RoPE.
"""
from .absolute import (LearnedPositionalEmbedding, binary_encoding, integer_encoding, sinusoidal_encoding,
                       sinusoidal_frequencies)
from .alibi import alibi_bias, alibi_slopes
from .attention import attention, causal_mask, self_attention
from .encodings import ALiBi, LearnedInput, NoPE, PositionalEncoding, RoPE, SinusoidalInput
from .rope import (RotaryEmbedding, apply_rope, apply_rope_, interleaved_to_half_permutation, permute_qk_weight,
                   rope_angles, rope_cos_sin, rope_matrix, rotate)
from .rope_frequencies import ROPE_FREQUENCY_FUNCTIONS, rope_frequencies

from . import (context_extension, embeddings, experiments, geometry, group_encodings, groups, interactive,
               language_model, nd_rope, rope_analysis, tasks)
from .absolute import consecutive_distances, sinusoidal_dot_product
from .nd_rope import NDRoPE
from .groups import GroupEncoding

__version__ = "0.1.0"
