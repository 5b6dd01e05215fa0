"""Generators shared by the tests of posenc.generators, posenc.group_encodings and posenc.jordan."""

import torch
from hypothesis import strategies as st

from posenc import generators

D = 8
times = st.floats(min_value=-30, max_value=30, allow_nan=False)


def random_generator(dim=D, scale=0.3, seed=0):
    return scale * torch.randn(dim, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def family_generators(dim=D):
    """One float64 generator per family (and the known encodings)."""
    return {
        "none": torch.zeros(dim, dim, dtype=torch.float64),
        "decay": generators.decay_generator(dim, torch.linspace(0.05, 0.5, dim), dtype=torch.float64),
        "growth": generators.decay_generator(dim, -0.1, dtype=torch.float64),
        "rotation": generators.rope_generator(dim, dtype=torch.float64),
        "xpos": generators.xpos_generator(dim, dtype=torch.float64),
        "retnet": generators.damped_rope_generator(dim, 0.9, dtype=torch.float64),
        "jordan": generators.jordan_generator(dim, -0.05, dtype=torch.float64),
        "jordan real": generators.jordan_generator(dim, 0.0, 0.0, block=4, dtype=torch.float64),
        "dense": random_generator(dim),
    }


def logits(encoding, q, k, q_positions, k_positions):
    q_out, k_out = encoding.encode_qk(q, k, q_positions, k_positions)
    return q_out @ k_out.transpose(-1, -2)


def axial_generators(dim=D):
    half = generators.rope_generator(dim // 2, dtype=torch.float64)
    zero = torch.zeros_like(half)
    return torch.stack((torch.block_diag(half, zero), torch.block_diag(zero, half)))


def random_skew_generators(n=2, dim=D):
    w = torch.randn(n, dim, dim, dtype=torch.float64)
    return 0.3 * (w - w.transpose(-1, -2))


def torus_generators(frequencies, seed=0, extra=0):
    """Commuting skew generators Q (plus_j w_ij J) Q^T (+ an ``extra``-dimensional common kernel), Q random."""
    n, planes = frequencies.shape
    dim = 2 * planes + extra
    basis, _ = torch.linalg.qr(
        torch.randn(dim, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    )
    j = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    blocks = [
        torch.block_diag(*[w * j for w in frequencies[i]], torch.zeros(extra, extra, dtype=torch.float64))
        for i in range(n)
    ]
    return torch.stack([basis @ b @ basis.T for b in blocks])
