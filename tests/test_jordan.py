"""posenc.jordan: the numerical real Jordan form of a generator, and the family it names."""

import math

import pytest
import torch

from posenc import generators, jordan


# classification -------------------------------------------------------------------------------------------------
def block_signature(blocks):
    return [(b.family, b.size, b.multiplicity) for b in blocks]


KNOWN_STRUCTURES = {
    "none": (torch.zeros(3, 3), [("none", 1, 3)]),
    "decay": (generators.decay_generator(3, torch.tensor([0.5, 1.0, 2.0])), [("decay", 1, 1)] * 3),
    "growth": (generators.decay_generator(2, -0.3), [("growth", 1, 2)]),
    "rotation": (generators.rope_generator(6), [("rotation", 1, 1)] * 3),
    "damped rotation (xPos)": (generators.xpos_generator(6), [("damped rotation", 1, 1)] * 3),
    "damped rotation (RetNet)": (generators.damped_rope_generator(4, 0.9), [("damped rotation", 1, 1)] * 2),
    "alibi": (generators.alibi_generator(), [("real jordan", 2, 1)]),
    "jordan real 3": (generators.jordan_generator(3, -0.2, 0.0, block=3), [("real jordan", 3, 1)]),
    "jordan unipotent 4": (generators.jordan_generator(4, 0.0, 0.0, block=4), [("real jordan", 4, 1)]),
    "jordan real growth": (generators.jordan_generator(4, 0.3, 0.0, block=2), [("growth", 2, 2)]),
    "jordan complex growth": (generators.jordan_generator(4, 0.2, 0.8, block=2), [("growth", 2, 1)]),
    "jordan complex 2": (generators.jordan_generator(8, -0.05, 1.3, block=2), [("jordan", 2, 2)]),
    "jordan complex 3": (generators.jordan_generator(6, 0.0, 0.7, block=3), [("jordan", 3, 1)]),
    "mixed": (
        torch.block_diag(
            generators.jordan_generator(4, -0.1, 0.9),
            generators.alibi_generator(),
            generators.decay_generator(2, 0.3),
            generators.rope_generator(4),
            torch.zeros(1, 1),
        ),
        [
            ("none", 1, 1),
            ("decay", 1, 2),
            ("rotation", 1, 1),
            ("rotation", 1, 1),
            ("real jordan", 2, 1),
            ("jordan", 2, 1),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWN_STRUCTURES))
@pytest.mark.parametrize("seed", range(3))
def test_classification_of_known_jordan_structures_in_a_random_basis(name, seed):
    block, expected = KNOWN_STRUCTURES[name]
    assert block_signature(jordan.classify_generator(block)) == expected  # natural basis, float32
    generator = torch.Generator().manual_seed(seed)
    basis = torch.randn(block.shape[0], block.shape[0], dtype=torch.float64, generator=generator)
    disguised = basis @ block.double() @ torch.linalg.inv(basis)
    blocks = jordan.classify_generator(disguised)
    assert block_signature(blocks) == expected
    assert sum(b.real_size * b.multiplicity for b in blocks) == block.shape[0]
    assert block_signature(jordan.classify_generator(1e3 * disguised)) == expected  # rescaling time
    assert block_signature(jordan.classify_generator(1e-3 * disguised)) == expected


def test_classification_eigenvalues_and_summary():
    blocks = jordan.classify_generator(generators.jordan_generator(4, -0.25, 1.5, block=2, dtype=torch.float64))
    assert len(blocks) == 1 and blocks[0].eigenvalue == pytest.approx(complex(-0.25, 1.5), abs=1e-9)
    assert blocks[0].bounded  # t e^{-t/4}: the decay wins over the polynomial
    alibi = jordan.classify_generator(generators.alibi_generator())
    assert not alibi[0].bounded  # polynomial growth: e^{0 t} t
    text = jordan.summarize(
        jordan.classify_generator(torch.block_diag(generators.rope_generator(4), generators.decay_generator(1, -1.0)))
    )
    assert "rotation" in text and "growth" in text and "bounded for t -> +inf: no (growth)" in text
    xpos = jordan.classify_generator(generators.xpos_generator(64))
    assert {b.family for b in xpos} == {"damped rotation"} and len(xpos) == 32


def test_classification_tolerance_separates_a_tiny_frequency_from_alibi():
    generator = torch.block_diag(
        generators.rope_generator(128, dtype=torch.float64), generators.alibi_generator(torch.float64)
    )
    found = jordan.families(jordan.classify_generator(generator))
    assert found == {"rotation": 128, "real jordan": 2}


@pytest.mark.parametrize("dtype, speed", [(torch.float32, 1e3), (torch.float64, 1e6)])
def test_a_jordan_block_beside_a_much_faster_rotation_is_not_read_as_normal(dtype, speed):
    # ||[X, X^T]|| is quadratic in a Jordan coupling e: next to a rotation `speed` times faster, ALiBi's e = 1 passes
    # the commutator test (e^2 <= tol * speed^2), but the ranks resolve it (e / speed >> tol), and so must the
    # classification (the departure from normality, linear in e, sends it to the general path)
    alibi = torch.block_diag(speed * generators.rope_generator(8, dtype=dtype), generators.alibi_generator(dtype))
    assert jordan.families(jordan.classify_generator(alibi)) == {"rotation": 8, "real jordan": 2}
    complex_block = generators.jordan_generator(4, 0.0, 1.0, block=2, dtype=torch.float64)
    complex_block[:2, 2:] /= 10.0  # coupling 0.1: still far above the ranks' resolution at this speed
    generator = torch.block_diag(speed / 10 * generators.rope_generator(4, dtype=torch.float64), complex_block)
    assert jordan.families(jordan.classify_generator(generator.to(dtype))) == {"rotation": 4, "jordan": 4}


def test_real_and_complex_jordan_blocks_are_different_families():
    assert jordan.family_of(0j, 2) == "real jordan" and jordan.family_of(complex(-0.1, 0.0), 3) == "real jordan"
    assert jordan.family_of(complex(0.0, 0.5), 2) == "jordan" and jordan.family_of(complex(-0.1, 0.5), 2) == "jordan"
    assert jordan.family_of(complex(0.1, 0.0), 2) == jordan.family_of(complex(0.1, 0.5), 3) == "growth"
    assert {"real jordan", "jordan"} <= set(jordan.FAMILIES)
    mixed = torch.block_diag(
        generators.alibi_generator(torch.float64),
        generators.jordan_generator(4, -0.1, 0.7, block=2, dtype=torch.float64),
    )
    assert jordan.families(jordan.classify_generator(mixed)) == {"real jordan": 2, "jordan": 4}


def test_xpos_damping_is_log_zeta_over_scale_base():
    damping = generators.xpos_generator(64, dtype=torch.float64).diagonal()[:32]  # half layout: pair j on feature j
    reference = torch.tensor([math.log(z) for z in generators.xpos_scales(64).tolist()], dtype=torch.float64) / 512
    # log1p vs log of the rounded zeta: they differ by the rounding of zeta amplified by 1 / |ln zeta| <= 90
    assert torch.allclose(damping, reference, rtol=1e-13, atol=0)
    assert jordan.families(jordan.classify_generator(generators.xpos_generator(256, dtype=torch.float64))) == {
        "damped rotation": 256
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_generators_resolve_small_rates_and_gaps_in_any_dtype(dtype):
    # xPos at D = 256: the slowest pair's damping is -1.1e-5; RoPE at D = 512: the slowest frequencies are 3.7e-6
    # apart. Both are far above the round-off of the stored entries (~1e-7 in float32), though below 100 eps.
    assert jordan.families(jordan.classify_generator(generators.xpos_generator(256, dtype=dtype))) == {
        "damped rotation": 256
    }
    rope = jordan.classify_generator(generators.rope_generator(512, dtype=dtype))
    assert len(rope) == 256 and all(b.multiplicity == 1 for b in rope)
    # an explicit tol still reads parts below tol * ||X|| as zero
    slow = generators.damped_rope_generator(8, 1 - 2.0**-20, dtype=dtype)  # u = ln(1 - 2^-20) ~ -9.5e-7
    assert jordan.families(jordan.classify_generator(slow)) == {"damped rotation": 8}
    assert jordan.families(jordan.classify_generator(slow, tol=1e-4)) == {"rotation": 8}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(3))
def test_rotated_normal_generator_keeps_repeated_frequencies_together(dtype, seed):
    """Q (RoPE + RoPE + 0) Q^T computed in dtype: the same 2 x 8 frequencies twice and a 3-D kernel."""
    n = 35
    basis, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    rope = generators.rope_generator(16, dtype=torch.float64)
    block = torch.block_diag(rope, rope, torch.zeros(3, 3, dtype=torch.float64))
    x = basis.to(dtype) @ block.to(dtype) @ basis.to(dtype).T
    blocks = jordan.classify_generator(x)
    assert jordan.families(blocks) == {"none": 3, "rotation": 32}
    assert sorted(b.multiplicity for b in blocks) == [2] * 8 + [3]
