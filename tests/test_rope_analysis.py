"""RoPE analysis helpers: the long-range bound, per-pair logits, wrapped angle errors, the relative check."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import posenc
from posenc import rope_analysis


def test_upper_bound_matches_a_loop_and_starts_at_p_plus_one_over_two():
    inv_freq, _ = posenc.rope_frequencies(16)
    distances = torch.tensor([0.0, 1.0, 7.5, 40.0, -40.0])
    bound = rope_analysis.relative_upper_bound(distances, inv_freq)
    for value, distance in zip(bound.tolist(), distances.tolist()):
        partial, total = 0j, 0.0
        for theta in inv_freq.double().tolist():
            partial += complex(math.cos(distance * theta), math.sin(distance * theta))
            total += abs(partial)
        assert value == pytest.approx(total / len(inv_freq), rel=1e-12)
    assert bound[0] == pytest.approx((8 + 1) / 2)
    assert bound[3] == pytest.approx(bound[4])  # |S_j| does not see the sign of the distance


def test_upper_bound_decays_for_a_llama_head():
    inv_freq, _ = posenc.rope_frequencies(128)
    bound = rope_analysis.relative_upper_bound(torch.arange(0, 1001), inv_freq)
    assert bound[0] == pytest.approx(32.5)
    assert bound[200:].max() < 0.5 * bound[0]


@settings(max_examples=40, deadline=None)
@given(distance=st.integers(min_value=-3000, max_value=3000), seed=st.integers(0, 10_000))
def test_upper_bound_bounds_the_logit(distance, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 32, generator=generator, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(32)
    logit = rope_analysis.pair_logit_contributions(q, k, [distance], inv_freq).sum()
    h = torch.complex(q[:16], q[16:]).conj() * torch.complex(k[:16], k[16:])
    steps = (torch.cat((h[1:], h.new_zeros(1))) - h).abs().max()  # h_{P} = 0 closes the Abel sum
    bound = rope_analysis.relative_upper_bound([distance], inv_freq)[0]
    assert abs(logit) <= steps * len(inv_freq) * bound + 1e-9


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@settings(max_examples=25, deadline=None)
@given(m=st.integers(-5000, 5000), n=st.integers(-5000, 5000))
def test_pair_contributions_sum_to_the_rope_logit(layout, m, n):
    q, k = torch.randn(2, 24, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(24)
    logit = (
        posenc.rotate(q[None], [m], inv_freq, layout=layout) @ posenc.rotate(k[None], [n], inv_freq, layout=layout).T
    ).item()
    contributions = rope_analysis.pair_logit_contributions(q, k, [m - n], inv_freq, layout)
    assert contributions.shape == (1, 12)
    assert contributions.sum().item() == pytest.approx(logit, abs=1e-3)


def test_unrotated_pairs_contribute_a_constant():
    inv_freq, _ = posenc.rope_frequencies(16, {"rope_type": "proportional", "partial_rotary_factor": 0.5})
    q, k = torch.randn(2, 16, dtype=torch.float64)
    contributions = rope_analysis.pair_logit_contributions(q, k, torch.arange(-50, 50), inv_freq)
    # exact by construction: frequency 0 gives the angle +-0 exactly, cos(0) = 1 and sin(0) = 0 exactly, and
    # multiplying by 1 + 0i changes no bit, so the never-rotated pairs are the same numbers at every distance
    assert torch.equal(contributions[:, 4:], contributions[:1, 4:].expand(100, -1))
    assert contributions[:, :4].std(0).min() > 0


def test_wrapped_angle_error():
    reference = torch.tensor([0.0, 1.0, 3.0, -3.0], dtype=torch.float64)
    # 7 turns: the float64 value of 2 pi is off by 2.4e-16 per turn, plus the rounding of reference + 14 pi
    assert torch.allclose(
        rope_analysis.wrapped_angle_error(reference + 2 * math.pi * 7, reference),
        torch.zeros(4, dtype=torch.float64),
        atol=1e-14,
        rtol=0,
    )
    errors = rope_analysis.wrapped_angle_error(torch.tensor([3.0]), torch.tensor([-3.0]))
    assert errors.item() == pytest.approx(2 * math.pi - 6, rel=1e-15)
    assert float(rope_analysis.wrapped_angle_error(torch.randn(100) * 50, torch.randn(100)).max()) <= math.pi


@settings(max_examples=60, deadline=None)
@given(reference=st.floats(-1e4, 1e4), error=st.floats(-math.pi, math.pi), seed=st.integers(0, 2**16))
def test_small_angle_errors_keep_all_their_digits(reference, error, seed):
    # an error within (-pi, pi] comes back as |fl(angle - reference)| itself, bit for bit: fmod of a number below
    # 2 pi returns it unchanged, and nothing else rounds (shifting by pi and back would keep ~4e-16 absolute only)
    angle = reference + error * 10.0 ** -torch.randint(0, 15, (), generator=torch.Generator().manual_seed(seed)).item()
    a, r = torch.tensor([angle], dtype=torch.float64), torch.tensor([reference], dtype=torch.float64)
    # the premise is about the rounded difference: error = pi can round to just above pi (4093 + pi - 4093),
    # which the function rightly wraps to 2 pi minus it
    assume(float((a - r).abs()) <= math.pi)
    assert torch.equal(rope_analysis.wrapped_angle_error(a, r), (a - r).abs())


@settings(max_examples=60, deadline=None)
@given(angle=st.floats(-1e6, 1e6), reference=st.floats(-1e6, 1e6))
def test_wrapped_angle_error_against_mpmath(angle, reference):
    import mpmath

    with mpmath.workdps(60):
        difference = abs(mpmath.mpf(angle) - mpmath.mpf(reference))  # exact: 60 digits hold both inputs
        turn = 2 * mpmath.pi
        exact = float(min(mpmath.fmod(difference, turn), turn - mpmath.fmod(difference, turn)))
    found = rope_analysis.wrapped_angle_error(
        torch.tensor([angle], dtype=torch.float64), torch.tensor([reference], dtype=torch.float64)
    ).item()
    # two roundings: the difference (half an ulp of |angle - reference| <= 2e6), and 2 pi in float64
    # (2.45e-16 per turn, at most 2e6 / 2 pi turns); the result itself is exact given those
    turns = abs(angle - reference) / (2 * math.pi)
    assert abs(found - exact) <= math.ulp(abs(angle - reference)) + 2.5e-16 * (turns + 1)


def test_offset_spread_is_zero_exactly_for_functions_of_the_offset():
    positions = torch.arange(12)
    toeplitz = torch.cos(0.3 * (positions[:, None] - positions[None, :]).double())
    # equal offsets give the same cosine argument, bit for bit; the cosine itself may take a vectorised or a
    # scalar path by the element's place in memory, which can differ by an ulp each (values <= 1: 2.2e-16)
    assert rope_analysis.max_offset_spread(toeplitz, positions, positions) <= 4.5e-16
    absolute = toeplitz + 0.01 * positions[:, None].double()  # offset 0 appears at rows 0 .. 11
    assert rope_analysis.max_offset_spread(absolute, positions, positions) == pytest.approx(0.11, rel=1e-9)
    grid = posenc.nd_rope.grid_positions(3, 3)
    assert rope_analysis.max_offset_spread(torch.zeros(9, 9), grid, grid) == 0.0  # 0 - 0: no rounding at all
    with pytest.raises(ValueError, match="scores"):
        rope_analysis.max_offset_spread(torch.zeros(3, 4), positions[:3], positions[:3])


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="inv_freq"):
        rope_analysis.relative_upper_bound([1.0], torch.ones(2, 2))
    with pytest.raises(ValueError, match="q and k"):
        rope_analysis.pair_logit_contributions(torch.randn(8), torch.randn(8), [0], torch.ones(3))
    with pytest.raises(TypeError, match="distances"):
        rope_analysis.relative_upper_bound(torch.ones(2, dtype=torch.bool), torch.ones(2))


# Abramowitz & Stegun, table 5.1 and the series at small x (Ci(x) = gamma + ln x - x^2/4 + x^4/96 - ...)
CI_TABLE = {
    0.5: -0.177784078806612,
    1.0: 0.337403922900968,
    2.0: 0.422980828774865,
    5.0: -0.190029749656644,
    10.0: -0.045456433004455,
}


def test_cosine_integral_matches_tabulated_values_and_its_series():
    x = torch.tensor(list(CI_TABLE), dtype=torch.float64)
    assert torch.allclose(
        rope_analysis.cosine_integral(x), torch.tensor(list(CI_TABLE.values()), dtype=torch.float64), rtol=0, atol=1e-10
    )
    for value, expected in CI_TABLE.items():  # a Python number gives the same float64 result
        assert abs(rope_analysis.cosine_integral(value).item() - expected) < 1e-10
    small = 1e-3
    series = 0.5772156649015329 + math.log(small) - small**2 / 4 + small**4 / 96
    assert abs(rope_analysis.cosine_integral(small).item() - series) < 1e-12
    zero = 0.6165054856207162  # the first zero of Ci
    assert abs(rope_analysis.cosine_integral(zero).item()) < 1e-10


def test_cosine_integral_matches_scipy_over_nine_decades():
    special = pytest.importorskip("scipy.special")
    x = torch.cat((torch.logspace(-3, 6, 3001, dtype=torch.float64), torch.tensor([4.0, 4.0 + 1e-12])))
    expected = torch.from_numpy(special.sici(x.numpy())[1])
    assert (rope_analysis.cosine_integral(x) - expected).abs().max() < 1e-13  # both sides of the switch at 4
    assert rope_analysis.cosine_integral(x[:301].reshape(7, 43)).shape == (7, 43)


def test_cosine_integral_of_many_large_arguments_needs_memory_like_its_input():
    x = torch.arange(1, 300_001, dtype=torch.float64)  # chapter 6's Ci(Delta) over 4 lambda_max of a 128-dim head
    ci = rope_analysis.cosine_integral(x)
    # the asymptotic form sin x / x - cos x / x^2: the next terms, -2 sin x / x^3 + 6 cos x / x^4, stay within 3 / x^3
    far = x >= 100
    asymptotic = x.sin() / x - x.cos() / x**2
    assert ((ci - asymptotic)[far].abs() <= 3 / x[far] ** 3).all()


def test_cosine_integral_bad_input():
    for bad in (0.0, -1.0, torch.tensor([1.0, 0.0])):
        with pytest.raises(ValueError, match="x must be positive"):
            rope_analysis.cosine_integral(bad)
    for bad in (True, "1", [1.0]):
        with pytest.raises(TypeError, match="x must be"):
            rope_analysis.cosine_integral(bad)
