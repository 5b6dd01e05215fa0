"""posenc.lab.geometry: positional distributions, Hellinger distances, classical MDS, stress, ranks."""

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.lab import geometry

SEEDS = st.integers(0, 2**31 - 1)


def random_distributions(n, vocab, seed, sparsity=0.5):
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(n, vocab, generator=generator, dtype=torch.float64)
    weights[torch.rand(n, vocab, generator=generator) < sparsity] = 0
    weights[:, 0] += 1e-3  # no empty row
    return weights / weights.sum(dim=1, keepdim=True)


def random_corpus(seed, n_sequences=30, vocab=7, max_length=9):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_length + 1, (n_sequences,), generator=generator)
    lengths[0] = max_length
    return [torch.randint(0, vocab, (int(length),), generator=generator) for length in lengths]


# positional distributions -------------------------------------------------------------------------------------
def test_counts_of_a_tiny_corpus_by_hand():
    sequences = [torch.tensor([2, 0, 1]), torch.tensor([2, 1]), torch.tensor([0])]
    counts = geometry.position_token_counts(sequences, vocab_size=3)
    expected = torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    # exact by construction here and below: counts are small integers (exact in float64), and the distributions
    # are the same IEEE division of the same numbers
    assert counts.dtype == torch.float64 and torch.equal(counts, expected)
    distributions = geometry.positional_distributions(sequences, vocab_size=3)
    assert torch.equal(distributions, expected / expected.sum(dim=1, keepdim=True))


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_distributions_match_a_python_loop_and_both_input_forms(seed):
    sequences, vocab = random_corpus(seed), 7
    n = max(len(s) for s in sequences)
    counts = torch.zeros(n, vocab, dtype=torch.float64)
    for sequence in sequences:
        for position, token in enumerate(sequence.tolist()):
            counts[position, token] += 1
    from_list = geometry.positional_distributions(sequences, vocab)
    assert torch.allclose(from_list, counts / counts.sum(dim=1, keepdim=True), atol=0, rtol=1e-15)
    padded = torch.full((len(sequences), n), -5)  # padding holds garbage: it must be ignored
    for row, sequence in enumerate(sequences):
        padded[row, : len(sequence)] = sequence
    lengths = torch.tensor([len(s) for s in sequences])
    # exact: integer counts do not depend on the order of accumulation, then the same division
    assert torch.equal(geometry.positional_distributions(padded, vocab, lengths=lengths), from_list)
    assert torch.allclose(from_list.sum(dim=1), torch.ones(n, dtype=torch.float64))


def test_n_positions_truncates_sequences():
    sequences = random_corpus(3)
    full = geometry.position_token_counts(sequences, 7)
    assert torch.equal(geometry.position_token_counts(sequences, 7, n_positions=4), full[:4])
    assert torch.equal(geometry.position_token_counts(torch.stack([s[:1] for s in sequences]), 7), full[:1])


# Hellinger distances ------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(2, 12), st.integers(1, 40))
def test_hellinger_properties_and_chord_identity(seed, n, vocab):
    distributions = random_distributions(n, vocab, seed)
    distances = geometry.hellinger_distances(distributions)
    assert distances.shape == (n, n) and distances.dtype == torch.float64
    # exact by construction: the diagonal is set to 0, and both triangles are written from the same numbers
    assert torch.equal(distances.diagonal(), torch.zeros(n, dtype=torch.float64))
    assert torch.equal(distances, distances.T)
    assert float(distances.min()) >= 0 and float(distances.max()) <= 1
    roots = distributions.sqrt()
    chord = torch.cdist(roots, roots)
    assert torch.allclose(chord, math.sqrt(2) * distances, atol=1e-7)
    direct = (1 - (roots[:, None, :] * roots[None, :, :]).sum(-1)).clamp_min(0).sqrt()
    assert torch.allclose(distances, direct.fill_diagonal_(0), atol=1e-7)


def test_hellinger_extremes():
    distributions = torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 0.3, 0.7], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    distances = geometry.hellinger_distances(distributions)
    # disjoint supports: H^2 = (s_0 + s_1) / 2 with s the row sums, exact up to the rounding of 0.3 + 0.7
    assert abs(float(distances[0, 1]) - 1) <= 2**-52 and abs(float(distances[1, 2]) - 1) <= 2**-52
    # identical rows: exactly 0 by construction (every term p_w - q_w is 0), whatever the BLAS path
    assert distances[0, 2] == 0 and distances[2, 0] == 0


def mp_hellinger(p, q):
    """The Hellinger distance of the float64 inputs, ||sqrt p - sqrt q|| / sqrt 2, in 60-digit arithmetic."""
    with mpmath.workdps(60):
        total = mpmath.fsum(
            (mpmath.sqrt(mpmath.mpf(a)) - mpmath.sqrt(mpmath.mpf(b))) ** 2 for a, b in zip(p.tolist(), q.tolist())
        )
        return mpmath.sqrt(total / 2)


@settings(max_examples=20, deadline=None)
@given(SEEDS, st.sampled_from([1e-2, 1e-5, 1e-8, 1e-11, 1e-14]))
def test_hellinger_of_near_identical_rows_is_accurate_to_a_few_ulps(seed, size):
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(60, generator=generator, dtype=torch.float64) + 0.01
    p /= p.sum()
    q = p * (1 + size * torch.randn(60, generator=generator, dtype=torch.float64))
    q /= q.sum()
    distances = geometry.hellinger_distances(torch.stack([p, q, p]))
    assert distances[0, 2] == 0  # identical rows: exactly 0 by construction
    reference = mp_hellinger(p, q)
    if reference == 0:
        assert distances[0, 1] == 0
        return
    # each term (p - q) / (sqrt p + sqrt q) squared carries ~6 ulps, the sum of 60 positive terms adds at most
    # ~6 more (pairwise), halving and the root halve the relative error: 16 ulps is a safe bound
    relative = abs(mpmath.mpf(float(distances[0, 1])) - reference) / reference
    assert relative <= 16 * 2**-53, float(relative)


@settings(max_examples=15, deadline=None)
@given(SEEDS, st.integers(2, 8))
def test_hellinger_of_distant_rows_matches_the_reference(seed, n):
    distributions = random_distributions(n, 50, seed, sparsity=0.3)
    distances = geometry.hellinger_distances(distributions)
    for i in range(n):
        for j in range(i + 1, n):
            reference = mp_hellinger(distributions[i], distributions[j])
            # pairs with H^2 >= 1/16 come from the Gram matrix: its absolute error is at most ~V ulps of the
            # overlap (a sum of V = 50 non-negative products, each rounded twice), i.e. relative error of H at most
            # 8 * 2 * 50 ulps; recomputed pairs are far better
            assert abs(mpmath.mpf(float(distances[i, j])) - reference) <= 800 * 2**-53 * reference


def test_hellinger_recomputes_close_pairs_in_a_large_table():
    generator = torch.Generator().manual_seed(0)
    base = torch.rand(1, 5000, generator=generator, dtype=torch.float64)
    table = base * (1 + 1e-9 * torch.randn(6, 5000, generator=generator, dtype=torch.float64))
    table = torch.cat([table, torch.rand(2, 5000, generator=generator, dtype=torch.float64)])
    table /= table.sum(dim=1, keepdim=True)
    distances = geometry.hellinger_distances(table)
    for i, j in [(0, 1), (2, 5), (1, 4)]:
        reference = mp_hellinger(table[i], table[j])
        # close pairs (H ~ 1e-9): 1 - overlap would be wrong by ~1e-7 relative or more; the term-by-term form is
        # within the 16 ulps derived in the test above
        assert abs(mpmath.mpf(float(distances[i, j])) - reference) <= 16 * 2**-53 * reference, (i, j)
    assert 1e-11 < float(distances[0, 1]) < 1e-8
    for i, j in [(0, 7), (6, 7)]:  # distant pairs from the Gram matrix: relative error <= 8 * 2 * V ulps (V = 5000)
        reference = mp_hellinger(table[i], table[j])
        assert abs(mpmath.mpf(float(distances[i, j])) - reference) <= 8 * 2 * 5000 * 2**-53 * reference, (i, j)


@settings(max_examples=15, deadline=None)
@given(SEEDS, st.integers(3, 25))
def test_hellinger_gram_is_positive_semidefinite(seed, n):
    distances = geometry.hellinger_distances(random_distributions(n, 30, seed))
    eigenvalues = torch.linalg.eigvalsh(geometry.double_centered_gram(distances))
    assert float(eigenvalues.min()) >= -1e-12 * float(eigenvalues.max())
    assert geometry.effective_rank(eigenvalues) <= n - 1


# classical MDS ------------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(3, 20), st.integers(1, 5))
def test_mds_recovers_a_euclidean_configuration(seed, n, dim):
    generator = torch.Generator().manual_seed(seed)
    points = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    moved = points @ rotation + torch.randn(dim, generator=generator, dtype=torch.float64)
    distances = geometry.pairwise_distances(points)
    result = geometry.classical_mds(distances)
    assert result.embedding.shape == (n, min(dim, n - 1))
    assert torch.allclose(geometry.pairwise_distances(result.embedding), distances, atol=1e-9)
    assert torch.allclose(geometry.pairwise_distances(moved), distances, atol=1e-9)  # rigid motion: same D
    assert torch.allclose(
        geometry.classical_mds(geometry.pairwise_distances(moved)).embedding.abs(), result.embedding.abs(), atol=1e-6
    )
    assert float(geometry.stress(result.embedding, distances)) < 1e-9
    assert torch.allclose(
        result.embedding.mean(dim=0), torch.zeros(result.embedding.shape[1], dtype=torch.float64), atol=1e-9
    )  # MDS coordinates are centred


def test_mds_of_a_line_is_the_line():
    positions = torch.arange(10, dtype=torch.float64)
    distances = (positions[:, None] - positions[None, :]).abs()
    result = geometry.classical_mds(distances)
    assert result.embedding.shape == (10, 1)
    assert torch.allclose(result.embedding[:, 0].abs(), (positions - positions.mean()).abs(), atol=1e-9)


def test_mds_eigenvalues_are_descending_and_truncation_keeps_the_top_ones():
    distances = geometry.hellinger_distances(random_distributions(15, 20, 1))
    result = geometry.classical_mds(distances, dim=3)
    assert torch.all(result.eigenvalues[:-1] >= result.eigenvalues[1:])
    assert torch.allclose(result.embedding.square().sum(dim=0), result.eigenvalues[:3], rtol=1e-9)


# effective rank and the r (n + d) parametrisation --------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(SEEDS, st.integers(1, 6))
def test_effective_rank_of_a_low_rank_configuration(seed, rank):
    generator = torch.Generator().manual_seed(seed)
    n, d = 30, 16
    encoding = torch.randn(n, rank, generator=generator, dtype=torch.float64) @ torch.randn(
        rank, d, generator=generator, dtype=torch.float64
    )
    eigenvalues = geometry.classical_mds(geometry.pairwise_distances(encoding)).eigenvalues
    assert geometry.effective_rank(eigenvalues) == rank
    left, right = geometry.low_rank_factors(encoding, rank)
    assert left.shape == (n, rank) and right.shape == (rank, d)
    assert left.numel() + right.numel() == rank * (n + d) < n * d
    assert torch.allclose(left @ right, encoding, atol=1e-10)


def test_entropy_effective_rank():
    assert geometry.entropy_effective_rank(torch.tensor([2.0, 2.0, 2.0, 0.0, -1e-17])) == pytest.approx(3.0)
    assert geometry.entropy_effective_rank(torch.tensor([1.0, 0.0])) == pytest.approx(1.0)
    skewed = geometry.entropy_effective_rank(torch.tensor([10.0, 1.0, 1.0]))
    assert 1.0 < skewed < 3.0
    simplex = geometry.classical_mds(1.0 - torch.eye(6, dtype=torch.float64)).eigenvalues  # equidistant points
    assert geometry.entropy_effective_rank(simplex) == pytest.approx(5.0)


def test_low_rank_factors_are_the_best_approximation():
    matrix = torch.randn(12, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    singular = torch.linalg.svdvals(matrix)
    left, right = geometry.low_rank_factors(matrix, 4)
    error = torch.linalg.matrix_norm(matrix - left @ right)
    assert float(error) == pytest.approx(float(singular[4:].square().sum().sqrt()), rel=1e-10)


# stress -------------------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(SEEDS, st.floats(1e-3, 1e3))
def test_stress_is_scale_invariant_and_equals_the_cosine_form(seed, factor):
    generator = torch.Generator().manual_seed(seed)
    encoding = torch.randn(10, 4, generator=generator, dtype=torch.float64)
    target = geometry.hellinger_distances(random_distributions(10, 12, seed))
    value, scale = geometry.stress(encoding, target, return_scale=True)
    assert 0 <= float(value) <= 1
    assert torch.allclose(geometry.stress(factor * encoding, target), value, atol=1e-12)
    assert torch.allclose(geometry.stress(encoding, factor * target), value, atol=1e-12)
    upper = torch.ones(10, 10, dtype=torch.bool).triu(1)
    fitted, wanted = geometry.pairwise_distances(encoding)[upper], target[upper]
    cosine = fitted @ wanted / (fitted.norm() * wanted.norm())
    assert torch.allclose(value, (1 - cosine**2).sqrt(), atol=1e-7)
    for other in (0.5 * scale, 0.9 * scale, 1.1 * scale, 2 * scale):  # the fitted scale is the least-squares one
        assert float(((other * fitted - wanted).square().sum() / wanted.square().sum()).sqrt()) > float(value)


def test_stress_of_a_constant_encoding_is_one_and_of_the_target_itself_zero():
    target = geometry.hellinger_distances(random_distributions(8, 10, 5))
    # exact: all delta are 0, so c = 0 and the ratio is x / x = 1 in IEEE arithmetic
    assert float(geometry.stress(torch.ones(8, 3, dtype=torch.float64), target)) == 1.0
    assert float(geometry.stress_of_distances(target, target)) < 1e-12


def test_kernel_distances_of_a_gram_matrix_are_euclidean():
    encoding = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(
        geometry.kernel_distances(encoding @ encoding.T), geometry.pairwise_distances(encoding), atol=1e-7
    )
    skew = torch.randn(9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    # exact: the symmetric part (K + K^T) / 2 is the same sums in either order (addition commutes in IEEE)
    assert torch.allclose(geometry.kernel_distances(skew), geometry.kernel_distances(skew.T), atol=0, rtol=0)


def test_float32_input_is_computed_in_float64():
    distributions = random_distributions(6, 8, 0).float()
    assert geometry.hellinger_distances(distributions).dtype == torch.float64
    assert geometry.classical_mds(geometry.hellinger_distances(distributions)).embedding.dtype == torch.float64


# shift-invariant encodings ------------------------------------------------------------------------------------
def test_toeplitz_projection_fixes_toeplitz_matrices_and_bounds_shift_invariant_stress():
    positions = torch.arange(12, dtype=torch.float64)
    line = (positions[:, None] - positions[None, :]).abs()
    assert torch.allclose(geometry.toeplitz_projection(line.sqrt()), line.sqrt(), atol=1e-15)
    target = geometry.hellinger_distances(random_distributions(12, 15, 7))
    projection = geometry.toeplitz_projection(target)
    floor, scale = geometry.stress_of_distances(projection, target, return_scale=True)
    assert float(scale) == pytest.approx(1.0, rel=1e-12)  # a least-squares projection needs no rescaling
    assert float(floor) > 0.01
    for frequency in (0.05, 0.3, 1.0, 2.5):  # any shift-invariant encoding lies on or above the floor
        encoding = torch.stack((torch.cos(frequency * positions), torch.sin(frequency * positions)), dim=1)
        assert float(geometry.stress(encoding, target)) >= float(floor) - 1e-12
    offsets = (positions[:, None] - positions[None, :]).abs().long()
    for offset in range(12):
        on_diagonal = offsets == offset
        assert torch.allclose(projection[on_diagonal], target[on_diagonal].mean(), atol=1e-15)


# bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: geometry.positional_distributions([[1, 2]], 3), TypeError, "sequences[0]"),
        (lambda: geometry.positional_distributions([torch.tensor([1.0])], 3), TypeError, "sequences[0]"),
        (lambda: geometry.positional_distributions([], 3), ValueError, "sequences"),
        (lambda: geometry.positional_distributions(torch.zeros(2, 2, 2, dtype=torch.long), 3), ValueError, "sequences"),
        (lambda: geometry.positional_distributions([torch.tensor([3])], 3), ValueError, "vocab_size"),
        (lambda: geometry.positional_distributions([torch.tensor([1])], 0), ValueError, "vocab_size"),
        (lambda: geometry.positional_distributions([torch.tensor([1])], 3, n_positions=2), ValueError, "n_positions"),
        (
            lambda: geometry.positional_distributions([torch.tensor([1])], 3, lengths=torch.tensor([1])),
            ValueError,
            "lengths",
        ),
        (
            lambda: geometry.positional_distributions(
                torch.zeros(2, 3, dtype=torch.long), 3, lengths=torch.tensor([1])
            ),
            ValueError,
            "lengths",
        ),
        (
            lambda: geometry.positional_distributions(
                torch.zeros(2, 3, dtype=torch.long), 3, lengths=torch.tensor([1, 4])
            ),
            ValueError,
            "lengths",
        ),
        (lambda: geometry.hellinger_distances([[0.5, 0.5]]), TypeError, "distributions"),
        (lambda: geometry.hellinger_distances(torch.tensor([[1, 0], [0, 1]])), TypeError, "distributions"),
        (lambda: geometry.hellinger_distances(torch.tensor([[0.5, 0.6], [0.5, 0.5]])), ValueError, "distributions"),
        (lambda: geometry.hellinger_distances(torch.tensor([[1.5, -0.5], [0.5, 0.5]])), ValueError, "distributions"),
        (
            lambda: geometry.hellinger_distances(torch.tensor([[float("nan"), 1.0], [0.5, 0.5]])),
            ValueError,
            "distributions",
        ),
        (lambda: geometry.classical_mds(torch.ones(3, 4)), ValueError, "distances"),
        (lambda: geometry.classical_mds(torch.tensor([[0.0, 1.0], [2.0, 0.0]])), ValueError, "distances"),
        (lambda: geometry.classical_mds(-torch.ones(2, 2)), ValueError, "distances"),
        (lambda: geometry.classical_mds(1 - torch.eye(3), dim=4), ValueError, "dim"),
        (lambda: geometry.classical_mds(1 - torch.eye(3), dim=1.5), TypeError, "dim"),
        (lambda: geometry.stress(torch.ones(3), 1 - torch.eye(3)), ValueError, "encoding"),
        (lambda: geometry.stress(torch.randn(4, 2), 1 - torch.eye(3)), ValueError, "same shape"),
        (lambda: geometry.stress(torch.randn(3, 2), torch.zeros(3, 3)), ValueError, "distances"),
        (lambda: geometry.kernel_distances(torch.ones(2, 3)), ValueError, "kernel"),
        (lambda: geometry.effective_rank(torch.ones(2, 2)), ValueError, "eigenvalues"),
        (lambda: geometry.entropy_effective_rank(-torch.ones(3)), ValueError, "eigenvalues"),
        (lambda: geometry.low_rank_factors(torch.randn(4, 3), 4), ValueError, "rank"),
        (lambda: geometry.toeplitz_projection(torch.randn(3, 3)), ValueError, "distances"),
    ],
)
def test_bad_input_names_the_argument(call, error, name):
    with pytest.raises(error, match=name.replace("[", r"\[").replace("]", r"\]")):
        call()


# criteria beyond ratio stress -----------------------------------------------------------------------------------
def pair_vector(matrix):
    rows, cols = torch.triu_indices(len(matrix), len(matrix), 1)
    return matrix[rows, cols]


@settings(max_examples=25, deadline=None)
@given(SEEDS, st.floats(-3, 3), st.floats(1e-2, 1e2))
def test_affine_stress_is_the_least_squares_line_and_equals_the_correlation_form(seed, offset, factor):
    generator = torch.Generator().manual_seed(seed)
    delta = geometry.pairwise_distances(torch.randn(9, 3, generator=generator, dtype=torch.float64))
    target = geometry.hellinger_distances(random_distributions(9, 12, seed))
    value, (a, c) = geometry.affine_stress(delta, target, return_fit=True)
    r = geometry.distance_correlation(delta, target)
    x, y = pair_vector(delta), pair_vector(target)
    slope, intercept = torch.linalg.lstsq(torch.stack([x, torch.ones_like(x)], 1), y[:, None]).solution[:, 0]
    # sqrt(1 - r^2) cancels for r near 1: compare squares, whose error is a few ulps of 1
    assert abs(float(value) ** 2 - (1 - max(float(r), 0) ** 2)) < 1e-12
    if float(slope) > 0:
        assert torch.allclose(torch.stack([a, c]), torch.stack([intercept, slope]), rtol=1e-9, atol=1e-12)
    else:
        assert float(c) == 0 and float(value) == pytest.approx(1.0, abs=1e-12)
    # invariant under an increasing affine map of the encoding's distances (within round-off of the refit)
    shifted = (offset + 3.5) * (1 - torch.eye(9, dtype=torch.float64)) + factor * delta
    assert torch.allclose(geometry.affine_stress(shifted, target), value, atol=1e-9)
    assert torch.allclose(geometry.distance_correlation(shifted, target), r, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_partial_correlation_is_the_textbook_formula_for_one_control_and_recursive_for_two(seed):
    generator = torch.Generator().manual_seed(seed)
    delta, control, other = (
        geometry.pairwise_distances(torch.randn(9, 3, generator=generator, dtype=torch.float64)) for _ in range(3)
    )
    target = geometry.hellinger_distances(random_distributions(9, 12, seed))
    r = geometry.distance_correlation
    r_dt, r_dc, r_tc = r(delta, target), r(delta, control), r(target, control)
    textbook = (r_dt - r_dc * r_tc) / ((1 - r_dc**2) * (1 - r_tc**2)).sqrt()
    one = geometry.partial_correlation(delta, target, control)
    assert torch.allclose(one, textbook, atol=1e-12)
    # two controls: the first-order partials combine like plain correlations (the recursion for partial correlation)
    p_dt, p_do, p_to = (
        geometry.partial_correlation(x, y, control) for x, y in ((delta, target), (delta, other), (target, other))
    )
    recursive = (p_dt - p_do * p_to) / ((1 - p_do**2) * (1 - p_to**2)).sqrt()
    assert torch.allclose(
        geometry.partial_correlation(delta, target, torch.stack([control, other])), recursive, atol=1e-10
    )
    # an increasing affine map of any argument changes nothing
    offset = 2 * (1 - torch.eye(9, dtype=torch.float64))
    assert torch.allclose(
        geometry.partial_correlation(offset + 3 * delta, target, offset + 0.5 * control), one, atol=1e-12
    )


def test_partial_correlation_finds_what_the_control_does_not_explain():
    generator = torch.Generator().manual_seed(0)
    delta, control = (
        geometry.pairwise_distances(torch.randn(8, 2, generator=generator, dtype=torch.float64)) for _ in range(2)
    )
    # the target is the control plus the encoding: the raw r is diluted, the partial r is exactly 1
    target = control + 0.3 * delta
    assert float(geometry.distance_correlation(delta, target)) < 0.9
    assert float(geometry.partial_correlation(delta, target, control)) == pytest.approx(1.0, abs=1e-12)
    # a target the control explains exactly leaves nothing to correlate
    with pytest.raises(ValueError, match="control explains"):
        geometry.partial_correlation(delta, 1 + 2 * control, control)


def test_affine_stress_of_an_anticorrelated_encoding_is_one():
    target = geometry.pairwise_distances(torch.arange(6, dtype=torch.float64)[:, None])
    reversed_distances = (10 - target).fill_diagonal_(0)
    assert float(geometry.distance_correlation(reversed_distances, target)) == pytest.approx(-1, abs=1e-12)
    assert float(geometry.affine_stress(reversed_distances, target)) == pytest.approx(1, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=60), SEEDS)
def test_isotonic_regression_matches_sklearn(values, seed):
    from sklearn.isotonic import IsotonicRegression

    values = torch.tensor(values, dtype=torch.float64)
    weights = torch.rand(len(values), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    for w in (None, weights):
        fit = geometry.isotonic_regression(values, w)
        assert bool((fit[1:] >= fit[:-1]).all())
        expected = IsotonicRegression().fit_transform(
            torch.arange(len(values)).numpy(), values.numpy(), sample_weight=None if w is None else w.numpy()
        )
        # block means of at most 60 values of size <= 100: a few ulps of 100 per value
        assert torch.allclose(fit, torch.from_numpy(expected), rtol=0, atol=1e-11)


def test_isotonic_regression_by_hand():
    fit = geometry.isotonic_regression(torch.tensor([1.0, 3.0, 2.0, 4.0, 0.0, 5.0]))
    assert torch.allclose(fit, torch.tensor([1, 2.25, 2.25, 2.25, 2.25, 5], dtype=torch.float64), atol=1e-15)
    increasing = torch.tensor([0.5, 1.0, 7.0])
    assert torch.equal(geometry.isotonic_regression(increasing), increasing.double())  # already monotone: untouched


@settings(max_examples=20, deadline=None)
@given(SEEDS)
def test_nonmetric_stress_depends_only_on_the_order_of_the_target(seed):
    generator = torch.Generator().manual_seed(seed)
    delta = geometry.pairwise_distances(torch.randn(10, 2, generator=generator, dtype=torch.float64))
    target = geometry.hellinger_distances(random_distributions(10, 15, seed))
    for formula in (1, 2):
        value, disparities = geometry.nonmetric_stress(delta, target, formula, return_disparities=True)
        order = torch.argsort(pair_vector(target))
        assert bool((disparities[order].diff() >= 0).all())  # disparities are monotone in the target
        # exp is increasing, so it keeps the order (ties cannot appear: it is injective on these values)
        assert torch.allclose(geometry.nonmetric_stress(delta, target.exp() - 1, formula), value, atol=1e-12)
        assert torch.allclose(geometry.nonmetric_stress(7 * delta, target, formula), value, atol=1e-12)
    assert 0 <= float(geometry.nonmetric_stress(delta, target)) <= 1


def test_nonmetric_stress_extremes():
    target = geometry.hellinger_distances(random_distributions(8, 10, 1))
    monotone = target.square() + 2 * target  # an increasing function of the target: a perfect order
    assert float(geometry.nonmetric_stress(monotone, target)) < 1e-15
    equidistant = 1 - torch.eye(8, dtype=torch.float64)
    assert float(geometry.nonmetric_stress(equidistant, target)) == 0  # constant disparities equal delta exactly
    with pytest.raises(ValueError, match="stress-2"):
        geometry.nonmetric_stress(equidistant, target, formula=2)
    # ties in the target share one disparity (secondary approach)
    line = geometry.pairwise_distances(torch.arange(5, dtype=torch.float64)[:, None])
    delta = geometry.pairwise_distances(
        torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    )
    _, disparities = geometry.nonmetric_stress(delta, line, return_disparities=True)
    offsets = pair_vector(line)
    for offset in range(1, 5):
        tied = disparities[offsets == offset]
        assert torch.allclose(tied, tied[:1].expand_as(tied), atol=1e-15)


# the positional separation theorem, smallest case ----------------------------------------------------------------
def test_position_predictor_reaches_the_entropy_and_separates_different_positions():
    distributions = torch.tensor(
        [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]],
        dtype=torch.float64,
    )
    for seed in range(3):
        fit = geometry.fit_position_predictor(distributions, dim=3, seed=seed, max_iter=100)
        assert fit.loss >= fit.entropy - 1e-12 and fit.loss - fit.entropy < 1e-9
        logits = fit.embeddings @ fit.readout.T + fit.bias
        assert torch.allclose(torch.softmax(logits, 1), distributions, atol=1e-4)
        distances = geometry.pairwise_distances(fit.embeddings)
        assert float(distances[~torch.eye(4, dtype=torch.bool)].min()) > 0.1


def test_position_predictor_below_the_affine_rank_stays_above_the_entropy():
    # four different rows span a 3-dimensional affine space of centred log-probabilities: 1 or 2 dimensions cannot
    # reach it (measured gaps 1.1e-2 and 8.7e-5 nats, the same from every start)
    distributions = torch.tensor(
        [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]],
        dtype=torch.float64,
    )
    for dim, gap in [(1, 1e-2), (2, 5e-5)]:
        fit = geometry.fit_position_predictor(distributions, dim=dim, seed=0, max_iter=200)
        assert fit.loss - fit.entropy > gap


def test_position_predictor_at_the_minimal_width_merges_equal_rows():
    # at dim = affine rank the map e -> centred logits is one-to-one, so equal rows get one vector (up to the
    # optimiser's tolerance, at most 2e-4 over seeds 0-9)
    distributions = torch.tensor(
        [
            [0.4, 0.3, 0.2, 0.1],
            [0.1, 0.2, 0.3, 0.4],
            [0.25, 0.25, 0.25, 0.25],
            [0.4, 0.3, 0.2, 0.1],
            [0.7, 0.1, 0.1, 0.1],
        ],
        dtype=torch.float64,
    )
    fit = geometry.fit_position_predictor(distributions, dim=3, seed=0, max_iter=60)
    assert float(geometry.pairwise_distances(fit.embeddings)[0, 3]) < 1e-3


@pytest.mark.parametrize(
    "call, error, name",
    [
        (lambda: geometry.isotonic_regression(torch.ones(2, 2)), ValueError, "values"),
        (lambda: geometry.isotonic_regression(torch.ones(3), torch.zeros(3)), ValueError, "weights"),
        (lambda: geometry.isotonic_regression(torch.ones(3), torch.ones(2)), ValueError, "weights"),
        (lambda: geometry.nonmetric_stress(1 - torch.eye(3), 1 - torch.eye(3), formula=3), ValueError, "formula"),
        (lambda: geometry.affine_stress(1 - torch.eye(3), 1 - torch.eye(3)), ValueError, "distances"),
        (lambda: geometry.distance_correlation(1 - torch.eye(3), 1 - torch.eye(3)), ValueError, "constant"),
        (
            lambda: geometry.partial_correlation(1 - torch.eye(3), 1 - torch.eye(3), torch.ones(3)),
            ValueError,
            "control",
        ),
        (
            lambda: geometry.partial_correlation(1 - torch.eye(3), 1 - torch.eye(3), torch.ones(2, 4, 4)),
            ValueError,
            "control",
        ),
        (lambda: geometry.fit_position_predictor(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), 2), ValueError, "positive"),
        (lambda: geometry.fit_position_predictor(torch.full((2, 2), 0.5), 0), ValueError, "dim"),
    ],
)
def test_bad_input_of_the_criteria_names_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_shuffle_within_keeps_each_sequence_multiset_and_its_padding():
    sequences = torch.tensor([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]])
    lengths = torch.tensor([3, 5])
    shuffled = geometry.shuffle_within(sequences, lengths, seed=3)
    assert torch.equal(shuffled[0, 3:], sequences[0, 3:])  # padding stays at the end
    for row, length in enumerate(lengths.tolist()):
        assert sorted(shuffled[row, :length].tolist()) == sorted(sequences[row, :length].tolist())
    assert torch.equal(geometry.shuffle_within(sequences, lengths, seed=3), shuffled)  # seeded
    many = geometry.shuffle_within(torch.arange(64).repeat(50, 1), torch.full((50,), 64), seed=0)
    assert not torch.equal(many, torch.arange(64).repeat(50, 1))
    with pytest.raises(ValueError, match="lengths"):
        geometry.shuffle_within(sequences, torch.tensor([3]))


def test_split_groups_never_splits_a_group_and_balances_the_halves():
    groups = torch.tensor([0] * 10 + [1] * 3 + [2] * 7 + [3] * 4 + [4] * 6)
    first, second = geometry.split_groups(groups, seed=1)
    assert sorted(torch.cat([first, second]).tolist()) == list(range(len(groups)))
    assert set(groups[first].tolist()).isdisjoint(groups[second].tolist())
    assert abs(len(first) - len(second)) <= 10  # at most the largest group apart
    with pytest.raises(ValueError, match="groups"):
        geometry.split_groups(groups[None])


def test_rope_family_distances_are_ropes_vectors_and_the_slowest_pair_is_a_line():
    inv_freq, _ = posenc.rope_frequencies(16)
    n = 40
    u = torch.cat([torch.ones(8), torch.zeros(8)]).double()
    vectors = posenc.rotate(u.expand(n, 16), torch.arange(n))  # float32 angles, as the book's table
    equal = geometry.rope_family_distances(n, inv_freq, torch.ones(8, dtype=torch.float64))
    assert torch.allclose(equal, geometry.pairwise_distances(vectors), atol=1e-4)
    slowest = geometry.rope_family_distances(n, inv_freq, torch.nn.functional.one_hot(torch.tensor(7), 8).double())
    line = geometry.pairwise_distances(torch.arange(n, dtype=torch.float64)[:, None]) * inv_freq[7].double()
    # chord 2 sin(x / 2) against x: relative gap x^2 / 24 with x <= 39 theta_7 ~ 0.05
    assert torch.allclose(slowest, line, rtol=1e-3, atol=0)
    with pytest.raises(ValueError, match="weights"):
        geometry.rope_family_distances(n, inv_freq, -torch.ones(8))


@pytest.mark.parametrize("criterion", geometry.ROPE_FIT_CRITERIA)
def test_fit_rope_amplitudes_recovers_a_member_of_the_family(criterion):
    inv_freq, _ = posenc.rope_frequencies(16)
    true = torch.tensor([0.0, 0.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    target = geometry.rope_family_distances(30, inv_freq, true)
    weights = geometry.fit_rope_amplitudes(target, inv_freq, criterion=criterion)
    fitted = geometry.rope_family_distances(30, inv_freq, weights)
    equal = geometry.rope_family_distances(30, inv_freq, torch.ones(8, dtype=torch.float64))
    assert abs(weights.sum().item() - 1) < 1e-12 and bool((weights >= 0).all())
    if criterion == "pearson":
        assert geometry.distance_correlation(fitted, target) > 0.999 > geometry.distance_correlation(equal, target)
    else:
        assert geometry.stress_of_distances(fitted, target) < 0.01 < geometry.stress_of_distances(equal, target)
    with pytest.raises(ValueError, match="criterion"):
        geometry.fit_rope_amplitudes(target, inv_freq, criterion="kruskal")


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, free=st.integers(0, 2))
def test_nonnegative_least_squares_matches_scipy(seed, free):
    from scipy.optimize import lsq_linear

    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(30, 8, generator=generator, dtype=torch.float64)
    target = torch.randn(30, generator=generator, dtype=torch.float64)
    x = geometry.nonnegative_least_squares(matrix, target, free=free)
    lower = [-math.inf] * free + [0.0] * (8 - free)
    reference = lsq_linear(matrix.numpy(), target.numpy(), bounds=(lower, math.inf), method="bvls", tol=1e-12)
    assert bool((x[free:] >= 0).all())
    # the minimum is unique (full column rank): the residuals agree to round-off, and so do the solutions
    assert abs(float((matrix @ x - target).norm()) - float(torch.tensor(reference.fun).norm())) < 1e-9
    assert torch.allclose(x, torch.tensor(reference.x), atol=1e-7)


def test_nonnegative_least_squares_by_hand():
    # columns e_1, e_2 and target (1, -1): the second coefficient would be -1, the constraint puts it at 0
    matrix = torch.eye(2, dtype=torch.float64)
    assert torch.equal(geometry.nonnegative_least_squares(matrix, torch.tensor([1.0, -1.0])), torch.tensor([1.0, 0.0]))
    assert torch.equal(
        geometry.nonnegative_least_squares(matrix, torch.tensor([1.0, -1.0]), free=2),
        torch.tensor([1.0, -1.0], dtype=torch.float64),
    )
    # a positive solution is the plain least-squares solution
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    assert torch.allclose(
        geometry.nonnegative_least_squares(a, a @ torch.tensor([2.0, 3.0], dtype=torch.float64)),
        torch.tensor([2.0, 3.0], dtype=torch.float64),
        atol=1e-12,
    )
    with pytest.raises(ValueError, match="free"):
        geometry.nonnegative_least_squares(matrix, torch.ones(2), free=3)
    with pytest.raises(ValueError, match="target"):
        geometry.nonnegative_least_squares(matrix, torch.ones(3))
