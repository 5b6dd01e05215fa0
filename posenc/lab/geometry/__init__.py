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

Everything is computed in float64 on the device of the input, with no Python loop over positions or pairs. The
code lives in three modules, re-exported here: :mod:`.distances` (steps 1, 2, the encodings' distances and the
corpus nulls), :mod:`.embedding` (steps 3, 6, and a learned position predictor) and :mod:`.fit` (steps 4, 5 and
the RoPE family).
"""

from .distances import (
    hellinger_distances,
    kernel_distances,
    pairwise_distances,
    position_token_counts,
    positional_distributions,
    shuffle_within,
    split_groups,
)
from .embedding import (
    MDSResult,
    PositionPredictor,
    classical_mds,
    double_centered_gram,
    effective_rank,
    entropy_effective_rank,
    fit_position_predictor,
    low_rank_factors,
)
from .fit import (
    ROPE_FIT_CRITERIA,
    affine_stress,
    distance_correlation,
    fit_rope_amplitudes,
    isotonic_regression,
    nonmetric_stress,
    nonnegative_least_squares,
    partial_correlation,
    rope_family_distances,
    stress,
    stress_of_distances,
    toeplitz_projection,
)

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
    "nonnegative_least_squares",
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
