"""A corpus's positions as points: per-position token distributions, their Hellinger distances, the Euclidean
and kernel distances of an encoding, and the corpus nulls (shuffles within a sequence, disjoint halves).

Part of :mod:`posenc.lab.geometry` (which re-exports every public name); float64 on the input's device.
"""

from __future__ import annotations

import torch

from ..._checks import float_matrix, require_int, require_tensor

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
