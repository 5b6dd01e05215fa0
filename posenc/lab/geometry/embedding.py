"""Points from distances and their dimension: classical MDS, effective ranks, low-rank factors, and a learned
position predictor whose embeddings the corpus itself fits.

Part of :mod:`posenc.lab.geometry` (which re-exports every public name); float64 on the input's device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..._checks import float_matrix, require_int, require_tensor
from .distances import FLOAT, _distance_matrix


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
