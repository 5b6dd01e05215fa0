"""The geometry of positions in a corpus: positional distributions, Hellinger distances, classical MDS, stress.

A reconstruction of the pipeline of "On the Geometry of Positional Encodings in Transformers" (arXiv:2604.05217),
whose exact Algorithm 1 and stress formula were not available:

1. ``P_i(w)``: the frequency of token ``w`` at position ``i`` of a tokenised corpus (:func:`positional_distributions`);
2. ``H(P_i, P_j) = ||sqrt(P_i) - sqrt(P_j)|| / sqrt(2)``, the Hellinger distance, computed without cancellation
   (:func:`hellinger_distances`);
3. ``B = -1/2 J D^2 J`` and its top eigenvectors scaled by ``sqrt(eigenvalue)`` (:func:`classical_mds`);
4. the fit of any encoding to ``D`` under several criteria: metric ratio stress with a fitted scale
   (:func:`stress`, :func:`stress_of_distances`), offset-aware stress and correlation (:func:`affine_stress`,
   :func:`distance_correlation`; :func:`partial_correlation` when a null is controlled for), and Kruskal's
   non-metric stress via isotonic regression (:func:`nonmetric_stress`, :func:`isotonic_regression`);
   least squares with non-negative coefficients (:func:`nonnegative_least_squares`, used for chapter 8's mixtures
   of decays);
5. the best distances that depend only on ``|i - j|`` (:func:`toeplitz_projection`): a floor for the stress of
   every shift-invariant encoding;
6. the rank of ``B`` (:func:`effective_rank`, :func:`entropy_effective_rank`) and the ``r (n + d)``-parameter
   factorisation of an ``(n, d)`` encoding (:func:`low_rank_factors`);
7. the controls a score needs: the no-order null (:func:`shuffle_within`), halves that share no text
   (:func:`split_groups`), and the RoPE family at its best member (:func:`rope_family_distances`,
   :func:`fit_rope_amplitudes`).

Everything is computed in float64 on the device of the input, with no Python loop over positions or pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import float_matrix, require_int, require_tensor

FLOAT = torch.float64


def _integer_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    require_tensor(name, value)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {value.dtype}")
    return value


def _flatten_corpus(sequences, lengths):
    """Token ids and their positions as two flat 1-D tensors, from a list of 1-D tensors or a padded 2-D one."""
    if isinstance(sequences, (list, tuple)):
        if lengths is not None:
            raise ValueError("lengths is only for a padded (N, L) tensor; a list of sequences carries its lengths")
        if not sequences:
            raise ValueError("sequences must not be empty")
        for index, sequence in enumerate(sequences):
            _integer_tensor(f"sequences[{index}]", sequence)
            if sequence.ndim != 1:
                raise ValueError(f"sequences[{index}] must be 1-D (L,), got shape {tuple(sequence.shape)}")
        device = sequences[0].device
        lengths = torch.tensor([len(sequence) for sequence in sequences], device=device)
        tokens = torch.cat([sequence.to(device) for sequence in sequences])
        starts = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(len(tokens), device=device) - torch.repeat_interleave(starts, lengths)
        return tokens, positions
    _integer_tensor("sequences", sequences)
    if sequences.ndim != 2:
        raise ValueError(
            f"sequences must be a list of 1-D tensors or a padded (N, L) tensor, got {tuple(sequences.shape)}"
        )
    n_sequences, width = sequences.shape
    positions = torch.arange(width, device=sequences.device).expand(n_sequences, width)
    if lengths is None:
        return sequences.reshape(-1), positions.reshape(-1)
    lengths = _integer_tensor("lengths", lengths).to(sequences.device)
    if lengths.shape != (n_sequences,):
        raise ValueError(f"lengths must have shape (N,) = ({n_sequences},), got {tuple(lengths.shape)}")
    if bool((lengths < 0).any()) or bool((lengths > width).any()):
        raise ValueError(f"lengths must lie in [0, {width}] (the padded width)")
    inside = positions < lengths[:, None]
    return sequences[inside], positions[inside]


def position_token_counts(sequences, vocab_size: int, n_positions: int | None = None, lengths=None) -> torch.Tensor:
    """``counts[i, w]``: how often token ``w`` occurs at position ``i``, shape ``(n_positions, vocab_size)``, float64.

    ``sequences``: a list of 1-D integer tensors, or a padded ``(N, L)`` integer tensor with optional ``lengths``
    ``(N,)`` (entries past a sequence's length are ignored, whatever they hold). ``n_positions`` defaults to the
    longest sequence; positions from ``n_positions`` on are dropped (sequences are truncated, not wrapped).
    """
    require_int("vocab_size", vocab_size, minimum=1)
    tokens, positions = _flatten_corpus(sequences, lengths)
    if n_positions is None:
        n_positions = int(positions.max()) + 1 if positions.numel() else 0
    require_int("n_positions", n_positions, minimum=1)
    kept = positions < n_positions
    tokens, positions = tokens[kept], positions[kept]
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(
            f"sequences must hold token ids in [0, vocab_size={vocab_size}), "
            f"got range [{int(tokens.min())}, {int(tokens.max())}]"
        )
    flat = positions * vocab_size + tokens
    counts = torch.zeros(n_positions * vocab_size, dtype=FLOAT, device=tokens.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=FLOAT))
    return counts.view(n_positions, vocab_size)


def positional_distributions(sequences, vocab_size: int, n_positions: int | None = None, lengths=None) -> torch.Tensor:
    """``P[i, w] = count of w at position i / number of tokens at position i``: ``(n_positions, vocab_size)``, float64.

    Same arguments as :func:`position_token_counts`. Every position below ``n_positions`` must occur in at least
    one sequence (otherwise its distribution is undefined and a ``ValueError`` says which one is empty).
    """
    counts = position_token_counts(sequences, vocab_size, n_positions, lengths)
    totals = counts.sum(dim=1, keepdim=True)
    empty = (totals[:, 0] == 0).nonzero()
    if empty.numel():
        raise ValueError(f"n_positions: position {int(empty[0])} has no tokens in sequences; lower n_positions")
    return counts.div_(totals)


def _distance_matrix(name: str, value) -> torch.Tensor:
    distances = float_matrix(name, value, square=True)
    if bool((distances < 0).any()):
        raise ValueError(f"{name} must be non-negative")
    scale = float(distances.abs().max())
    if float((distances - distances.T).abs().max()) > 1e-9 * max(scale, 1.0):
        raise ValueError(f"{name} must be symmetric")
    return (distances + distances.T) / 2


# Pairs whose Gram estimate of H^2 is below this are recomputed term by term (see hellinger_distances).
_NEAR = 1.0 / 16
_CHUNK = 2**21  # elements per block of the term-by-term recomputation (16 MB of float64)


def _squared_chords(values: torch.Tensor, roots: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``1/2 sum_w (sqrt(p_w) - sqrt(q_w))^2`` for the row pairs ``(rows[k], cols[k])``, ``(K,)``, without cancellation.

    Each difference is formed as ``(p_w - q_w) / (sqrt(p_w) + sqrt(q_w))``: ``p_w - q_w`` is exact when the two lie
    within a factor 2 (Sterbenz), so every term has a relative error of a few ulps and the sum of non-negative terms
    keeps it. Terms where both are 0 are 0.
    """
    out = torch.empty(len(rows), dtype=FLOAT, device=values.device)
    step = max(1, _CHUNK // max(values.shape[1], 1))
    for start in range(0, len(rows), step):
        a, b = rows[start : start + step], cols[start : start + step]
        denominator = roots[a] + roots[b]
        terms = (values[a] - values[b]) / torch.where(denominator > 0, denominator, 1.0)
        out[start : start + step] = terms.square_().sum(dim=1) / 2
    return out


def hellinger_distances(distributions: torch.Tensor) -> torch.Tensor:
    """``H[i, j] = ||sqrt(P_i) - sqrt(P_j)|| / sqrt(2)`` for the rows of ``distributions`` ``(n, V)``: ``(n, n)``.

    For probability vectors this equals ``sqrt(1 - sum_w sqrt(P_i(w) P_j(w)))``, but that form loses half its digits
    where distances are small (``1 - overlap`` cancels, and the square root doubles the relative error), so it is
    not used. Rows must be probability vectors (non-negative, summing to 1 within 1e-6).

    Computation: first ``H^2 = (s_i + s_j)/2 - sqrt(P_i) . sqrt(P_j)`` (``s`` the row sums) for all pairs with one
    matrix product over the tokens that occur at all; its absolute error is the product's rounding error ``eps``
    (about 1e-14 on a (512, 30522) corpus table), so for pairs with ``H^2 >= 1/16`` the relative error of ``H`` is
    at most ``8 eps``. Every pair below 1/16 is recomputed term by term (:func:`_squared_chords`), with a relative
    error of a few ulps; identical rows give exactly 0 on every CPU. The diagonal is 0, ``H`` is symmetric and lies
    in ``[0, 1]``: a Euclidean (chord) distance between points of the unit sphere, divided by ``sqrt(2)``.
    The recomputation costs ``O(V)`` per close pair: a table whose rows are nearly all alike is slower.
    """
    distributions = float_matrix("distributions", distributions)
    if bool((distributions < 0).any()):
        raise ValueError("distributions must be non-negative (rows are probability vectors)")
    sums = distributions.sum(dim=1)
    if float((sums - 1).abs().max()) > 1e-6:
        raise ValueError("distributions must have rows that sum to 1 (probability vectors)")
    observed = (distributions > 0).any(dim=0)
    values = distributions[:, observed]
    roots = values.sqrt()
    overlap = roots @ roots.T
    squared = ((sums[:, None] + sums[None, :]) / 2 - (overlap + overlap.T) / 2).clamp_(0.0, 1.0)
    rows, cols = torch.triu_indices(len(values), len(values), 1, device=values.device)
    near = squared[rows, cols] < _NEAR
    rows, cols = rows[near], cols[near]
    if len(rows):
        exact = _squared_chords(values, roots, rows, cols).clamp_(0.0, 1.0)
        squared[rows, cols] = exact
        squared[cols, rows] = exact
    squared.fill_diagonal_(0.0)
    return squared.sqrt_()


def double_centered_gram(distances: torch.Tensor) -> torch.Tensor:
    """``B = -1/2 J D^2 J`` with ``J = I - 11^T/n``: the Gram matrix of centred points with distances ``D``, ``(n, n)``.

    ``B`` is positive semidefinite exactly when ``D`` is a Euclidean distance matrix (Schoenberg / Torgerson).
    Double centring subtracts means of ``D^2`` from its entries, so ``B`` carries an absolute error of a few ulps of
    ``max D^2`` (times ``log n``): eigenvalues below that are round-off, which is why :func:`effective_rank`
    counts relative to the largest eigenvalue with a tolerance far above ``n`` ulps.
    """
    squared = _distance_matrix("distances", distances).square()
    centred = squared - squared.mean(dim=0, keepdim=True) - squared.mean(dim=1, keepdim=True) + squared.mean()
    return -0.5 * centred


class MDSResult(NamedTuple):
    """``embedding``: ``(n, dim)`` coordinates; ``eigenvalues``: all ``n`` eigenvalues of ``B``, descending."""

    embedding: torch.Tensor
    eigenvalues: torch.Tensor


def effective_rank(eigenvalues: torch.Tensor, rtol: float = 1e-9) -> int:
    """Numerical rank: the number of eigenvalues greater than ``rtol * max |eigenvalue|``.

    This is the book's reading of the paper's ``r = rank(B)``; negative eigenvalues never count.
    """
    eigenvalues = require_tensor("eigenvalues", eigenvalues)
    if eigenvalues.ndim != 1 or not eigenvalues.numel():
        raise ValueError(f"eigenvalues must be a non-empty 1-D tensor, got shape {tuple(eigenvalues.shape)}")
    if not rtol >= 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    eigenvalues = eigenvalues.to(FLOAT)
    return int((eigenvalues > rtol * eigenvalues.abs().max()).sum())


def entropy_effective_rank(eigenvalues: torch.Tensor) -> float:
    """``exp(-sum p_k log p_k)`` with ``p_k = max(lambda_k, 0) / sum max(lambda, 0)`` (Roy and Vetterli, 2007).

    A smooth count of the directions that carry the spread: ``r`` equal eigenvalues give exactly ``r``.
    """
    eigenvalues = require_tensor("eigenvalues", eigenvalues)
    if eigenvalues.ndim != 1 or not eigenvalues.numel():
        raise ValueError(f"eigenvalues must be a non-empty 1-D tensor, got shape {tuple(eigenvalues.shape)}")
    positive = eigenvalues.to(FLOAT).clamp_min(0)
    if float(positive.sum()) == 0:
        raise ValueError("eigenvalues must contain at least one positive value")
    weights = positive / positive.sum()
    return float(torch.exp(-torch.special.xlogy(weights, weights).sum()))


def classical_mds(distances: torch.Tensor, dim: int | None = None, rtol: float = 1e-9) -> MDSResult:
    """Classical (Torgerson) MDS: the top ``dim`` eigenvectors of ``B`` scaled by ``sqrt(eigenvalue)``.

    ``distances``: symmetric non-negative ``(n, n)``. ``dim`` defaults to :func:`effective_rank` of ``B`` with
    ``rtol``; columns for non-positive eigenvalues are zero. Each column's sign is fixed so that its largest
    entry in absolute value is positive (eigenvectors are defined only up to sign). When ``D`` is Euclidean and
    ``dim >= rank(B)``, the embedding's distances reproduce ``D`` exactly (up to round-off).
    """
    gram = double_centered_gram(distances)
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    if dim is None:
        dim = max(effective_rank(eigenvalues, rtol), 1)
    require_int("dim", dim, minimum=1)
    if dim > len(eigenvalues):
        raise ValueError(f"dim must be <= n = {len(eigenvalues)}, got {dim}")
    vectors = eigenvectors[:, :dim]
    peaks = vectors.gather(0, vectors.abs().argmax(dim=0, keepdim=True))
    vectors = vectors * torch.where(peaks < 0, -1.0, 1.0)
    return MDSResult(vectors * eigenvalues[:dim].clamp_min(0).sqrt(), eigenvalues)


def pairwise_distances(encoding: torch.Tensor) -> torch.Tensor:
    """Euclidean distances ``||e_i - e_j||`` between the rows of an encoding ``(n, d)``: ``(n, n)``, float64."""
    encoding = float_matrix("encoding", encoding)
    return torch.cdist(encoding, encoding, compute_mode="donot_use_mm_for_euclid_dist")


def kernel_distances(kernel: torch.Tensor) -> torch.Tensor:
    """Distances induced by a similarity kernel ``K`` ``(n, n)``: ``sqrt(max(K_ii + K_jj - 2 S_ij, 0))``.

    ``S = (K + K^T) / 2`` is the symmetric part (a score kernel need not be symmetric). For ``K = E E^T`` this is
    exactly ``||e_i - e_j||``; for a kernel that is not positive semidefinite the result is only distance-like.
    The difference under the root cancels for close points: its absolute error is a few ulps of ``max |K|``, so a
    distance much below ``sqrt(eps * max |K|)`` is not resolved (use :func:`pairwise_distances` when the vectors
    are at hand).
    """
    kernel = float_matrix("kernel", kernel, square=True)
    symmetric = (kernel + kernel.T) / 2
    diagonal = symmetric.diagonal()
    return (diagonal[:, None] + diagonal[None, :] - 2 * symmetric).clamp_min_(0).sqrt_()


def stress_of_distances(encoding_distances: torch.Tensor, distances: torch.Tensor, return_scale: bool = False):
    """Metric ratio stress of distances ``delta`` ``(n, n)`` against a target ``D`` ``(n, n)``, with a fitted scale.

    ``stress = sqrt(sum_{i<j} (c delta_ij - D_ij)^2 / sum_{i<j} D_ij^2)`` where ``c = sum delta D / sum delta^2``
    is the least-squares scale (a scale but no offset; normalised by the target's sum of squares, over pairs
    ``i < j``). This is *not* Kruskal's stress-1, which is non-metric (:func:`nonmetric_stress`); the offset-aware
    version is :func:`affine_stress`. The result is invariant to rescaling either argument and equals
    ``sqrt(1 - rho^2)``, ``rho`` the cosine between the two vectors of pair distances (computed from the residuals,
    not from that difference); 0 means the same geometry up to scale, 1 means none at all (an encoding that gives
    every position the same point has ``c = 0`` and stress 1). Returns a 0-d float64 tensor, and ``c`` when asked.
    """
    target = _distance_matrix("distances", distances)
    fitted = _distance_matrix("encoding_distances", encoding_distances)
    if fitted.shape != target.shape:
        raise ValueError(
            f"encoding_distances and distances must have the same shape, got "
            f"{tuple(fitted.shape)} and {tuple(target.shape)}"
        )
    upper = torch.ones_like(target, dtype=torch.bool).triu_(1)
    fitted, target = fitted[upper], target[upper]
    target_norm = target.square().sum()
    if float(target_norm) == 0:
        raise ValueError("distances must not be all zero: stress is relative to the target's spread")
    fitted_norm = fitted.square().sum()
    scale = (fitted @ target) / fitted_norm if float(fitted_norm) > 0 else fitted_norm
    value = ((scale * fitted - target).square().sum() / target_norm).sqrt()
    return (value, scale) if return_scale else value


def _pair_vectors(encoding_distances, distances) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair distances ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` of two ``(n, n)`` distance matrices, ``(m,)``
    each."""
    target = _distance_matrix("distances", distances)
    fitted = _distance_matrix("encoding_distances", encoding_distances)
    if fitted.shape != target.shape:
        raise ValueError(
            f"encoding_distances and distances must have the same shape, got "
            f"{tuple(fitted.shape)} and {tuple(target.shape)}"
        )
    rows, cols = torch.triu_indices(len(target), len(target), 1, device=target.device)
    return fitted[rows, cols], target[rows, cols]


def distance_correlation(encoding_distances: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between the pair distances ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` (two ``(n, n)``
    matrices): a 0-d float64 tensor in ``[-1, 1]``. Invariant to any affine map ``a + c delta`` with ``c > 0``.
    Undefined (``ValueError``) when either set of pair distances is constant."""
    fitted, target = _pair_vectors(encoding_distances, distances)
    fitted, target = fitted - fitted.mean(), target - target.mean()
    norms = fitted.norm() * target.norm()
    if float(norms) == 0:
        raise ValueError(
            "encoding_distances and distances must not have constant pair distances: the correlation is undefined"
        )
    return ((fitted @ target) / norms).clamp(-1.0, 1.0)


def partial_correlation(
    encoding_distances: torch.Tensor, distances: torch.Tensor, control: torch.Tensor
) -> torch.Tensor:
    """Partial correlation of the pair distances ``delta`` with ``D`` controlling for ``control``: the Pearson
    correlation of the residuals of ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` after each is regressed on an
    intercept and the control's pair distances. Arguments are ``(n, n)`` distance matrices; ``control`` may also be
    a ``(k, n, n)`` stack (several controls at once). Returns a 0-d float64 tensor in ``[-1, 1]``; with one control it
    equals ``(r_dD - r_dC r_DC) / sqrt((1 - r_dC^2)(1 - r_DC^2))``.

    Use it to ask whether an encoding follows the part of a target that a null (a shuffled corpus) does not
    explain: correlations with two different targets are not comparable, this is. Undefined (``ValueError``) when
    either residual is zero (a distance set the control explains exactly)."""
    fitted, target = _pair_vectors(encoding_distances, distances)
    require_tensor("control", control)
    controls = control[None] if control.ndim == 2 else control
    if controls.ndim != 3 or controls.shape[0] == 0 or controls.shape[1:] != distances.shape:
        raise ValueError(
            f"control must be an (n, n) distance matrix like distances {tuple(distances.shape)} or a "
            f"(k, n, n) stack of them, got shape {tuple(control.shape)}"
        )
    rows, cols = torch.triu_indices(len(distances), len(distances), 1, device=target.device)
    columns = [_distance_matrix("control", one)[rows, cols] for one in controls]
    design = torch.stack([torch.ones_like(target), *columns], dim=1)  # (pairs, 1 + k)
    both = torch.stack([fitted, target], dim=1)  # (pairs, 2)
    residuals = both - design @ torch.linalg.lstsq(design, both).solution
    norms = residuals.norm(dim=0)
    if bool((norms <= 1e-12 * (both - both.mean(dim=0)).norm(dim=0)).any()):  # round-off of an exact fit
        raise ValueError(
            "the control explains encoding_distances or distances exactly: the partial correlation is undefined"
        )
    return ((residuals[:, 0] @ residuals[:, 1]) / (norms[0] * norms[1])).clamp(-1.0, 1.0)


def affine_stress(encoding_distances: torch.Tensor, distances: torch.Tensor, return_fit: bool = False):
    """Offset-aware (interval) stress: ``sqrt(min_{a, c >= 0} sum (a + c delta - D)^2 / sum (D - mean D)^2)``.

    Arguments are ``(n, n)`` distance matrices; sums run over pairs ``i < j``. The best line gives
    ``sqrt(1 - r^2)`` for a positive Pearson correlation ``r`` (:func:`distance_correlation`) and 1 when ``r <= 0``
    (``c`` is held at 0: a distance that falls as the target grows is no fit). Computed from the residuals, not
    from ``1 - r^2``. Returns a 0-d float64 tensor, and ``(a, c)`` when asked.
    """
    fitted, target = _pair_vectors(encoding_distances, distances)
    centred_target = target - target.mean()
    spread = centred_target.square().sum()
    if float(spread) == 0:
        raise ValueError(
            "distances must not have constant pair distances: affine stress is relative to their variation"
        )
    centred = fitted - fitted.mean()
    norm = centred.square().sum()
    scale = (centred @ centred_target) / norm if float(norm) > 0 else norm
    scale = scale.clamp_min(0.0)
    offset = target.mean() - scale * fitted.mean()
    value = ((offset + scale * fitted - target).square().sum() / spread).sqrt()
    return (value, (offset, scale)) if return_fit else value


def isotonic_regression(values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The non-decreasing sequence closest to ``values`` ``(m,)`` in weighted least squares: ``(m,)``, float64.

    Pool-adjacent-violators algorithm (Ayer et al. 1955; Kruskal 1964): scan left to right, keep blocks with their
    weighted means, and merge the last two blocks while their means decrease. ``O(m)`` amortised. ``weights``
    ``(m,)`` must be positive (default 1). Each output value is the weighted mean of its block.
    """
    values = require_tensor("values", values)
    if values.ndim != 1 or not values.numel():
        raise ValueError(f"values must be a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    values = values.to(FLOAT)
    if weights is None:
        weights = torch.ones_like(values)
    else:
        weights = require_tensor("weights", weights).to(FLOAT)
        if weights.shape != values.shape:
            raise ValueError(f"weights must have the shape of values {tuple(values.shape)}, got {tuple(weights.shape)}")
        if not bool((weights > 0).all()):
            raise ValueError("weights must be positive")
    if not bool(torch.isfinite(values).all() and torch.isfinite(weights).all()):
        raise ValueError("values and weights must be finite")
    means, totals, sizes = [], [], []
    for value, weight in zip(values.tolist(), weights.tolist()):
        means.append(value)
        totals.append(weight)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            weight = totals[-2] + totals[-1]
            means[-2] = (totals[-2] * means[-2] + totals[-1] * means[-1]) / weight
            totals[-2] = weight
            sizes[-2] += sizes[-1]
            del means[-1], totals[-1], sizes[-1]
    return torch.repeat_interleave(torch.tensor(means, dtype=FLOAT), torch.tensor(sizes)).to(values.device)


def nonnegative_least_squares(matrix: torch.Tensor, target: torch.Tensor, free: int = 0) -> torch.Tensor:
    """``x`` ``(n,)`` minimising ``||matrix @ x - target||`` with ``x[free:] >= 0`` and the first ``free`` entries
    unconstrained; ``matrix`` ``(m, n)``, ``target`` ``(m,)``; float64.

    The free columns are projected out first (QR), the rest is the active-set method of Lawson and Hanson (1974):
    move into the passive set the coordinate whose gradient most wants to grow, solve least squares on the passive
    set, and step back to the boundary while a passive coordinate would turn negative. The free entries are then
    least squares on what the bounded ones leave. It stops when no coordinate's gradient exceeds its round-off
    (or after ``3 (n - free)`` steps); a constraint that binds shows as an entry at exactly 0."""
    matrix, target = require_tensor("matrix", matrix), require_tensor("target", target)
    if matrix.ndim != 2 or target.shape != matrix.shape[:1]:
        raise ValueError(f"matrix must be (m, n) and target (m,), got {tuple(matrix.shape)} and {tuple(target.shape)}")
    require_int("free", free)
    if not 0 <= free <= matrix.shape[1]:
        raise ValueError(f"free must lie in 0..{matrix.shape[1]}, got {free}")
    matrix, target = matrix.to(FLOAT), target.to(FLOAT)
    if not bool(torch.isfinite(matrix).all() and torch.isfinite(target).all()):
        raise ValueError("matrix and target must be finite")
    unconstrained, bounded = matrix[:, :free], matrix[:, free:]
    a, b = bounded, target
    if free:
        basis = torch.linalg.qr(unconstrained).Q  # (m, free)
        a, b = a - basis @ (basis.T @ a), b - basis @ (basis.T @ b)
    k = a.shape[1]
    x = torch.zeros(k, dtype=FLOAT, device=matrix.device)
    passive = torch.zeros(k, dtype=torch.bool, device=matrix.device)
    tol = 10 * torch.finfo(FLOAT).eps * float(torch.linalg.matrix_norm(a) * b.norm())  # round-off of a.T @ residual
    for _ in range(3 * k):
        gradient = a.T @ (b - a @ x)  # minus half the gradient of the squared error
        wanted = ~passive & (gradient > tol)
        if not bool(wanted.any()):
            break
        passive[torch.where(wanted, gradient, -torch.inf).argmax()] = True
        while True:
            z = torch.zeros_like(x)
            q, r = torch.linalg.qr(a[:, passive])  # QR: no rank cut on ill-conditioned sets
            z[passive] = torch.linalg.solve_triangular(r, (q.T @ b)[:, None], upper=True)[:, 0]
            if bool((z[passive] > 0).all()):
                x = z
                break
            blocking = passive & (z <= 0)
            step = (x[blocking] / (x[blocking] - z[blocking])).min()
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0
    if not free:
        return x
    rest = torch.linalg.lstsq(unconstrained, (target - bounded @ x)[:, None]).solution[:, 0]
    return torch.cat((rest, x))


def nonmetric_stress(
    encoding_distances: torch.Tensor, distances: torch.Tensor, formula: int = 1, return_disparities: bool = False
):
    """Kruskal's non-metric stress of distances ``delta`` against the *order* of a target ``D`` (both ``(n, n)``).

    The disparities ``dhat`` are the isotonic regression of ``delta`` on the ranking of ``D`` (pairs ``i < j``
    sorted by ``D``; pairs with tied ``D`` get one common disparity, Kruskal's secondary approach). Stress-1
    (``formula=1``, Kruskal 1964) is ``sqrt(sum (delta - dhat)^2 / sum delta^2)``; stress-2 (``formula=2``) divides
    by ``sum (delta - mean delta)^2`` instead. Only the order of ``D`` matters, and ``delta`` may be rescaled.
    Stress-1 is 0 for equidistant points whatever ``D`` is (a constant is monotone in anything); stress-2 is
    undefined for them (``ValueError``). Returns a 0-d float64 tensor, and ``dhat`` ``(m,)`` (in the order of
    the pairs ``i < j``) when asked.
    """
    if formula not in (1, 2):
        raise ValueError(f"formula must be 1 (stress-1) or 2 (stress-2), got {formula!r}")
    fitted, target = _pair_vectors(encoding_distances, distances)
    order = torch.argsort(target, stable=True)
    _, tie_sizes = torch.unique_consecutive(target[order], return_counts=True)
    block = torch.repeat_interleave(torch.arange(len(tie_sizes), device=target.device), tie_sizes)
    block_means = (
        torch.zeros(len(tie_sizes), dtype=FLOAT, device=target.device).index_add_(0, block, fitted[order]) / tie_sizes
    )
    disparities = torch.empty_like(fitted)
    disparities[order] = isotonic_regression(block_means, tie_sizes.to(FLOAT))[block]
    if formula == 1:
        normaliser = fitted.square().sum()
    else:
        normaliser = (fitted - fitted.mean()).square().sum()
    if float(normaliser) == 0:
        raise ValueError(
            "encoding_distances must not be "
            + ("all zero" if formula == 1 else "constant (stress-2 is undefined for equidistant points)")
        )
    value = ((fitted - disparities).square().sum() / normaliser).sqrt()
    return (value, disparities) if return_disparities else value


class PositionPredictor(NamedTuple):
    """A fitted ``softmax(W e_i + b)`` model: ``embeddings`` ``(n, dim)``, ``readout`` ``W`` ``(V, dim)``, ``bias``
    ``(V,)``, the final ``loss`` and its lower bound ``entropy`` (both in nats per token)."""

    embeddings: torch.Tensor
    readout: torch.Tensor
    bias: torch.Tensor
    loss: float
    entropy: float


def fit_position_predictor(
    distributions: torch.Tensor, dim: int, weights: torch.Tensor | None = None, seed: int = 0, max_iter: int = 500
) -> PositionPredictor:
    """Train a position table by predicting the token at each position from that position's vector alone.

    Loss: ``sum_i w_i CE(P_i, softmax(W e_i + b))`` (``w`` ``(n,)`` the share of tokens at each position, default
    uniform), minimised over ``e`` ``(n, dim)``, ``W`` ``(V, dim)`` and ``b`` ``(V,)`` with L-BFGS in float64 from a
    seeded random start. The loss is at least the weighted entropy ``sum_i w_i H(P_i)``, with equality exactly when
    ``softmax(W e_i + b) = P_i`` for every ``i``; that is reachable when ``dim`` is at least the affine rank of the
    centred rows ``log P_i - mean(log P_i)`` (``dim >= n - 1`` always suffices), and below that the minimum lies
    above the entropy. At such a minimum two positions with different ``P_i`` need different ``W e_i``, hence
    different ``e_i``: the smallest case of the Positional Separation Theorem. ``distributions`` ``(n, V)`` must
    have full support (a zero probability is reached only in the limit).
    """
    distributions = float_matrix("distributions", distributions)
    if not bool((distributions > 0).all()):
        raise ValueError("distributions must be strictly positive (the minimum is then attained)")
    if float((distributions.sum(dim=1) - 1).abs().max()) > 1e-12:
        raise ValueError("distributions must have rows that sum to 1 (probability vectors)")
    require_int("dim", dim, minimum=1)
    require_int("max_iter", max_iter, minimum=1)
    n, vocab = distributions.shape
    weights = (
        torch.full((n,), 1.0 / n, dtype=FLOAT) if weights is None else require_tensor("weights", weights).to(FLOAT)
    )
    if weights.shape != (n,) or not bool((weights > 0).all()):
        raise ValueError(f"weights must be positive with shape ({n},)")
    weights = weights / weights.sum()
    generator = torch.Generator().manual_seed(seed)
    embeddings = (0.1 * torch.randn(n, dim, generator=generator, dtype=FLOAT)).requires_grad_()
    readout = (0.1 * torch.randn(vocab, dim, generator=generator, dtype=FLOAT)).requires_grad_()
    bias = torch.zeros(vocab, dtype=FLOAT, requires_grad=True)
    optimiser = torch.optim.LBFGS(
        [embeddings, readout, bias],
        lr=1,
        max_iter=max_iter,
        tolerance_grad=1e-13,
        tolerance_change=0,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def loss_fn():
        logits = embeddings @ readout.T + bias
        return -(weights * (distributions * torch.log_softmax(logits, dim=1)).sum(dim=1)).sum()

    def closure():
        optimiser.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    optimiser.step(closure)
    with torch.no_grad():
        loss = float(loss_fn())
    entropy = float(-(weights * torch.special.xlogy(distributions, distributions).sum(dim=1)).sum())
    return PositionPredictor(embeddings.detach(), readout.detach(), bias.detach(), loss, entropy)


def stress(encoding: torch.Tensor, distances: torch.Tensor, return_scale: bool = False):
    """Stress of an encoding ``(n, d)`` (one vector per position) against target distances ``(n, n)``.

    The Euclidean distances between its rows go into :func:`stress_of_distances` (metric ratio stress; see there).
    """
    return stress_of_distances(pairwise_distances(encoding), distances, return_scale)


def toeplitz_projection(distances: torch.Tensor) -> torch.Tensor:
    """The matrix closest to ``distances`` ``(n, n)`` among those that depend only on ``|i - j|``: ``(n, n)``.

    Each diagonal is replaced by its mean (least squares, diagonal kept at 0). Every shift-invariant encoding
    (sinusoidal, RoPE features, ALiBi) has distances of this form, so since that set is a linear space closed
    under scaling, ``stress_of_distances(toeplitz_projection(D), D)`` is a lower bound on the stress of any of them.
    """
    distances = _distance_matrix("distances", distances)
    positions = torch.arange(distances.shape[0], device=distances.device)
    offsets = (positions[:, None] - positions[None, :]).abs()
    sums = torch.zeros(distances.shape[0], dtype=FLOAT, device=distances.device).index_add_(
        0, offsets.reshape(-1), distances.reshape(-1)
    )
    means = sums / torch.bincount(offsets.reshape(-1), minlength=distances.shape[0])
    return means[offsets]


def low_rank_factors(encoding: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best rank-``r`` factorisation ``encoding ~ U @ V`` with ``U`` ``(n, r)`` and ``V`` ``(r, d)`` (truncated SVD).

    It stores ``r (n + d)`` numbers instead of ``n d``; by Eckart-Young no rank-``r`` matrix is closer in
    Frobenius norm. An ``(n, d)`` encoding whose rank is ``r`` is reproduced exactly.
    """
    encoding = float_matrix("encoding", encoding)
    require_int("rank", rank, minimum=1)
    if rank > min(encoding.shape):
        raise ValueError(f"rank must be <= min(n, d) = {min(encoding.shape)}, got {rank}")
    left, singular, right = torch.linalg.svd(encoding, full_matrices=False)
    return left[:, :rank] * singular[:rank], right[:rank]


# controls ---------------------------------------------------------------------------------------------------------
def shuffle_within(sequences: torch.Tensor, lengths: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The no-order null: every sequence of ``sequences`` ``(S, L)`` with its first ``lengths[s]`` tokens shuffled,
    padding left at the end. Same tokens, same sample sizes per position; a position's distribution then depends on
    the position only through which sequences are long enough to reach it. Returns ``(S, L)``."""
    sequences = _integer_tensor("sequences", sequences)
    lengths = _integer_tensor("lengths", lengths)
    if sequences.ndim != 2 or lengths.shape != sequences.shape[:1]:
        raise ValueError(
            f"sequences must be (S, L) and lengths (S,), got {tuple(sequences.shape)} and {tuple(lengths.shape)}"
        )
    require_int("seed", seed)
    keys = torch.rand(sequences.shape, generator=torch.Generator().manual_seed(seed)).to(sequences.device)
    keys[torch.arange(sequences.shape[1], device=sequences.device) >= lengths[:, None]] = 2.0
    return sequences.gather(1, keys.argsort(dim=1))


def split_groups(groups: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two halves of the items ``0 .. S-1`` that never split a group: ``groups`` ``(S,)`` gives each item's group
    (a document, a topic). Groups are shuffled by ``seed``, then each goes to the half with fewer items so far, so
    the halves are about equal. Returns the two index tensors. Items of one group (overlapping windows of one text)
    share tokens; halves that share no group have independent sampling noise."""
    groups = _integer_tensor("groups", groups)
    if groups.ndim != 1:
        raise ValueError(f"groups must have shape (S,), got {tuple(groups.shape)}")
    require_int("seed", seed)
    names, sizes = groups.unique(return_counts=True)
    order = torch.randperm(len(names), generator=torch.Generator().manual_seed(seed))
    first, counts = [], [0, 0]
    for index in order.tolist():
        half = 0 if counts[0] <= counts[1] else 1
        counts[half] += int(sizes[index])
        if half == 0:
            first.append(int(names[index]))
    in_first = torch.isin(groups, torch.tensor(first, dtype=groups.dtype, device=groups.device))
    return torch.nonzero(in_first).flatten(), torch.nonzero(~in_first).flatten()


def _pair_chords(n: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """``(n, n, P)``: ``2 - 2 cos((i - j) theta_p)``, the squared chord of pair ``p`` between positions ``i`` and ``j``,
    computed as ``4 sin^2((i - j) theta_p / 2)``, which does not cancel at small angles."""
    offsets = torch.arange(n, dtype=FLOAT, device=inv_freq.device)
    return 4 * torch.sin((offsets[:, None] - offsets[None, :])[..., None] * inv_freq.to(FLOAT) / 2).square()


def rope_family_distances(n: int, inv_freq: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Distances between ``phi(i) = R(i) u`` for positions ``0 .. n-1``, where ``u`` has squared amplitude
    ``weights[p]`` in rotation pair ``p`` (frequencies ``inv_freq`` ``(P,)``): ``(n, n)`` float64,
    ``||phi(i) - phi(j)||^2 = sum_p weights[p] (2 - 2 cos((i - j) theta_p))``. Equal weights give RoPE's vectors with
    every pair ``(1, 0)``; all weight on the slowest pair gives a chord that is linear in ``|i - j|`` while
    ``n theta_min`` is small (ALiBi's line)."""
    require_int("n", n, minimum=1)
    require_tensor("inv_freq", inv_freq)
    require_tensor("weights", weights)
    if inv_freq.ndim != 1 or weights.shape != inv_freq.shape:
        raise ValueError(
            f"inv_freq and weights must both have shape (P,), got {tuple(inv_freq.shape)} and {tuple(weights.shape)}"
        )
    if bool((weights < 0).any()):
        raise ValueError("weights must be >= 0 (they are squared amplitudes)")
    return (_pair_chords(n, inv_freq) @ weights.to(FLOAT)).clamp_min(0).sqrt()


ROPE_FIT_CRITERIA = ("pearson", "ratio")


def fit_rope_amplitudes(
    distances: torch.Tensor, inv_freq: torch.Tensor, criterion: str = "pearson", max_iter: int = 200
) -> torch.Tensor:
    """The member of the RoPE family (:func:`rope_family_distances`) that fits ``distances`` ``(n, n)`` best: the
    squared amplitudes ``(P,)`` (float64, summing to 1) that maximise the Pearson correlation
    (``criterion="pearson"``, so also minimise affine stress) or minimise ratio stress (``"ratio"``). In a model,
    ``W_q`` and ``W_k`` choose these amplitudes. L-BFGS from equal weights, softplus-parametrised; a local optimum,
    deterministic for a given input."""
    target = _distance_matrix("distances", distances)
    require_tensor("inv_freq", inv_freq)
    if criterion not in ROPE_FIT_CRITERIA:
        raise ValueError(f"criterion must be one of {ROPE_FIT_CRITERIA}, got {criterion!r}")
    require_int("max_iter", max_iter, minimum=1)
    rows, cols = torch.triu_indices(len(target), len(target), 1, device=target.device)
    chords = _pair_chords(len(target), inv_freq)[rows, cols]  # (pairs, P)
    wanted = target[rows, cols]
    raw = torch.zeros(inv_freq.shape[0], dtype=FLOAT, device=target.device, requires_grad=True)
    optimiser = torch.optim.LBFGS([raw], max_iter=max_iter, line_search_fn="strong_wolfe")

    def loss():
        optimiser.zero_grad()
        delta = (chords @ torch.nn.functional.softplus(raw) + 1e-300).sqrt()
        if criterion == "pearson":
            centred, target_centred = delta - delta.mean(), wanted - wanted.mean()
            value = -(centred @ target_centred) / (centred.norm() * target_centred.norm())
        else:  # ratio stress^2 = 1 - cosine^2 at the fitted scale
            value = -((delta @ wanted) / (delta.norm() * wanted.norm())).square()
        value.backward()
        return value

    optimiser.step(loss)
    weights = torch.nn.functional.softplus(raw.detach())
    return weights / weights.sum()


__all__ = [
    "position_token_counts",
    "positional_distributions",
    "hellinger_distances",
    "double_centered_gram",
    "MDSResult",
    "classical_mds",
    "effective_rank",
    "entropy_effective_rank",
    "pairwise_distances",
    "kernel_distances",
    "stress_of_distances",
    "stress",
    "distance_correlation",
    "partial_correlation",
    "affine_stress",
    "isotonic_regression",
    "nonmetric_stress",
    "PositionPredictor",
    "fit_position_predictor",
    "toeplitz_projection",
    "low_rank_factors",
    "shuffle_within",
    "split_groups",
    "rope_family_distances",
    "ROPE_FIT_CRITERIA",
    "fit_rope_amplitudes",
]
