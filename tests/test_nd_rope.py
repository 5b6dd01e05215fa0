"""N-D RoPE: axial and mixed frequencies, equality with 1-D RoPE and with the Lie form, the relative property."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import nd_rope
from posenc.rope_analysis import max_offset_spread

HEAD_DIM = 32
shifts = st.lists(st.integers(min_value=-500, max_value=500), min_size=2, max_size=2)


def scores(frequencies, q, k, positions, layout="half"):
    """Score of the content pair (q, k) for every query position against every key position: (L, L)."""
    n = len(positions)
    q_rot = nd_rope.rotate_nd(q.expand(n, -1), positions, frequencies, layout)
    k_rot = nd_rope.rotate_nd(k.expand(n, -1), positions, frequencies, layout)
    return q_rot @ k_rot.T


def test_grid_positions_are_row_major_row_column():
    grid = nd_rope.grid_positions(3, 4)
    assert grid.shape == (12, 2) and grid.dtype == torch.int64
    assert grid[5].tolist() == [1, 1] and grid[4].tolist() == [1, 0] and grid[-1].tolist() == [2, 3]
    assert nd_rope.grid_positions(2, 3, 4).shape == (24, 3)


def test_axial_frequencies_give_each_axis_the_one_dimensional_table():
    frequencies = nd_rope.axial_frequencies(HEAD_DIM, n_axes=2, base=100.0)
    per_axis, _ = posenc.rope_frequencies(HEAD_DIM // 2, {"rope_theta": 100.0})
    assert frequencies.shape == (HEAD_DIM // 2, 2)
    assert torch.equal(frequencies[:8, 0], per_axis) and torch.equal(frequencies[8:, 1], per_axis)
    assert torch.equal(frequencies[:8, 1], torch.zeros(8)) and torch.equal(frequencies[8:, 0], torch.zeros(8))


@pytest.mark.parametrize("head_dim, n_axes", [(32, 2), (24, 3)])
def test_mixed_frequencies_turn_axial_ones_by_an_orthogonal_matrix(head_dim, n_axes):
    mixed = nd_rope.mixed_frequencies(head_dim, n_axes, generator=torch.Generator().manual_seed(3))
    axial = nd_rope.axial_frequencies(head_dim, n_axes)
    assert torch.allclose(mixed.norm(dim=-1), axial.norm(dim=-1), atol=1e-6)  # same magnitudes
    first_of_each_group = mixed[:: head_dim // 2 // n_axes]
    directions = first_of_each_group / first_of_each_group.norm(dim=-1, keepdim=True)
    assert torch.allclose(directions @ directions.T, torch.eye(n_axes), atol=1e-6)
    assert not torch.allclose(mixed, axial, atol=1e-3)  # a random direction, not the axes
    again = nd_rope.mixed_frequencies(head_dim, n_axes, generator=torch.Generator().manual_seed(3))
    assert torch.equal(mixed, again)
    assert torch.equal(nd_rope.directed_frequencies(head_dim, torch.eye(n_axes)), axial)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@settings(max_examples=25, deadline=None)
@given(start=st.integers(min_value=-10_000, max_value=10_000))
def test_one_axis_is_ordinary_rope(layout, start):
    x = torch.randn(2, 3, 9, HEAD_DIM)
    positions = torch.arange(9) + start
    inv_freq, _ = posenc.rope_frequencies(HEAD_DIM)
    expected = posenc.rotate(x, positions, inv_freq, layout=layout)
    assert torch.equal(nd_rope.rotate_nd(x, positions[:, None], inv_freq[:, None], layout), expected)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_rotation_equals_the_exponential_of_commuting_generators(layout, variant):
    frequencies = (nd_rope.axial_frequencies(HEAD_DIM) if variant == "axial"
                   else nd_rope.mixed_frequencies(HEAD_DIM, generator=torch.Generator().manual_seed(0)))
    generators = nd_rope.rope_generators(frequencies, layout)
    assert torch.allclose(generators, -generators.transpose(-1, -2))  # skew-symmetric
    assert torch.allclose(generators[0] @ generators[1], generators[1] @ generators[0])  # they commute
    positions = torch.randn(15, 2, dtype=torch.float64) * 20
    matrices = nd_rope.lie_rotation_matrices(positions, generators)
    assert torch.allclose(matrices, nd_rope.lie_rotation_matrices(positions, generators, sequential=True), atol=1e-12)
    x = torch.randn(15, HEAD_DIM, dtype=torch.float64)
    expected = torch.einsum("lij,lj->li", matrices, x)
    assert torch.allclose(nd_rope.rotate_nd(x, positions, frequencies, layout), expected, atol=1e-5)


def test_partial_rotary_generators_leave_the_tail_alone():
    frequencies = nd_rope.axial_frequencies(16)
    generators = nd_rope.rope_generators(frequencies, head_dim=24)
    x = torch.randn(5, 24, dtype=torch.float64)
    positions = torch.randint(0, 9, (5, 2))
    matrices = nd_rope.lie_rotation_matrices(positions, generators)
    assert torch.allclose(torch.einsum("lij,lj->li", matrices, x), nd_rope.rotate_nd(x, positions, frequencies),
                          atol=1e-5)
    assert torch.equal(nd_rope.rotate_nd(x, positions, frequencies)[:, 16:], x[:, 16:])


@pytest.mark.parametrize("variant", ["axial", "mixed"])
@settings(max_examples=10, deadline=None)
@given(shift=shifts)
def test_scores_are_relative(variant, shift):
    frequencies = (nd_rope.axial_frequencies(HEAD_DIM) if variant == "axial"
                   else nd_rope.mixed_frequencies(HEAD_DIM, generator=torch.Generator().manual_seed(1)))
    frequencies = frequencies.double()  # float64 angles: equal up to round-off, also far from the origin
    q, k = torch.randn(HEAD_DIM, dtype=torch.float64), torch.randn(HEAD_DIM, dtype=torch.float64)
    positions = nd_rope.grid_positions(5, 5)
    moved = positions + torch.tensor(shift)
    assert torch.allclose(scores(frequencies, q, k, positions), scores(frequencies, q, k, moved), atol=1e-9)
    assert max_offset_spread(scores(frequencies, q, k, positions), positions, positions) < 1e-9


def test_three_axes_are_relative_too():
    frequencies = nd_rope.mixed_frequencies(24, n_axes=3, generator=torch.Generator().manual_seed(2))
    positions = nd_rope.grid_positions(3, 4, 3)
    q, k = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    assert max_offset_spread(scores(frequencies, q, k, positions), positions, positions) < 1e-4


def test_overlapping_planes_do_not_commute_and_are_not_relative():
    speeds = posenc.rope_frequencies(HEAD_DIM, {"rope_theta": 100.0})[0].double()
    planes_x = nd_rope.pair_planes(HEAD_DIM, "interleaved")
    planes_y = (planes_x + 1) % HEAD_DIM  # (1, 2), (3, 4), ...: each shares a feature with two x planes
    generators = torch.stack((nd_rope.plane_generator(HEAD_DIM, planes_x, speeds),
                              nd_rope.plane_generator(HEAD_DIM, planes_y, speeds)))
    assert (generators[0] @ generators[1] - generators[1] @ generators[0]).abs().max() > 0.1
    positions = nd_rope.grid_positions(5, 5)
    q, k = torch.randn(HEAD_DIM, dtype=torch.float64), torch.randn(HEAD_DIM, dtype=torch.float64)
    for sequential in (False, True):
        matrices = nd_rope.lie_rotation_matrices(positions, generators, sequential=sequential)
        broken = (matrices @ q) @ (matrices @ k).T
        assert max_offset_spread(broken, positions, positions) > 0.5


def test_axial_scores_separate_into_a_sum_mixed_do_not():
    # axial: score(dy, dx) = f(dy) + g(dx), so the double-centred table is zero; a mixed pair couples dy and dx
    q = torch.randn(HEAD_DIM, dtype=torch.float64)
    offsets = nd_rope.grid_positions(9, 9) - 4
    origin = torch.zeros(1, 2, dtype=torch.long)

    def centred(frequencies):
        table = (nd_rope.rotate_nd(q[None], origin, frequencies) @
                 nd_rope.rotate_nd(q.expand(81, -1), offsets, frequencies).T).reshape(9, 9)
        return table - table.mean(0) - table.mean(1, keepdim=True) + table.mean()

    assert centred(nd_rope.axial_frequencies(HEAD_DIM)).abs().max() < 1e-4
    assert centred(nd_rope.mixed_frequencies(HEAD_DIM, generator=torch.Generator().manual_seed(0))).abs().max() > 0.1


def test_norm_is_preserved_and_bf16_is_rotated_in_float32():
    frequencies = nd_rope.mixed_frequencies(HEAD_DIM, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 30, HEAD_DIM)
    positions = torch.rand(30, 2) * 1000
    rotated = nd_rope.rotate_nd(x, positions, frequencies)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    low = nd_rope.rotate_nd(x.bfloat16(), positions, frequencies)
    assert low.dtype == torch.bfloat16
    assert (low.float() - rotated).abs().max() < 0.05


def test_module_in_attention_uses_pixel_coordinates():
    grid = nd_rope.grid_positions(4, 4)
    encoding = nd_rope.NDRoPE(HEAD_DIM, variant="axial", coordinates=grid)
    q, k, v = (torch.randn(1, 2, 16, HEAD_DIM) for _ in range(3))
    out, weights = posenc.attention(q, k, v, encoding=encoding, return_weights=True)
    frequencies = nd_rope.axial_frequencies(HEAD_DIM)
    logits = nd_rope.rotate_nd(q, grid, frequencies) @ nd_rope.rotate_nd(k, grid, frequencies).transpose(-1, -2)
    assert torch.allclose(weights, torch.softmax(logits / HEAD_DIM**0.5, dim=-1), atol=1e-6)
    # the same image moved by (3, 7): identical attention
    shifted = nd_rope.NDRoPE(HEAD_DIM, variant="axial", coordinates=grid + torch.tensor([3, 7]))
    assert torch.allclose(posenc.attention(q, k, v, encoding=shifted), out, atol=1e-5)
    # coordinates given directly, without a table
    direct = nd_rope.NDRoPE(HEAD_DIM, variant="axial")
    q_rot, _ = direct.encode_qk(q, k, grid, grid)
    assert torch.equal(q_rot, nd_rope.rotate_nd(q, grid, frequencies))


def test_mixed_module_learns_its_frequencies():
    encoding = nd_rope.NDRoPE(HEAD_DIM, variant="mixed", coordinates=nd_rope.grid_positions(3, 3),
                              generator=torch.Generator().manual_seed(0))
    assert encoding.learnable and not nd_rope.NDRoPE(HEAD_DIM).learnable
    assert [name for name, _ in encoding.named_parameters()] == ["weights"]
    q, k, v = (torch.randn(1, 1, 9, HEAD_DIM) for _ in range(3))
    posenc.attention(q, k, v, encoding=encoding).square().sum().backward()
    assert encoding.weights.grad is not None and bool((encoding.weights.grad != 0).all())


def test_learnable_axial_stays_axial():
    encoding = nd_rope.NDRoPE(HEAD_DIM, variant="axial", learnable=True, coordinates=nd_rope.grid_positions(3, 3))
    optimizer = torch.optim.SGD(encoding.parameters(), lr=0.1)
    q, k, v = (torch.randn(1, 1, 9, HEAD_DIM) for _ in range(3))
    for _ in range(3):
        optimizer.zero_grad()
        posenc.attention(q, k, v, encoding=encoding).square().sum().backward()
        optimizer.step()
    axial = nd_rope.axial_frequencies(HEAD_DIM)
    assert torch.equal(encoding.frequencies == 0, axial == 0)  # still one axis per pair
    assert not torch.equal(encoding.frequencies, axial)  # but the speeds moved


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="head_dim"):
        nd_rope.axial_frequencies(30, n_axes=2)
    with pytest.raises(ValueError, match="positions"):
        nd_rope.rotate_nd(torch.randn(5, HEAD_DIM), torch.arange(5), nd_rope.axial_frequencies(HEAD_DIM))
    with pytest.raises(TypeError, match="positions"):
        nd_rope.nd_rope_angles(torch.ones(5, 2, dtype=torch.bool), nd_rope.axial_frequencies(HEAD_DIM))
    with pytest.raises(ValueError, match="variant"):
        nd_rope.NDRoPE(HEAD_DIM, variant="diagonal")
    with pytest.raises(ValueError, match="positions"):
        nd_rope.NDRoPE(HEAD_DIM, coordinates=nd_rope.grid_positions(2, 2)).coordinates_of(torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="planes"):
        nd_rope.plane_generator(4, torch.tensor([[0, 0]]), torch.ones(1))
    with pytest.raises(ValueError, match="sizes"):
        nd_rope.grid_positions()
