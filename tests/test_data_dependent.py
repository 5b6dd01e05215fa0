"""CoPE, FoX and PaTH (posenc.data_dependent) against slow loops over positions, the axioms they give up, and the
"content" kind of the plug-in protocol."""

import math
from dataclasses import replace

import pytest
import torch

import posenc
from posenc import data_dependent as dd
from posenc.lab import experiments as ex
from posenc.lab import tasks as order_tasks

B, H, L, D, WIDTH = 2, 2, 6, 4, 5
CAUSAL = torch.ones(L, L, dtype=torch.bool).tril()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _data(seed=0, dtype=torch.float64):
    g = _gen(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    hidden = torch.randn(B, L, WIDTH, generator=g, dtype=dtype)
    return q, k, v, hidden


def _cope(seed=1, max_positions=4):
    """max_positions = 4 < L: the clamp at P - 1 is exercised."""
    return dd.CoPE(D, max_positions=max_positions, init_scale=1.0, generator=_gen(seed)).double()


def _cope_unclamped():
    return _cope(max_positions=L + 1)  # p_ij <= L: never clamped, so every gate counts


def _fox():
    torch.manual_seed(2)
    return dd.FoX(WIDTH, H, bias=1.0).double()


def _path():
    torch.manual_seed(3)
    return dd.PaTH(WIDTH, H, D).double()


# slow definitions: loops over positions ----------------------------------------------------------------------
def slow_cope(enc, q, k, causal=True):
    e = enc.embeddings.detach()
    out = torch.full((B, H, L, L), float("nan"), dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                keys = range(i + 1) if causal else range(L)
                gates = {t: torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(D)) for t in keys}
                for j in keys:
                    p = sum(gates[t] for t in keys if t >= j).clamp(max=enc.max_positions - 1)
                    low = int(math.floor(p.item()))
                    high = min(low + 1, enc.max_positions - 1)
                    e_p = e[low] + (p - low) * (e[high] - e[low])  # linear interpolation between integers
                    out[b, h, i, j] = q[b, h, i] @ k[b, h, j] / math.sqrt(D) + q[b, h, i] @ e_p
    return out


def slow_fox(enc, q, k, hidden):
    out = torch.full((B, H, L, L), float("nan"), dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                for j in range(i + 1):
                    bias = sum(
                        (
                            torch.log(torch.sigmoid(enc.gate_weight[h] @ hidden[b, l] + enc.gate_bias[h]))
                            for l in range(j + 1, i + 1)
                        ),
                        torch.tensor(0.0, dtype=q.dtype),
                    )
                    out[b, h, i, j] = q[b, h, i] @ k[b, h, j] / math.sqrt(D) + bias
    return out.detach()


def _path_conv(width=3):
    torch.manual_seed(5)
    return dd.PaTH(WIDTH, H, D, short_conv=width).double()


def slow_w(enc, hidden):
    """w_t before normalisation, (B, L, H, D): W_w x_t, or with the short convolution of width K,
    silu(sum_{s < K, s <= t} c_s W_w x_{t-s}) per channel, c_s = conv_weight[:, 0, K - 1 - s]."""
    projected = hidden @ enc.w_weight.T  # (B, L, H * D)
    if not enc.short_conv:
        return projected.view(B, L, H, D)
    out = torch.zeros_like(projected)
    for t in range(L):
        for s in range(min(enc.short_conv, t + 1)):
            out[:, t] += enc.conv_weight[:, 0, enc.short_conv - 1 - s] * projected[:, t - s]
    return torch.nn.functional.silu(out).view(B, L, H, D)


def slow_path(enc, q, k, hidden):
    out = torch.full((B, H, L, L), float("nan"), dtype=q.dtype)
    w_all = slow_w(enc, hidden)
    beta_all = 2 * torch.sigmoid(hidden @ enc.beta_weight.T + enc.beta_bias)  # (B, L, H)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                for j in range(i + 1):
                    m = torch.eye(D, dtype=q.dtype)
                    for t in range(j + 1, i + 1):  # M = H_i ... H_{j+1}: H_t multiplies on the left
                        w = w_all[b, t, h] / w_all[b, t, h].norm()
                        m = (torch.eye(D, dtype=q.dtype) - beta_all[b, t, h] * torch.outer(w, w)) @ m
                    out[b, h, i, j] = q[b, h, i] @ m @ k[b, h, j] / math.sqrt(D)
    return out.detach()


def _lower(x):
    return x[..., CAUSAL]


# against the definitions ---------------------------------------------------------------------------------------
def test_cope_matches_its_definition():
    q, k, _, _ = _data()
    enc = _cope()
    got = enc.content_logits(q, k, allowed=CAUSAL).detach()
    assert torch.allclose(_lower(got), _lower(slow_cope(enc, q, k)), atol=1e-12)  # float64, sums of <= 6 terms
    # bidirectional: p_ij sums the gates of every key t >= j
    got = enc.content_logits(q, k).detach()
    assert torch.allclose(got, slow_cope(enc, q, k, causal=False), atol=1e-12)


def test_cope_matches_the_authors_formula():
    """The reference code's steps (RAM/projects/cope): gates from the scaled, masked logits, reverse cumsum, clamp,
    gather at ceil and floor, weight p - floor; the position term unscaled (its ``--cope-nodiv``, the paper's)."""
    q, k, _, _ = _data(5)
    enc = _cope(6)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(D) + torch.zeros(L, L, dtype=q.dtype).masked_fill(~CAUSAL, -math.inf)
    pos = torch.sigmoid(logits).flip(-1).cumsum(-1).flip(-1).clamp(max=enc.max_positions - 1)
    per_integer = q @ enc.embeddings.detach().T
    weight = pos - pos.floor()
    expected = (
        logits
        + per_integer.gather(-1, pos.ceil().long()) * weight
        + per_integer.gather(-1, pos.floor().long()) * (1 - weight)
    )
    got = enc.content_logits(q, k, allowed=CAUSAL).detach()
    assert torch.allclose(_lower(got), _lower(expected), atol=1e-12)


def test_fox_matches_its_definition_and_the_cumsum_formula():
    q, k, _, hidden = _data(1)
    enc = _fox()
    got = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    assert torch.allclose(_lower(got), _lower(slow_fox(enc, q, k, hidden)), atol=1e-12)
    # the authors' kernel: log_lambda = cumsum(log f); bias = log_lambda_i - log_lambda_j
    log_lambda = torch.nn.functional.logsigmoid(hidden @ enc.gate_weight.T + enc.gate_bias).transpose(1, 2).cumsum(-1)
    bias = (log_lambda[..., :, None] - log_lambda[..., None, :]).detach()
    assert torch.allclose(_lower(enc.bias(hidden).detach()), _lower(bias), atol=1e-12)


def test_path_matches_its_definition():
    q, k, _, hidden = _data(2)
    enc = _path()
    got = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    assert torch.allclose(_lower(got), _lower(slow_path(enc, q, k, hidden)), atol=1e-12)
    w, beta = enc.householder_parameters(hidden)
    assert torch.allclose(w.norm(dim=-1), torch.ones(B, H, L, dtype=w.dtype))
    assert bool(((beta > 0) & (beta < 2)).all())


def test_path_short_conv_matches_its_definition_and_is_causal():
    """The authors' layer (short_conv=3): w_t from tokens t-2..t through a causal depthwise convolution and SiLU;
    the Householder transport as before. Changing the tokens after t leaves w and beta up to t, and every logit of
    a query <= t, unchanged."""
    q, k, _, hidden = _data(2)
    enc = _path_conv()
    assert enc.conv_weight.shape == (H * D, 1, 3)
    got = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    assert got.shape == (B, H, L, L)
    assert torch.allclose(_lower(got), _lower(slow_path(enc, q, k, hidden)), atol=1e-12)
    w, beta = enc.householder_parameters(hidden)
    assert w.shape == (B, H, L, D) and beta.shape == (B, H, L)
    assert torch.allclose(w.norm(dim=-1), torch.ones(B, H, L, dtype=w.dtype))
    for t in range(L - 1):
        later = hidden.clone()
        later[:, t + 1 :] = torch.randn(B, L - t - 1, WIDTH, generator=_gen(t), dtype=hidden.dtype)
        w2, beta2 = enc.householder_parameters(later)
        assert torch.equal(w2[:, :, : t + 1], w[:, :, : t + 1]) and torch.equal(
            beta2[:, :, : t + 1], beta[:, :, : t + 1]
        )
        assert not torch.allclose(w2[:, :, t + 1], w[:, :, t + 1])
        rows = enc.content_logits(q, k, hidden=later, allowed=CAUSAL).detach()[..., : t + 1, : t + 1]
        assert torch.equal(rows, got[..., : t + 1, : t + 1])
    # w_t reads exactly the last 3 tokens: changing token t - 3 leaves w_t unchanged, token t - 2 changes it
    earlier = hidden.clone()
    earlier[:, 1] += 1.0
    w3, _ = enc.householder_parameters(earlier)
    assert torch.equal(w3[:, :, 4:], w[:, :, 4:]) and not torch.allclose(w3[:, :, 3], w[:, :, 3])
    with pytest.raises(ValueError, match="short_conv"):
        dd.PaTH(WIDTH, H, D, short_conv=-1)


def _logits_before_and_after_prepending(enc, extra=3):
    """The causal logits (B, H, L, L) of a sequence, and of the same tokens after ``extra`` others (the pairs of the
    shifted tokens)."""
    q, k, _, hidden = _data(17)
    g = _gen(18)
    q2, k2 = (torch.cat([torch.randn(B, H, extra, D, generator=g, dtype=q.dtype), t], 2) for t in (q, k))
    hidden2 = torch.cat([torch.randn(B, extra, WIDTH, generator=g, dtype=q.dtype), hidden], 1)
    causal2 = torch.ones(L + extra, L + extra, dtype=torch.bool).tril()
    logits = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    return logits, enc.content_logits(q2, k2, hidden=hidden2, allowed=causal2).detach()[..., extra:, extra:]


def test_path_short_conv_is_translation_invariant_except_at_the_first_key():
    """With the short convolution, w_{j+1} reads token j - 1, before the key j; at the start it reads the zero
    padding. Prepending tokens therefore changes the logits whose key is the first token, and no other."""
    enc = _path_conv()
    logits, shifted = _logits_before_and_after_prepending(enc)
    later = CAUSAL.clone()
    later[:, 0] = False
    assert (shifted - logits)[..., later].abs().max().item() < 1e-12
    assert (shifted - logits)[..., 1:, 0].abs().min().item() > 1e-6
    assert torch.allclose(shifted[..., 0, 0], logits[..., 0, 0], atol=1e-12)  # offset 0: the empty product, q . k


@pytest.mark.parametrize("make", [_cope, _fox, _path], ids=["cope", "fox", "path"])
def test_attention_and_self_attention_use_the_content_logits(make):
    q, k, v, hidden = _data(3)
    enc = make()
    out, weights = posenc.attention(q, k, v, encoding=enc, causal=True, hidden=hidden, return_weights=True)
    logits = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).masked_fill(~CAUSAL, -math.inf)
    assert torch.allclose(weights, torch.softmax(logits, -1))
    assert torch.allclose(out, torch.softmax(logits, -1) @ v)
    # queries as the last Lq keys (a KV cache): the rows of the full matrix
    _, part = posenc.attention(q[:, :, -2:], k, v, encoding=enc, causal=True, hidden=hidden, return_weights=True)
    assert torch.allclose(part, weights[:, :, -2:], atol=1e-12)
    # self_attention hands x to the encoding as the hidden states
    torch.manual_seed(4)
    x = torch.randn(B, L, WIDTH, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(H * D, WIDTH, dtype=torch.float64) for _ in range(3))
    _, self_weights = posenc.self_attention(x, w_q, w_k, w_v, H, encoding=enc, causal=True, return_weights=True)
    qs, ks, vs = (posenc.split_heads(x @ w.T, H) for w in (w_q, w_k, w_v))
    _, direct = posenc.attention(qs, ks, vs, encoding=enc, causal=True, hidden=x, return_weights=True)
    assert torch.equal(self_weights, direct)


# data dependence, translation invariance and the other axioms ----------------------------------------------------
@pytest.mark.parametrize("make", [_cope_unclamped, _fox, _path], ids=["cope", "fox", "path"])
def test_logit_depends_on_the_tokens_between(make):
    """Data dependence: two sequences, one pair (query 5, key 1) with the same q and k at the same offset, the tokens
    between them different: different logits. A function of the positions alone would give the same."""
    q, k, _, hidden = _data(7)
    enc = make()
    q2, k2, hidden2 = q.clone(), k.clone(), hidden.clone()
    k2[:, :, 2:5] = torch.randn(B, H, 3, D, generator=_gen(8), dtype=q.dtype)  # the tokens between them
    hidden2[:, 2:5] = torch.randn(B, 3, WIDTH, generator=_gen(9), dtype=q.dtype)
    first = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL)[..., 5, 1]
    second = enc.content_logits(q2, k2, hidden=hidden2, allowed=CAUSAL)[..., 5, 1]
    assert (first - second).abs().min().item() > 1e-6
    assert dd.AXIOMS[type(enc).__name__]["data independence"] is False


@pytest.mark.parametrize("make", [_cope, _cope_unclamped, _fox, _path], ids=["cope", "cope-unclamped", "fox", "path"])
def test_prepending_tokens_leaves_every_logit_unchanged(make):
    """Translation invariance: the same tokens shifted by 3 (three other tokens prepended) give the same logit for
    every causal pair of the shifted tokens; the gates, clocks and products run from the key to the query only."""
    enc = make()
    logits, shifted = _logits_before_and_after_prepending(enc)
    # float64: the same sums and products of at most L terms, perhaps in another order
    assert (_lower(shifted) - _lower(logits)).abs().max().item() < 1e-12
    assert dd.AXIOMS[type(enc).__name__]["translation invariance"] is True


@pytest.mark.parametrize("make", [_cope, _fox, _path], ids=["cope", "fox", "path"])
def test_normalisation_and_linearity(make):
    """Normalisation: at offset 0 the logit is q . k / sqrt(D). Linearity (a bilinear form, plus a term free of k):
    the logit is affine in k, so its second difference along k vanishes."""
    q, k, _, hidden = _data(10)
    enc = make()
    axioms = dd.AXIOMS[type(enc).__name__]

    def logits(keys):
        return enc.content_logits(q, keys, hidden=hidden, allowed=CAUSAL).detach()

    diagonal = torch.diagonal(logits(k), dim1=-2, dim2=-1)
    plain = (q * k).sum(-1) / math.sqrt(D)
    assert torch.allclose(diagonal, plain, atol=1e-12) is axioms["normalisation"]
    second_difference = _lower(logits(2 * k) - 2 * logits(k) + logits(0 * k))
    assert (second_difference.abs().max().item() < 1e-12) is axioms["linearity"]


def test_fox_is_alibi_on_a_learned_clock():
    """FoX is a function of the offset alone in the clock tau_t = -sum_{u <= t} log f_u: its bias is -(tau_i -
    tau_j)."""
    _, _, _, hidden = _data(11)
    enc = _fox()
    tau = -enc.log_forget_gates(hidden).cumsum(-1)
    assert torch.allclose(_lower(enc.bias(hidden)), _lower(-(tau[..., :, None] - tau[..., None, :])), atol=1e-12)
    assert bool((tau.diff(dim=-1) > 0).all())  # the clock only moves forward: log f < 0
    assert dd.AXIOMS["FoX"]["translation invariance"] is True
    assert torch.equal(enc.clock(hidden), tau)


def test_fox_is_the_unipotent_alibi_block_at_learned_times():
    """Chapter 8's ALiBi as a group encoding, exp(tN) with N = [[0, 1], [0, 0]] and the constant vectors of
    alibi_vectors(slope 1), read at the real times tau of FoX's clock, gives FoX's bias (GRAPE's additive form)."""
    _, _, _, hidden = _data(16)
    enc = _fox()
    tau, bias = enc.clock(hidden).detach(), enc.bias(hidden).detach()
    group = posenc.GroupEncoding(posenc.generators.alibi_generator(torch.float64))
    q_bar, k_bar = posenc.generators.alibi_vectors(torch.ones(1, dtype=torch.float64))
    for b in range(B):
        for h in range(H):
            q, k = group.encode_qk(q_bar.expand(1, 1, L, 2), k_bar[0].expand(1, 1, L, 2), tau[b, h], tau[b, h])
            assert torch.allclose((q @ k.transpose(-1, -2))[0, 0][CAUSAL], bias[b, h][CAUSAL], atol=1e-12)


def test_path_maps_are_not_a_one_parameter_group():
    """PaTH's factors I - beta w w^T do not commute (so the product is path-ordered, not exp(tX)), and a factor with
    beta = 1 is singular (det = 1 - beta): linearity's invertibility holds only for beta != 1."""
    g = _gen(12)
    w1, w2 = (torch.nn.functional.normalize(torch.randn(D, generator=g, dtype=torch.float64), dim=0) for _ in range(2))

    def factor(w, beta):
        return torch.eye(D, dtype=torch.float64) - beta * torch.outer(w, w)

    a, b = factor(w1, 0.7), factor(w2, 1.6)
    assert (a @ b - b @ a).norm().item() > 1e-3
    for beta in (0.5, 1.0, 1.5, 2.0):
        assert torch.linalg.det(factor(w1, beta)).item() == pytest.approx(1 - beta, abs=1e-12)


def test_content_encodings_refuse_bad_input():
    q, k, v, hidden = _data(13)
    with pytest.raises(ValueError, match="hidden"):
        posenc.attention(q, k, v, encoding=_fox(), causal=True)
    with pytest.raises(ValueError, match="causal"):
        posenc.attention(q, k, v, encoding=_path(), hidden=hidden)
    with pytest.raises(ValueError, match="hidden"):
        posenc.attention(q, k, v, encoding=_path(), causal=True, hidden=hidden[:, :3])
    with pytest.raises(ValueError, match="head dimension"):
        dd.CoPE(D + 2, 4).content_logits(q, k)
    with pytest.raises(ValueError, match="max_positions"):
        dd.CoPE(D, 1)
    with pytest.raises(TypeError, match="d_model"):
        dd.FoX(4.0, 2)
    assert "content" in posenc.KINDS


TINY = ex.ExperimentConfig(
    vocab_size=8,
    train_length=6,
    length_factors=(1, 2),
    d_model=8,
    n_heads=2,
    n_layers=1,
    d_mlp=8,
    steps=3,
    batch_size=4,
    warmup_steps=1,
    eval_batch_size=4,
    eval_tokens=24,
    seeds=(0, 1),
)


def test_the_stack_computes_what_each_content_model_computes():
    """The Ensemble runs the content encodings per model (vmap) beside a parameter-free one: the same logits and
    weights as each TinyTransformer alone."""
    names = ["cope", "fox", "path", "alibi"]
    ensemble = ex.Ensemble(names, TINY)
    assert [stop - start for start, stop, _, _ in ensemble.groups] == [2] * len(names)
    tokens = torch.randint(TINY.vocab_size, (len(ensemble), 2, 7), generator=_gen(15))
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(ensemble.models)])
    logits, weights = ensemble.logits(tokens, return_weights=True)
    # float32: the stacked matrix products may add in another order
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)
    assert torch.allclose(logits, alone, atol=1e-5)
    reference = [model(tokens[i], return_weights=True)[1][-1] for i, model in enumerate(ensemble.models)]
    assert torch.allclose(weights[-1], torch.stack(reference), atol=1e-5)
    assert ex.encoding_label("path") == "PaTH" and "cope" not in ex.ENCODINGS  # chapter 11's table is unchanged


def test_content_encodings_train_in_the_harness():
    config = replace(TINY, seeds=(0,))
    runs = ex.run_plan([(order_tasks.CopyAfterMarker(k=1), name) for name in ("cope", "fox", "path")], config)
    assert [run.encoding for run in runs] == ["cope", "fox", "path"]
    for run in runs:
        assert all(math.isfinite(loss) for loss in run.losses)
        assert set(run.accuracy) == set(TINY.eval_lengths)
    trained = {run.encoding: run.model.encoding for run in runs if run.seed == 0}
    assert trained["cope"].embeddings.abs().sum().item() > 0  # the zero-initialised embeddings were trained


@pytest.mark.parametrize("make", [_cope, _fox, _path], ids=["cope", "fox", "path"])
def test_content_encodings_train_in_float32(make):
    q, k, v, hidden = (t.float() for t in _data(14))
    enc = make().float()
    out = posenc.attention(q, k, v, encoding=enc, causal=True, hidden=hidden)
    assert out.dtype == torch.float32
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())


@pytest.mark.parametrize("make", [_cope_unclamped, _fox, _path], ids=["cope", "fox", "path"])
def test_with_constant_content_the_logit_is_a_function_of_the_offset(make):
    """The control: when every token is the same (one q, one k, one hidden state), each encoding's logit depends on
    the offset alone (CoPE: position g (i - j + 1); FoX: ALiBi with slope -log f; PaTH: H^(i - j)), so the
    dependence on more than the offset comes from the content."""
    q, k, _, hidden = _data(17)
    q, k, hidden = q[:, :, :1].expand(-1, -1, L, -1), k[:, :, :1].expand(-1, -1, L, -1), hidden[:, :1].expand(-1, L, -1)
    logits = make().content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    for offset in range(L):
        diagonal = torch.diagonal(logits, offset=-offset, dim1=-2, dim2=-1)  # (B, H, L - offset): pairs i - j = offset
        assert torch.allclose(diagonal, diagonal[..., :1].expand_as(diagonal), atol=1e-12)


@pytest.mark.parametrize("make", [_cope_unclamped, _fox, _path], ids=["cope", "fox", "path"])
def test_bfloat16_inputs_get_float32_gates(make):
    """bf16 queries, keys and hidden states: the logits come back in bf16, equal to the float32 computation on the same
    (bf16-rounded) inputs up to one bf16 rounding of the result (relative 2^-8)."""
    q, k, _, hidden = (t.to(torch.bfloat16) for t in _data(18))
    enc = make().float()
    low = enc.content_logits(q, k, hidden=hidden, allowed=CAUSAL).detach()
    high = enc.content_logits(q.float(), k.float(), hidden=hidden.float(), allowed=CAUSAL).detach()
    assert low.dtype == torch.bfloat16
    assert torch.allclose(_lower(low.float()), _lower(high), rtol=2**-8, atol=1e-6)
