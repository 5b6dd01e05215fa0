"""posenc.group_encodings: the maps exp(tX) and exp(sum_i p_i X_i), their group law, and the plug-ins."""

import pytest
import torch
from group_helpers import (
    D,
    axial_generators,
    family_generators,
    logits,
    random_generator,
    random_skew_generators,
    times,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import generators, group_encodings, jordan
from posenc.group_encodings import _exp_each, _exp_on_grid


# the group ------------------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(a=times, b=times, seed=st.integers(0, 2**16))
def test_group_law(a, b, seed):
    x = random_generator(seed=seed)
    first, second = group_encodings.one_parameter_group(x, a), group_encodings.one_parameter_group(x, b)
    together = group_encodings.one_parameter_group(x, a + b)
    scale = torch.linalg.matrix_norm(first) * torch.linalg.matrix_norm(second)  # round-off of the product
    assert (first @ second - together).abs().max() <= 1e-11 * scale


def test_identity_at_zero_and_shapes_and_dtype():
    x = random_generator()
    # exact by construction: 0 * X is exactly the zero matrix, and every operation of exp (polynomial terms, scaling
    # and squaring) on 0 and I is exact
    assert torch.equal(group_encodings.one_parameter_group(x, 0.0), torch.eye(D, dtype=torch.float64))
    assert group_encodings.one_parameter_group(x, torch.zeros(3, 4)).shape == (3, 4, D, D)
    assert group_encodings.one_parameter_group(x.to(torch.bfloat16), 2).dtype == torch.float32  # float32 or better
    assert group_encodings.one_parameter_group(x.float(), torch.tensor(2.0, dtype=torch.float64)).dtype == torch.float64


def test_grid_evaluation_equals_one_exponential_per_time():
    x = random_generator(scale=0.05)
    t = torch.arange(-40, 300, dtype=torch.float64)
    assert torch.allclose(_exp_on_grid(x, t), _exp_each(x, t), rtol=1e-10, atol=1e-10)
    assert torch.allclose(
        group_encodings.one_parameter_group(x, torch.arange(-40, 300)), _exp_each(x, t), rtol=1e-10, atol=1e-10
    )


def test_key_map_is_inverse_transpose():
    encoding = posenc.GroupEncoding(random_generator())
    s = torch.tensor([-2.5, 0.0, 3.0, 17.0])
    query, key = encoding.query_maps(s), encoding.key_maps(s)
    scale = (torch.linalg.matrix_norm(query) * torch.linalg.matrix_norm(key))[:, None, None]
    assert ((query.transpose(-1, -2) @ key - torch.eye(D, dtype=torch.float64)).abs() <= 1e-12 * scale).all()


# translation invariance -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(family_generators()))
@settings(max_examples=10, deadline=None)
@given(shift=st.floats(min_value=-50, max_value=50, allow_nan=False))
def test_group_encoding_logits_depend_only_on_the_offset(family, shift):
    encoding = posenc.GroupEncoding(family_generators()[family])
    q, k = torch.randn(2, 3, 5, D, dtype=torch.float64), torch.randn(2, 3, 6, D, dtype=torch.float64)
    q_pos, k_pos = torch.tensor([0.0, 1.5, 2.0, 7.0, 9.25], dtype=torch.float64), torch.arange(6.0).double()
    before = logits(encoding, q, k, q_pos, k_pos)
    after = logits(encoding, q, k, q_pos + shift, k_pos + shift)
    # round-off grows with the size of the maps themselves (large for growth at large times)
    norms = [
        torch.linalg.matrix_norm(m).max()
        for m in (encoding.query_maps(q_pos + shift), encoding.key_maps(k_pos + shift))
    ]
    assert (before - after).abs().max() <= 1e-11 * norms[0] * norms[1] * q.norm(dim=-1).max() * k.norm(dim=-1).max()
    kernel = group_encodings.relative_kernel(encoding.generator, q_pos[:, None] - k_pos[None, :])  # (Lq, Lk, D, D)
    direct = torch.einsum("bhid,ijde,bhje->bhij", q, kernel, k)
    assert torch.allclose(before, direct, rtol=1e-7, atol=1e-7 * before.abs().max().item())


def test_a_map_that_is_not_a_group_is_not_translation_invariant():
    x = random_generator()

    class Linearised(posenc.GroupEncoding):  # F(t) = I + tX: the first-order truncation, not a group
        def query_maps(self, positions, sign=1.0):
            t = sign * torch.as_tensor(positions, dtype=torch.float64)
            return torch.eye(D, dtype=torch.float64) + t[..., None, None] * self.generator

    encoding = Linearised(x)
    q, k = torch.randn(1, 1, 4, D, dtype=torch.float64), torch.randn(1, 1, 4, D, dtype=torch.float64)
    positions = torch.arange(4.0)
    change = logits(encoding, q, k, positions, positions) - logits(encoding, q, k, positions + 5, positions + 5)
    assert change.abs().max() > 0.1


def test_batched_positions_and_one_generator_per_head():
    heads = torch.stack(
        [generators.damped_rope_generator(D, g, dtype=torch.float64) for g in generators.retnet_decays(3)]
    )
    encoding = posenc.GroupEncoding(heads)
    q, k = (torch.randn(1, 3, 5, D, dtype=torch.float64).expand(2, 3, 5, D) for _ in range(2))
    positions = torch.stack((torch.arange(5), torch.arange(5) + 11))
    batched = logits(encoding, q, k, positions, positions)
    for b in range(2):
        for h in range(3):
            single = posenc.GroupEncoding(heads[h])
            expected = logits(single, q[b, h], k[b, h], positions[b], positions[b])
            # same maps, products grouped differently by einsum: a few ulp of |q| |k| ||F|| ||G|| per logit
            bound = (
                64
                * torch.finfo(torch.float64).eps
                * (q[b, h].norm(dim=-1).max() * k[b, h].norm(dim=-1).max() * size_of_maps(single, positions[b]))
            )
            assert (batched[b, h] - expected).abs().max() <= bound
    # shifted rows, same offsets: equal in exact arithmetic; round-off of the maps at positions up to 15 (norms of
    # F and G at most gamma^-15 < 1.7), relative to the largest logit
    assert torch.allclose(batched[0], batched[1], rtol=0, atol=1e-12 * batched.abs().max().item())


def size_of_maps(encoding, positions):
    """max ||F(t)|| * max ||G(t)|| over ``positions`` (spectral norms): the scale of the round-off in a logit."""
    return (
        torch.linalg.matrix_norm(encoding.query_maps(positions), ord=2).max()
        * torch.linalg.matrix_norm(encoding.key_maps(positions), ord=2).max()
    )


def test_learnable_generator_gets_gradients_and_low_precision_inputs_keep_their_dtype():
    encoding = posenc.GroupEncoding(generators.rope_generator(D), learnable=True)
    q = torch.randn(1, 2, 4, D, requires_grad=True)
    logits(encoding, q, q, torch.arange(4), torch.arange(4)).sum().backward()
    assert isinstance(encoding.generator, torch.nn.Parameter)
    assert encoding.generator.grad is not None and encoding.generator.grad.abs().sum() > 0
    q_half, k_half = posenc.GroupEncoding(generators.rope_generator(D)).encode_qk(
        q.detach().bfloat16(), q.detach().bfloat16(), torch.arange(4), torch.arange(4)
    )
    assert q_half.dtype == k_half.dtype == torch.bfloat16


# N-D ------------------------------------------------------------------------------------------------------------
def test_commuting_generators_give_relative_encodings_and_others_do_not():
    q, k = torch.randn(1, 1, 5, D, dtype=torch.float64), torch.randn(1, 1, 5, D, dtype=torch.float64)
    p = torch.randn(5, 2, dtype=torch.float64) * 3
    shift = torch.tensor([4.0, -7.0], dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))
    string = basis.T @ axial_generators() @ basis  # STRING: RoPE in a learned orthogonal basis, still commuting
    for commuting in (axial_generators(), string):
        encoding = posenc.MultiGroupEncoding(commuting)
        before, after = logits(encoding, q, k, p, p), logits(encoding, q, k, p + shift, p + shift)
        assert torch.allclose(before, after, atol=1e-9)
    liere = posenc.MultiGroupEncoding(random_skew_generators(), check=False)
    before, after = logits(liere, q, k, p, p), logits(liere, q, k, p + shift, p + shift)
    assert (before - after).abs().max() > 0.1


def test_commuting_check():
    group_encodings.check_commuting(axial_generators())
    x = random_generator()
    group_encodings.check_commuting(torch.stack((x, x @ x, 2 * x)))  # polynomials in one matrix commute
    with pytest.raises(ValueError, match="generators 0 and 1 do not commute"):
        group_encodings.check_commuting(random_skew_generators())
    with pytest.raises(ValueError, match="do not commute"):
        group_encodings.multi_parameter_group(random_skew_generators(), torch.zeros(2))
    with pytest.raises(ValueError, match="do not commute"):
        posenc.MultiGroupEncoding(random_skew_generators())


def test_multi_parameter_group_reduces_to_one_parameter():
    x = random_generator()
    assert torch.allclose(
        group_encodings.multi_parameter_group(x[None], torch.tensor([2.5])),
        group_encodings.one_parameter_group(x, 2.5),
        atol=1e-12,
    )
    assert group_encodings.multi_parameter_group(axial_generators(), torch.zeros(3, 4, 2)).shape == (3, 4, D, D)


# bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, error, match",
    [
        (torch.zeros(3, 4), ValueError, "generator must be a square matrix"),
        (torch.zeros(2, 3, 3), ValueError, "generator must be a square matrix"),
        (torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), ValueError, "generator must be finite"),
        (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), ValueError, "generator must be finite"),
        (torch.zeros(2, 2, dtype=torch.complex64), TypeError, "generator must be a real matrix"),
        ([[0.0, 1.0], [0.0, 0.0]], TypeError, "generator must be a torch.Tensor"),
    ],
)
def test_bad_generators(bad, error, match):
    with pytest.raises(error, match=match):
        group_encodings.one_parameter_group(bad, 1.0)
    with pytest.raises(error, match=match):
        jordan.classify_generator(bad)


def test_bad_times_and_positions():
    x = generators.rope_generator(D)
    with pytest.raises(ValueError, match="t must be finite"):
        group_encodings.one_parameter_group(x, torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="t must hold integer or real numbers"):
        group_encodings.one_parameter_group(x, torch.tensor([True]))
    with pytest.raises(ValueError, match=r"positions must have shape \(\.\.\., n\) with n = 2"):
        group_encodings.multi_parameter_group(axial_generators(), torch.zeros(5, 3))
    encoding = posenc.GroupEncoding(x)
    q = torch.randn(1, 2, 5, D)
    with pytest.raises(ValueError, match="q_positions must have length 5"):
        encoding.encode_qk(q, q, torch.arange(4), torch.arange(5))
    with pytest.raises(ValueError, match=r"q_positions must have shape \(L,\) or \(B, L\)"):
        encoding.encode_qk(q, q, torch.zeros(1, 1, 5), torch.arange(5))
    with pytest.raises(ValueError, match=f"k must have shape \\(\\.\\.\\., L, {D}\\)"):
        encoding.encode_qk(q, torch.randn(1, 2, 5, D + 2), torch.arange(5), torch.arange(5))
    heads = posenc.GroupEncoding(torch.stack([x] * 3))
    with pytest.raises(ValueError, match="H = 3"):
        heads.encode_qk(q, q, torch.arange(5), torch.arange(5))
    nd = posenc.MultiGroupEncoding(axial_generators())
    with pytest.raises(ValueError, match=r"q_positions must have shape \(L, 2\) or \(B, L, 2\)"):
        nd.encode_qk(q, q, torch.zeros(5), torch.zeros(5, 2))


def test_everything_runs_on_the_meta_device():
    """No hidden CPU tensors: constructors, maps and encodings stay on the device they are given."""
    meta = torch.device("meta")
    for generator in (
        generators.rope_generator(D, device=meta),
        generators.xpos_generator(D, device=meta),
        generators.damped_rope_generator(D, 0.9, device=meta),
        generators.decay_generator(D, 0.1, device=meta),
        generators.jordan_generator(D, device=meta),
        generators.alibi_generator(device=meta),
    ):
        assert generator.device == meta
    x = generators.rope_generator(D, device=meta)
    assert group_encodings.one_parameter_group(x, torch.arange(5.0, device=meta)).device == meta
    q = torch.randn(2, 3, 5, D, device=meta)
    for encoding in (posenc.GroupEncoding(x), posenc.GroupEncoding(torch.stack([x] * 3))):
        q_out, k_out = encoding.encode_qk(q, q, torch.arange(5, device=meta), torch.arange(10, device=meta)[None, :5])
        assert q_out.device == k_out.device == meta and q_out.shape == q.shape
    nd = posenc.MultiGroupEncoding(axial_generators().to(meta))
    assert nd.encode_qk(q, q, torch.zeros(5, 2, device=meta), torch.zeros(5, 2, device=meta))[0].device == meta
