"""Independent references for RoPE, written the way the original sources write them (for tests only)."""

import warnings

import torch

# The rope_parameters the cross-checks use, one per rope_type (head_dim 64 -> 32 pairs).
ROPE_CASES = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 256},
    "yarn-mscale": {
        "factor": 8.0,
        "original_max_position_embeddings": 128,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "longrope": {
        "short_factor": [1.0 + 0.05 * i for i in range(32)],
        "long_factor": [1.5 + 0.3 * i for i in range(32)],
        "original_max_position_embeddings": 256,
        "factor": 4.0,
    },
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
}
HEAD_DIM, N_HEADS, MAX_POSITIONS = 64, 4, 1024


def rope_parameters(case: str) -> dict:
    return {"rope_type": case.split("-")[0], "rope_theta": 10000.0, **ROPE_CASES[case]}


def llama_rotary(case: str):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=HEAD_DIM * N_HEADS,
        num_attention_heads=N_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=rope_parameters(case),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaRotaryEmbedding(config)


def meta_interleaved_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Meta's reference formulation: consecutive pairs as complex numbers times e^{i m theta_k}."""
    dim = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(positions.float(), freqs)
    rotation = torch.polar(torch.ones_like(angles), angles)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)
