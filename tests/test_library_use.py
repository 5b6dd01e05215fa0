"""posenc as a library in someone else's model (issue 24): dtypes, shapes, compile and export, packaging."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.alibi import ALiBi
from posenc.group_encodings import GroupEncoding
from posenc.nd_rope import NDRoPE


# ------------------------------------------------------------------------------------------ float32 tables
@pytest.mark.parametrize("cast", ["to_bf16", "half", "bfloat16", "double"])
@pytest.mark.parametrize("rope_type", ["default", "linear", "yarn"])
def test_cast_module_keeps_float32_frequencies(cast, rope_type):
    params = None if rope_type == "default" else {"rope_type": rope_type, "factor": 4.0}
    reference = posenc.RotaryEmbedding(64, params)
    module = posenc.RotaryEmbedding(64, params)
    module = {
        "to_bf16": lambda m: m.to(torch.bfloat16),
        "half": lambda m: m.half(),
        "bfloat16": lambda m: m.bfloat16(),
        "double": lambda m: m.double(),
    }[cast](module)
    assert module.inv_freq.dtype == torch.float32
    assert torch.equal(module.inv_freq, reference.inv_freq)
    positions = torch.tensor([0, 1, 7, 8_000, 65_535, 100_000])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q = torch.randn(2, 3, len(positions), 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        out, _ = module(q, q, positions)
        expected, _ = reference(q, q, positions)
        assert out.dtype == dtype
        # same float32 tables, same arithmetic: equal bit for bit, at every position up to 100,000
        assert torch.equal(out, expected)


def test_cast_bf16_frequencies_would_be_wrong():
    """The control: a bf16-rounded inv_freq moves the rotated queries at position 8,000 by more than 1."""
    module = posenc.RotaryEmbedding(64)
    q = torch.randn(1, 1, 1, 64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([8_000])
    good = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq))
    bad = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq.bfloat16().float()))
    assert (good - bad).abs().max() > 1


def test_cast_other_encodings_keep_their_tables():
    alibi, nd = ALiBi(8), NDRoPE(16, variant="axial")
    group = GroupEncoding(posenc.generators.rope_generator(8))
    before = [alibi.slopes.clone(), nd.weights.clone(), group.generator.clone()]
    for module in (alibi, nd, group):
        module.to(torch.bfloat16)
    after = [alibi.slopes, nd.weights, group.generator]
    for b, a in zip(before, after):
        assert a.dtype == b.dtype and torch.equal(a, b)
    learnable = NDRoPE(16, variant="mixed")  # a Parameter follows the model's dtype, as any weight does
    assert learnable.half().weights.dtype == torch.float16


def test_cast_module_moves_device_and_loads_state():
    module = posenc.RotaryEmbedding(32).to("meta", torch.bfloat16)
    assert module.inv_freq.device.type == "meta" and module.inv_freq.dtype == torch.float32


# ------------------------------------------------------------------------------------------ shapes: seq_dim
def _sequence_first(t):
    return t.transpose(1, 2).contiguous()  # (B, H, T, D) -> (B, T, H, D)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
@pytest.mark.parametrize("batched", [False, True])
def test_seq_dim_minus_3_is_the_transposed_rotation(layout, rotary_fraction, batched):
    """(B, T, H, D) with seq_dim=-3 equals the (B, H, T, D) rotation transposed, bit for bit: the same
    elementwise arithmetic on the same numbers, only the memory order differs."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 7, 32, generator=generator)
    inv_freq, _ = posenc.rope_frequencies(32, {"partial_rotary_factor": rotary_fraction})
    positions = torch.stack((torch.arange(7), torch.arange(7) + 40)) if batched else torch.arange(7) + 5
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    expected = posenc.apply_rope(q, cos, sin, layout)
    sequence_first = _sequence_first(q)
    assert torch.equal(posenc.apply_rope(sequence_first, cos, sin, layout, seq_dim=-3), _sequence_first(expected))
    assert torch.equal(posenc.apply_rope(sequence_first, cos, sin, layout, seq_dim=1), _sequence_first(expected))
    assert torch.equal(
        posenc.rotate(sequence_first, positions, inv_freq, layout=layout, seq_dim=-3),
        _sequence_first(posenc.rotate(q, positions, inv_freq, layout=layout)),
    )
    in_place = sequence_first.clone()
    assert posenc.apply_rope_(in_place, cos, sin, layout, seq_dim=-3) is in_place
    assert torch.equal(in_place, _sequence_first(expected))


@pytest.mark.parametrize("shape", [(2, 3, 7, 32), (1, 4, 600, 64)])  # the formula and the blocked kernel
def test_seq_dim_minus_3_gradients_and_module(shape):
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    k = torch.randn(shape[0], 1, *shape[2:], generator=torch.Generator().manual_seed(3))  # one KV head (GQA)
    module = posenc.RotaryEmbedding(shape[-1])
    sequence_first = posenc.RotaryEmbedding(shape[-1], seq_dim=-3)
    expected = module(q, k, offset=4)
    leaves = [_sequence_first(t).requires_grad_() for t in (q, k)]
    out = sequence_first(*leaves, offset=4)
    for o, e in zip(out, expected):
        assert torch.equal(o, _sequence_first(e))
    assert torch.equal(module(_sequence_first(q), _sequence_first(k), offset=4, seq_dim=-3)[0], out[0])
    grads = torch.autograd.grad(sum((o * o.detach()).sum() for o in out), leaves)
    # the gradient of a rotation applied to the rotated output is the input back (to float32 rounding)
    for grad, leaf in zip(grads, leaves):
        assert torch.allclose(grad, leaf.detach(), atol=1e-5)


def test_the_issue_example_is_refused_or_right():
    """RotaryEmbedding(16) on (1, 8, 2, 16) meant as (B, T, H, D): with seq_dim=-3 every head rotates at every
    token; given 8 positions without seq_dim, the error names both axes."""
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 8, 2, 16, generator=torch.Generator().manual_seed(4))
    qr, _ = r(q, q, seq_dim=-3)
    expected, _ = r(q.transpose(1, 2), q.transpose(1, 2))
    assert torch.equal(qr, expected.transpose(1, 2))
    assert not torch.equal(qr[:, 1:, 0], q[:, 1:, 0])  # head 0 rotates at tokens 1..7
    with pytest.raises(
        ValueError,
        match=r"sequence length 2 on axis seq_dim=-2.*axis -3 of q has length 8.*"
        r"seq_dim=-3",
    ):
        r(q, q, positions=torch.arange(8))
    with pytest.raises(ValueError, match=r"axis -3 of x has length 8.*seq_dim=-3"):
        posenc.apply_rope(q, *posenc.rope_cos_sin(torch.arange(8), r.inv_freq))


def test_ambiguous_axes_are_refused_until_seq_dim_is_given():
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 8, 8, 16)
    with pytest.raises(ValueError, match=r"ambiguous.*axis -2 and axis -3.*seq_dim=-2.*seq_dim=-3"):
        r(q, q)
    cos, sin = posenc.rope_cos_sin(torch.arange(8), r.inv_freq)
    with pytest.raises(ValueError, match="ambiguous"):
        posenc.apply_rope(q, cos, sin)
    heads_first = posenc.apply_rope(q, cos, sin, seq_dim=-2)
    assert torch.equal(r(q, q, seq_dim=-2)[0], heads_first)
    assert torch.equal(posenc.RotaryEmbedding(16, seq_dim=-2)(q, q)[0], heads_first)
    assert torch.equal(posenc.apply_rope(q, cos[None, None], sin[None, None]), heads_first)  # aligned: explicit
    # a single position is never ambiguous (both readings rotate by the same angle)
    assert r(torch.randn(2, 1, 1, 16), torch.randn(2, 1, 1, 16), offset=9)[0].shape == (2, 1, 1, 16)


def test_gqa_in_the_wrong_layout_names_the_axis():
    r = posenc.RotaryEmbedding(16)
    q, k = torch.randn(1, 5, 4, 16), torch.randn(1, 5, 2, 16)  # (B, T, H, D) with 4 query and 2 key heads
    with pytest.raises(ValueError, match=r"same length on the sequence axis seq_dim=-2.*agree on axis -3.*seq_dim=-3"):
        r(q, k)
    assert r(q, k, seq_dim=-3)[1].shape == k.shape


def test_batched_positions_must_match_the_batch():
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(2, 3, 5, 16)
    with pytest.raises(ValueError, match="batch size 3 .* batch size 2"):
        r(q, q, positions=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="seq_dim must be -2"):
        posenc.apply_rope(q, *posenc.rope_cos_sin(torch.arange(5), r.inv_freq), seq_dim=-1)
    with pytest.raises(ValueError, match="seq_dim must be -2"):
        posenc.RotaryEmbedding(16, seq_dim=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_integer_and_complex_x_are_refused(dtype):
    r = posenc.RotaryEmbedding(16)
    x = torch.ones(1, 2, 3, 16).to(dtype)
    cos, sin = posenc.rope_cos_sin(torch.arange(3), r.inv_freq)
    for call, name in (
        (lambda: posenc.apply_rope(x, cos, sin), "x"),
        (lambda: posenc.apply_rope_(x, cos, sin), "x"),
        (lambda: posenc.rotate(x), "x"),
        (lambda: r(x, torch.ones(1, 2, 3, 16)), "q"),
        (lambda: r(torch.ones(1, 2, 3, 16), x), "k"),
        (lambda: posenc.apply_rope_qk(torch.ones(1, 2, 3, 16), x, cos, sin), "k"),
    ):
        with pytest.raises(TypeError, match=rf"^{name} must be a real floating-point tensor"):
            call()


def test_numpy_integers_are_ints():
    np = pytest.importorskip("numpy")
    module = posenc.RotaryEmbedding(np.int64(64), max_position_embeddings=np.int32(512))
    assert module.head_dim == 64 and type(module.head_dim) is int
    assert torch.equal(posenc.rope_frequencies(np.int64(64))[0], posenc.rope_frequencies(64)[0])
    assert torch.equal(posenc.alibi_slopes(np.int16(8)), posenc.alibi_slopes(8))
    assert (
        posenc.rope_frequencies(
            64, {"rope_type": "yarn", "factor": np.float64(4.0), "original_max_position_embeddings": np.int64(256)}
        )[1]
        > 1
    )
    with pytest.raises(TypeError, match="head_dim must be an int, got float"):
        posenc.RotaryEmbedding(64.0)


# ------------------------------------------------------------------------------------------ one call, one table cache
def test_apply_rope_qk_is_two_apply_rope_calls():
    q, k = torch.randn(2, 4, 9, 32), torch.randn(2, 2, 9, 32)
    cos, sin = posenc.rope_cos_sin(torch.arange(9) + 3, posenc.rope_frequencies(32)[0])
    q_rot, k_rot = posenc.apply_rope_qk(q, k, cos, sin)
    assert torch.equal(q_rot, posenc.apply_rope(q, cos, sin)) and torch.equal(k_rot, posenc.apply_rope(k, cos, sin))


def test_table_cache_is_never_stale():
    module = posenc.RotaryEmbedding(32)
    q = torch.randn(1, 2, 5, 32)

    def direct(positions):
        return posenc.apply_rope(q[..., : len(positions), :], *posenc.rope_cos_sin(positions, module.inv_freq))

    assert torch.equal(module(q, q, offset=7)[0], direct(torch.arange(7, 12)))
    first = module._table_cache.entry[1]
    assert first.shape[0] == 64 and first.dtype == torch.float32
    assert torch.equal(module(q, q, offset=7)[0], direct(torch.arange(7, 12)))
    assert module._table_cache.entry[1] is first  # reused, not rebuilt
    # a longer reach grows the cache; rows it already had are the same numbers
    assert torch.equal(module(q, q, offset=1000)[0], direct(torch.arange(1000, 1005)))
    assert module._table_cache.entry[1].shape[0] == 1024 and torch.equal(module._table_cache.entry[1][:64], first)
    # new values of inv_freq (in place) and a new device rebuild it
    with torch.no_grad():
        module.inv_freq.mul_(0.5)
    assert torch.equal(module(q, q, offset=7)[0], direct(torch.arange(7, 12)))
    module.to("meta")
    out = module(q.to("meta"), q.to("meta"), offset=7)[0]
    assert out.device.type == "meta" and module._table_cache.entry[1].device.type == "meta"
    # the cached rows are the uncached computation of the same positions, bit for bit
    module = posenc.RotaryEmbedding(64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256})
    module(q[..., :1, :].expand(1, 2, 1, 32).repeat(1, 1, 1, 2), q[..., :1, :].repeat(1, 1, 1, 2), offset=100)
    cos, sin = posenc.rope_cos_sin(torch.arange(128), module.inv_freq, module.attention_factor)
    assert torch.equal(module._table_cache.entry[1], cos) and torch.equal(module._table_cache.entry[2], sin)


# ------------------------------------------------------------------------------------------ compile and export
def test_length_tables_from_a_tensor_equal_those_from_an_int():
    """Dynamic NTK and LongRoPE computed from a 0-d tensor length (no host sync) equal the int path bit for bit."""
    from reference_rope import HEAD_DIM, MAX_POSITIONS, rope_parameters

    for case in ("dynamic", "longrope"):
        for seq_len in (1, 255, 256, 257, 1023, 1024, 1025, 1500, 4096, 100_000):
            by_int = posenc.rope_frequencies(HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_len=seq_len)
            by_tensor = posenc.rope_frequencies(
                HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_len=torch.tensor(seq_len)
            )
            assert torch.equal(by_int[0], by_tensor[0]) and by_int[1] == by_tensor[1]
    with pytest.raises(TypeError, match="seq_len must be an int or a 0-d integer tensor"):
        posenc.rope_frequencies(64, {"rope_type": "dynamic", "factor": 2.0}, seq_len=torch.tensor([3.0]))


def test_length_dependent_types_run_on_meta_with_explicit_positions():
    from reference_rope import HEAD_DIM, MAX_POSITIONS, rope_parameters

    for case in ("dynamic", "longrope"):
        module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS).to("meta")
        q = torch.empty(2, 4, 6, HEAD_DIM, device="meta")
        out, _ = module(q, q, positions=torch.zeros(2, 6, dtype=torch.long, device="meta"))
        assert out.shape == q.shape and out.device.type == "meta"


def test_compiled_fullgraph_dynamic_no_recompile_for_every_rope_type():
    """torch.compile(fullgraph=True, dynamic=True): one graph per rope type, reused at every length (explicit
    (B, T) positions and default positions after a KV-cache offset, (B, T, H, D) tensors), equal to eager. The
    "eager" backend runs dynamo's tracing and guards, which is what breaks or recompiles, without a C++ build."""
    import torch._dynamo
    from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, rope_parameters

    for case in sorted(ROPE_CASES):
        module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_dim=-3)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        counts = []
        with torch._dynamo.config.patch(error_on_recompile=True):
            explicit = torch.compile(lambda q, k, p: module(q, k, p), fullgraph=True, dynamic=True, backend="eager")  # noqa: B023
            cached = torch.compile(lambda q, k: module(q, k, offset=3), fullgraph=True, dynamic=True, backend="eager")  # noqa: B023
            for length in (5, 17, 1500):  # past the trained length 256 / 1024 at 1500, and past the kernel's size
                q, k = torch.randn(2, length, 4, HEAD_DIM), torch.randn(2, length, 2, HEAD_DIM)
                positions = torch.arange(length)[None] + torch.tensor([[0], [7]])
                for got, want in (
                    (explicit(q, k, positions), module(q, k, positions)),
                    (cached(q, k), module(q, k, offset=3)),
                ):
                    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (case, length)
                counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        assert counts == [2, 2, 2], (case, counts)  # one graph for each of the two calls, at every length
        assert not torch._dynamo.utils.counters["graph_break"], case


def test_compiled_true_with_sequence_first_tensors():
    x = torch.randn(2, 9, 3, 32, requires_grad=True)
    cos, sin = posenc.rope_cos_sin(torch.arange(9), posenc.rope_frequencies(32)[0])
    expected = posenc.apply_rope(x, cos, sin, seq_dim=-3)
    out = posenc.apply_rope(x, cos, sin, seq_dim=-3, compiled=True)
    # inductor may fuse the multiply and add (one rounding instead of two): a float32 rounding or two per entry
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose(grad, torch.autograd.grad(expected.sum(), x)[0], atol=1e-5, rtol=1e-5)


class _Block(torch.nn.Module):
    """qkv projection -> RoPE on (B, T, H, D) -> causal SDPA."""

    def __init__(self, width=32, heads=2):
        super().__init__()
        self.heads, self.qkv = heads, torch.nn.Linear(width, 3 * width)
        self.rope = posenc.RotaryEmbedding(width // heads, seq_dim=-3)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)  # each (B, T, H, D)
        q, k = self.rope(q, k)
        out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return out.transpose(1, 2).flatten(2)


def test_export_with_a_dynamic_length_matches_eager():
    from torch.export import Dim, export

    torch.manual_seed(0)
    block = _Block().eval()
    exported = export(block, (torch.randn(1, 16, 32),), dynamic_shapes={"x": {1: Dim("T", min=2, max=8192)}})
    for length in (3, 511, 512, 5000):  # 512 and 5000: eager takes the blocked kernel, the graph the formula
        x = torch.randn(1, length, 32)
        with torch.no_grad():
            assert torch.equal(exported.module()(x), block(x)), length


def test_finiteness_is_checked_in_eager_cpu_calls_only():
    module = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 2, 3, 16)
    bad = torch.tensor([0.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="positions must be finite"):
        module(q, q, positions=bad)
    compiled = torch.compile(lambda q, p: module(q, q, p), fullgraph=True, backend="eager")
    assert compiled(q, bad)[0].isnan().any()  # traced: no value is read back, the NaN goes through


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_small_eager_path_is_the_formula_bit_for_bit(dtype, layout):
    """A decode-sized input without gradients takes rotate_small (out= into one output, no cat): the formula's
    products and sums, each rounded as the formula rounds them, so equal bit for bit."""
    from posenc import _rope_dispatch, rope
    from posenc._rope_kernels import KERNEL_MIN_NUMEL

    generator = torch.Generator().manual_seed(5)
    for fraction, batched, seq_dim in ((1.0, False, -2), (0.5, True, -2), (1.0, True, -3)):
        x = torch.randn(8, 32, 1, 64, generator=generator).to(dtype)
        inv_freq, _ = posenc.rope_frequencies(64, {"partial_rotary_factor": fraction})
        positions = torch.arange(8)[:, None] + 1000 if batched else torch.tensor([1000])
        cos, sin = posenc.rope_cos_sin(positions, inv_freq)
        if seq_dim == -3:
            x = x.transpose(1, 2)
        aligned = [_rope_dispatch.align_table(t, x, seq_dim) for t in (cos, sin)]
        assert _rope_dispatch.ENGINE._eager_fits(x, *aligned) and x.numel() < KERNEL_MIN_NUMEL
        expected = rope.rope_reference(x, cos, sin, layout, seq_dim=seq_dim)
        assert torch.equal(posenc.apply_rope(x, cos, sin, layout, seq_dim=seq_dim), expected)


def test_position_id_runs_read_the_cache_and_others_do_not():
    module = posenc.RotaryEmbedding(64)
    q = torch.randn(8, 4, 1, 64)
    step = torch.full((8, 1), 1000)
    expected = posenc.apply_rope(q, *posenc.rope_cos_sin(step, module.inv_freq))
    assert torch.equal(module(q, q, positions=step)[0], expected)  # read from the cache
    assert module._table_cache.entry is not None and module._table_cache.entry[1].shape[0] == 1024
    prompt = torch.randn(2, 4, 6, 64)
    for positions in (
        torch.arange(6) + 3,
        torch.stack((torch.arange(6), torch.arange(6))),  # runs: cached rows
        torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]]),  # left padding: computed
        torch.arange(6) * 2.5,
        torch.arange(6) + 70_000,
    ):  # real, and past the cache limit: computed
        direct = posenc.apply_rope(prompt, *posenc.rope_cos_sin(positions, module.inv_freq))
        assert torch.equal(module(prompt, prompt, positions=positions)[0], direct)
    assert module._table_cache.entry[1].shape[0] == 1024  # the cache did not grow to 70,000
