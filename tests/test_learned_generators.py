"""ComRoPE, Cayley-STRING and LieRE (posenc.learned_generators) against their definitions."""

import math

import pytest
import torch

import posenc
from posenc import learned_generators as lg
from posenc.group_encodings import check_commuting, multi_parameter_group
from posenc.nd_rope import grid_positions


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _logit_matrix(encoding, q, k, positions):
    """Unscaled logits q'^T k' of one head: (L, L)."""
    qs, ks = (x.expand(len(positions), -1)[None, None] for x in (q, k))
    qe, ke = encoding.encode_qk(qs, ks, positions, positions)
    return (qe @ ke.transpose(-1, -2))[0, 0]


def test_skew_and_cayley():
    a = torch.randn(5, 5, generator=_gen(0), dtype=torch.float64)
    s = lg.skew(a)
    assert torch.equal(s, -s.T)
    p = lg.cayley(s)
    # orthogonal with determinant +1, to float64 round-off of a 5 x 5 solve
    assert torch.allclose(p.T @ p, torch.eye(5, dtype=torch.float64), atol=1e-12)
    assert torch.linalg.det(p).item() == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(lg.cayley(torch.zeros(3, 3)), torch.eye(3))
    with pytest.raises(ValueError, match="skew_matrix"):
        lg.cayley(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="matrix"):
        lg.skew([[0.0]])


@pytest.mark.parametrize("variant", lg.COMROPE_VARIANTS)
def test_comrope_generators_commute_and_follow_the_definition(variant):
    enc = lg.ComRoPE(12, n_axes=3, block_size=4, variant=variant, generator=_gen(1)).double()
    gens = enc.generator_matrices().detach().double()
    check_commuting(gens)  # raises if any pair fails
    assert lg.max_commutator_norm(gens).item() < 1e-12
    # block c of X_i is a_ic S_c, zero off the diagonal blocks
    blocks = lg.skew(enc.raw_blocks.detach().double())
    coefficients = enc.coefficients.detach().double().expand(3, 3)
    for i in range(3):
        for c in range(3):
            sl = slice(4 * c, 4 * c + 4)
            assert torch.equal(gens[i, sl, sl], coefficients[i, c] * blocks[c])
        off = gens[i].clone()
        for c in range(3):
            off[4 * c : 4 * c + 4, 4 * c : 4 * c + 4] = 0
        assert torch.equal(off, torch.zeros_like(off))
    if variant == "ap":  # block c turns with axis c mod n only
        assert torch.equal(coefficients, torch.eye(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "make",
    [
        lambda coords: lg.ComRoPE(8, 2, block_size=4, variant="ap", coordinates=coords, generator=_gen(2)),
        lambda coords: lg.ComRoPE(8, 2, block_size=4, variant="ld", coordinates=coords, generator=_gen(2)),
        lambda coords: lg.CayleySTRING(8, 2, coordinates=coords, scale=0.5, generator=_gen(2)),
    ],
    ids=["comrope-ap", "comrope-ld", "cayley-string"],
)
def test_commuting_encodings_are_relative(make):
    coords = grid_positions(4, 4)
    enc = make(coords).double()
    q, k = (
        torch.randn(8, generator=_gen(3), dtype=torch.float64),
        torch.randn(8, generator=_gen(4), dtype=torch.float64),
    )
    logits = _logit_matrix(enc, q, k, torch.arange(16))
    # logit of query i and key j depends on coords[j] - coords[i] only: equal across pairs with the same offset
    offsets = coords[None, :, :] - coords[:, None, :]
    for offset in {tuple(o) for o in offsets.reshape(-1, 2).tolist()}:
        same = (offsets == torch.tensor(offset)).all(-1)
        values = logits[same]
        assert (values.max() - values.min()).item() < 1e-10  # float64 round-off of products of 8 x 8 maps


def test_comrope_plugin_matches_exp_of_generators_in_attention():
    coords = grid_positions(3, 3)
    enc = lg.ComRoPE(8, 2, block_size=4, coordinates=coords, generator=_gen(5))
    q, k, v = (torch.randn(2, 2, 9, 8, generator=_gen(6 + i)) for i in range(3))
    out = posenc.attention(q, k, v, encoding=enc)
    maps = multi_parameter_group(enc.generator_matrices().detach(), coords)  # (9, 8, 8), orthogonal
    qe, ke = torch.einsum("lij,bhlj->bhli", maps, q), torch.einsum("lij,bhlj->bhli", maps, k)
    expected = torch.softmax(qe @ ke.transpose(-1, -2) / math.sqrt(8), -1) @ v
    assert torch.allclose(out, expected, atol=1e-5)  # float32 round-off of two 8 x 8 products and a softmax


def test_cayley_string_is_p_transpose_rope_p():
    coords = grid_positions(3, 3)
    enc = lg.CayleySTRING(8, 2, coordinates=coords, scale=0.5, generator=_gen(7)).double()
    p = enc.orthogonal.detach()
    x = torch.randn(9, 8, generator=_gen(8), dtype=torch.float64)
    rope = enc.rope_part().double()
    expected = (p.T @ rope.rotate((p @ x.T).T, torch.arange(9)).T).T
    assert torch.allclose(enc.rotate(x, torch.arange(9)), expected, atol=1e-12)
    # and exp(sum_a p_a P^T G_a P) is the same map (the Lie view)
    maps = multi_parameter_group(enc.generator_matrices(), coords.double())
    assert torch.allclose(torch.einsum("lij,lj->li", maps, x), expected, atol=1e-10)
    check_commuting(enc.generator_matrices())


def test_cayley_string_folds_into_the_projections():
    """P folded into W_q and W_k, then plain N-D RoPE: the same logits (and outputs) as Cayley-STRING."""
    torch.manual_seed(0)
    n_heads, head_dim, d_model = 2, 8, 12
    coords = grid_positions(3, 4)
    enc = lg.CayleySTRING(head_dim, 2, coordinates=coords, scale=0.5, generator=_gen(9)).double()
    x = torch.randn(2, 12, d_model, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(n_heads * head_dim, d_model, dtype=torch.float64) for _ in range(3))
    out, weights = posenc.self_attention(x, w_q, w_k, w_v, n_heads, encoding=enc, return_weights=True)
    p = enc.orthogonal.detach()
    folded = [lg.fold_into_projection(w, p, n_heads) for w in (w_q, w_k)]
    out2, weights2 = posenc.self_attention(
        x, *folded, w_v, n_heads, encoding=enc.rope_part().double(), return_weights=True
    )
    assert torch.allclose(weights, weights2, atol=1e-12)
    assert torch.allclose(out, out2, atol=1e-12)
    with pytest.raises(ValueError, match="weight"):
        lg.fold_into_projection(w_q[:5], p, n_heads)


def test_lieRE_is_relative_in_1d_but_not_in_2d():
    q, k = (
        torch.randn(6, generator=_gen(10), dtype=torch.float64),
        torch.randn(6, generator=_gen(11), dtype=torch.float64),
    )
    one = lg.LieRE(6, 1, scale=0.3, generator=_gen(12)).double()
    starts = torch.arange(10, dtype=torch.float64)[:, None]
    assert lg.relative_spread(one.generator_matrices().detach(), q, k, [3.0], starts).item() < 1e-10
    two = lg.LieRE(6, 2, scale=0.3, generator=_gen(12)).double()
    starts2 = grid_positions(4, 4).double()
    assert lg.max_commutator_norm(two.generator_matrices()).item() > 0.1
    assert lg.relative_spread(two.generator_matrices().detach(), q, k, [1.0, 2.0], starts2).item() > 1e-2
    # the plug-in applies exp(sum p_i X_i) to queries and keys
    pos = starts2[:5]
    qs, ks = torch.randn(1, 1, 5, 6, dtype=torch.float64), torch.randn(1, 1, 5, 6, dtype=torch.float64)
    qe, ke = two.encode_qk(qs, ks, pos, pos)
    maps = multi_parameter_group(two.generator_matrices().detach(), pos, check=False)
    assert torch.allclose(qe[0, 0], torch.einsum("lij,lj->li", maps, qs[0, 0]), atol=1e-12)
    assert torch.allclose(ke[0, 0], torch.einsum("lij,lj->li", maps, ks[0, 0]), atol=1e-12)


def test_relative_spread_grows_with_the_commutator_and_vanishes_when_commuting():
    """X_0 = G_0, X_1 = G_1 + s Y with commuting RoPE generators G and a random skew Y: ||[X_0, X_1]|| = s ||[G_0,
    Y]||."""
    frequencies = torch.tensor([[1.0, 0.3], [0.2, 0.7], [0.5, 0.5]], dtype=torch.float64)
    g = posenc.generators.rope_generators(frequencies)  # (2, 6, 6), commuting
    y = lg.skew(torch.randn(6, 6, generator=_gen(13), dtype=torch.float64))
    starts = grid_positions(5, 5).double()
    pairs = [
        (
            torch.randn(6, generator=_gen(20 + i), dtype=torch.float64),
            torch.randn(6, generator=_gen(40 + i), dtype=torch.float64),
        )
        for i in range(4)
    ]
    norms, spreads = [], []
    for s in (0.0, 0.02, 0.05, 0.1, 0.2):
        gens = torch.stack([g[0], g[1] + s * y])
        norms.append(lg.max_commutator_norm(gens).item())
        spreads.append(sum(lg.relative_spread(gens, q, k, [1.0, -2.0], starts).item() for q, k in pairs) / len(pairs))
    assert norms[0] == 0.0 and spreads[0] < 1e-10  # commuting: relative up to float64 round-off
    assert all(a < b for a, b in zip(norms, norms[1:]))
    assert all(a < b for a, b in zip(spreads, spreads[1:]))


def test_logits_at_offset_matches_the_definition():
    gens = lg.skew(torch.randn(2, 4, 4, generator=_gen(14), dtype=torch.float64))
    q, k = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    starts = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    offset = torch.tensor([2.0, 1.0], dtype=torch.float64)
    got = lg.logits_at_offset(gens, q, k, offset, starts)
    for s, n in enumerate(starts):
        r_m = torch.linalg.matrix_exp((n + offset)[0] * gens[0] + (n + offset)[1] * gens[1])
        r_n = torch.linalg.matrix_exp(n[0] * gens[0] + n[1] * gens[1])
        assert got[s].item() == pytest.approx(((r_m @ q) @ (r_n @ k)).item(), abs=1e-12)
    with pytest.raises(ValueError, match="offset"):
        lg.logits_at_offset(gens, q, k, [1.0], starts)
    with pytest.raises(ValueError, match="q"):
        lg.logits_at_offset(gens, q[:3], k, offset, starts)


def test_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        lg.ComRoPE(10, 2, block_size=4)
    with pytest.raises(ValueError, match="variant"):
        lg.ComRoPE(8, 2, variant="xx")
    with pytest.raises(TypeError, match="head_dim"):
        lg.LieRE(8.0, 2)
    enc = lg.LieRE(4, 2, coordinates=grid_positions(2, 2))
    with pytest.raises(ValueError, match="index coordinates"):
        enc.encode_qk(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.tensor([0, 7]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="coefficients"):
        lg.block_diagonal_generators(torch.zeros(2, 2, 2), torch.zeros(3, 3))


def test_learned_generators_train():
    """The parameters get gradients through attention (they are learnable)."""
    coords = grid_positions(2, 3)
    for enc in (
        lg.ComRoPE(8, 2, coordinates=coords, variant="ld"),
        lg.LieRE(8, 2, coordinates=coords),
        lg.CayleySTRING(8, 2, coordinates=coords),
    ):
        q, k, v = (torch.randn(1, 1, 6, 8) for _ in range(3))
        posenc.attention(q, k, v, encoding=enc).square().sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())


def _all_pairs(size=3):
    points = grid_positions(size, size).double()
    qi, ki = torch.meshgrid(torch.arange(len(points)), torch.arange(len(points)), indexing="ij")
    return points[qi.flatten()], points[ki.flatten()]


def test_relative_floor_is_the_within_offset_variance():
    qp, kp = _all_pairs()
    target = torch.randn(len(qp), generator=_gen(30), dtype=torch.float64)
    groups = {}
    for i, offset in enumerate((kp - qp).tolist()):
        groups.setdefault(tuple(offset), []).append(target[i].item())
    slow = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in groups.values()) / len(target)
    assert lg.relative_floor(qp, kp, target) == pytest.approx(slow, rel=1e-12)
    relative = torch.cos((kp - qp) @ torch.tensor([0.7, -0.4], dtype=torch.float64))
    assert lg.relative_floor(qp, kp, relative) < 1e-28  # one value per offset: no variance left
    with pytest.raises(ValueError, match="target"):
        lg.relative_floor(qp, kp, target[:-1])


def test_lieRE_represents_a_score_map_no_relative_encoding_can_fit():
    """A LieRE score map (non-commuting generators) is matched exactly by LieRE with those generators, while every
    relative encoding stays above the within-offset variance; trained commuting encodings never go below it."""
    qp, kp = _all_pairs()
    lie = lg.LieRE(4, 2, scale=0.4, generator=_gen(31)).double()
    c = torch.randn(4, generator=_gen(32), dtype=torch.float64)
    vectors = c.expand(len(qp), -1)[None, None]
    q, k = lie.encode_qk(vectors, vectors, qp, kp)
    target = ((q * k).sum(-1)[0, 0] / c.square().sum()).detach()
    floor = lg.relative_floor(qp, kp, target)
    assert floor > 1e-3
    for enc in (
        lg.ComRoPE(4, 2, block_size=2, generator=_gen(33)),
        lg.CayleySTRING(4, 2, scale=0.3, generator=_gen(33)),
    ):
        loss, score = lg.fit_scores(enc.double(), qp, kp, target, steps=8, lr=0.1)
        assert loss >= floor * (1 - 1e-9)  # a relative score is one number per offset: exact bound
        assert score.shape == target.shape


def test_fit_scores_trains_towards_a_relative_target():
    qp, kp = _all_pairs()
    target = 0.8 * torch.cos((kp - qp) @ torch.tensor([0.7, -0.4], dtype=torch.float64))
    enc = lg.ComRoPE(4, 2, block_size=2, variant="ld", generator=_gen(34)).double()
    before, _ = lg.fit_scores(enc, qp, kp, target, steps=1, lr=0.0)
    after, _ = lg.fit_scores(enc, qp, kp, target, steps=20, lr=0.1)
    assert after < 0.5 * before
    with pytest.raises(TypeError, match="encoding"):
        lg.fit_scores(torch.nn.Linear(2, 2), qp, kp, target)


def test_comrope_ld_has_a_multiplier_per_axis_and_block():
    """As the authors' ComRoPELDAttention: multipliers (n_axes, blocks) drawn N(0, 1), so blocks turn with different
    combinations of the coordinates (one shared theta would make every block a function of theta . p)."""
    enc = lg.ComRoPE(16, n_axes=2, block_size=4, variant="ld", generator=_gen(40))
    assert isinstance(enc.coefficients, torch.nn.Parameter) and enc.coefficients.shape == (2, 4)
    a = enc.coefficients.detach()
    directions = torch.nn.functional.normalize(a.T, dim=1)  # (blocks, 2): each block's direction in the plane
    assert (directions @ directions.T).abs().min() < 0.99  # not all parallel
    draws = torch.cat(
        [lg.ComRoPE(16, 2, 4, "ld", generator=_gen(s)).coefficients.detach().flatten() for s in range(200)]
    )  # 1600 standard normal draws: mean 0 +- 0.025, std 1 +- 0.018
    assert abs(draws.mean().item()) < 0.1 and abs(draws.std().item() - 1) < 0.1
    enc.generator_matrices().square().sum().backward()
    assert enc.coefficients.grad.shape == (2, 4) and (enc.coefficients.grad != 0).all()
