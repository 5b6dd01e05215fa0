"""posenc's fast RoPE kernels (posenc._rope_kernels).

The blocked out= kernel is bit for bit transformers' formula (values and gradients), whatever the block size and
the number of threads; the torch.compile-fused kernel agrees within one rounding; torch.compile traces
apply_rope without graph breaks; everything runs on meta tensors; a failed compile falls back to the eager kernel
with one warning.

Exact comparisons kept here, each exact by construction: the blocked kernel and rope.rope_reference (and
transformers' rotate_half formula) run the same elementwise float operations in the same order on the same
values (only the blocking of memory and the threads differ, and elementwise results do not depend on either);
the gradient is the same rotation by -sin, which is exactly autograd's sum of the same two products (negation is
exact); vmap and torch.compile(backend="eager") replay the same operations.
"""

import itertools
import os
import warnings

import pytest
import torch
import torch._dynamo.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, llama_rotary, rope_parameters

import posenc
from posenc import _rope_dispatch, _rope_kernels, rope
from posenc._compile import CompiledFunction

LAYOUTS = ("half", "interleaved")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _kernel_for_every_size(monkeypatch):
    """Small inputs normally take the plain formula (it is faster there); here they take the kernel under test."""
    monkeypatch.setattr(_rope_kernels, "KERNEL_MIN_NUMEL", 0)


def hf_rotation(x, cos_full, sin_full):
    """transformers' formula in the precision posenc promises: float32 (or wider) arithmetic, rounded once."""
    from transformers.models.llama.modeling_llama import rotate_half

    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return (work * cos_full + rotate_half(work) * sin_full).to(x.dtype)


def random_tables(*shape):
    angles = torch.rand(*shape) * 100
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("case", sorted(set(ROPE_CASES) - {"dynamic", "longrope"}))
def test_values_and_gradients_are_bit_exact_with_transformers_in_fp32(case):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    # (B, L, H, D) transposed to heads first: the usual non-contiguous q of an attention layer
    q = torch.randn(2, 40, 4, HEAD_DIM).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 4, 40, HEAD_DIM, requires_grad=True)
    position_ids = torch.stack((torch.arange(40), torch.arange(40) + 1500))
    cos_full, sin_full = llama_rotary(case)(q, position_ids)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos_full, sin_full)
    half = HEAD_DIM // 2
    q_out = posenc.apply_rope(q, cos_full[..., :half], sin_full[..., :half])
    k_out = posenc.apply_rope(k, cos_full[..., :half], sin_full[..., :half])
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    grads = torch.randn_like(q_ref), torch.randn_like(k_ref)
    expected = torch.autograd.grad((q_ref, k_ref), (q, k), grads)
    actual = torch.autograd.grad((q_out, k_out), (q, k), grads)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))


def test_large_inputs_take_the_kernel_by_default(monkeypatch):
    monkeypatch.undo()
    x = torch.randn(1, 8, 128, 64)
    cos, sin = random_tables(128, 32)
    assert _rope_dispatch.ENGINE.kernel_fits(x, cos, sin) and not _rope_dispatch.ENGINE.kernel_fits(x[:, :2], cos, sin)
    full = (torch.cat((t, t), dim=-1) for t in (cos, sin))
    assert torch.equal(posenc.apply_rope(x, cos, sin), hf_rotation(x, *full))


#: Rotations drawn by hypothesis: dtype, layout, rotated pairs, pairs passed through, per-sequence tables, a
#: (B, T, H, D) input seen as (B, H, T, D), the seed of the values (see rotation_case).
ROTATION_CASES = dict(
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    pairs=st.integers(1, 8),
    extra=st.integers(0, 3),
    batch_tables=st.booleans(),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)


def rotation_case(dtype, pairs, extra, length, batch_tables, transposed, seed):
    """``x`` ``(2, 3, length, D)`` (a transposed view when ``transposed``) and tables ``(length, pairs)`` or
    ``(2, length, pairs)``."""
    torch.manual_seed(seed)
    head_dim = 2 * (pairs + extra)
    x = torch.randn(2, length, 3, head_dim).transpose(1, 2) if transposed else torch.randn(2, 3, length, head_dim)
    cos, sin = random_tables(*((2, length, pairs) if batch_tables else (length, pairs)))
    return (4 * x).to(dtype), cos, sin


@settings(max_examples=40, deadline=None)
@given(**ROTATION_CASES)
def test_eager_kernel_is_bit_exact_with_the_formula(dtype, layout, pairs, extra, batch_tables, transposed, seed):
    x, cos, sin = rotation_case(dtype, pairs, extra, 5, batch_tables, transposed, seed)
    expected = rope.rope_reference(x, cos, sin, layout, seq_dim=-2)
    result = posenc.apply_rope(x, cos, sin, layout)
    assert result.dtype == dtype and result.shape == x.shape and torch.equal(result, expected)
    in_place = x.clone()
    assert rope.apply_rope_(in_place, cos, sin, layout) is in_place and torch.equal(in_place, expected)
    if layout == "half" and not extra:  # an independent reference: transformers' rotate_half formula
        full = (torch.cat((t, t), dim=-1) for t in (cos, sin))
        assert torch.equal(result, hf_rotation(x, *(_rope_dispatch.align_table(t, x) for t in full)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_gradients_are_bit_exact_with_autograd_of_the_formula(dtype, layout):
    x = (3 * torch.randn(2, 3, 6, 10)).to(dtype).requires_grad_()
    cos, sin = random_tables(6, 4)  # partial rotary: 8 of 10 features turn
    grad = torch.randn(2, 3, 6, 10).to(dtype)
    (expected,) = torch.autograd.grad(rope.rope_reference(x, cos, sin, layout, seq_dim=-2), x, grad)
    (actual,) = torch.autograd.grad(posenc.apply_rope(x, cos, sin, layout), x, grad)
    assert torch.equal(actual, expected)


def test_gradients_reach_the_tables_and_second_derivatives_are_right():
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.double().requires_grad_() for t in random_tables(5, 3))
    assert torch.autograd.gradcheck(lambda *a: posenc.apply_rope(*a), (x, cos, sin))
    assert torch.autograd.gradgradcheck(lambda x: posenc.apply_rope(x, cos.detach(), sin.detach()), (x,))


def test_in_place_rotation_and_its_errors():
    cos, sin = random_tables(2, 5, 4)  # per-batch tables
    x = torch.randn(1, 3, 5, 8)
    with pytest.raises(ValueError, match="broadcast"):
        rope.apply_rope_(x, cos, sin)  # the result would be (2, 3, 5, 8): it cannot be written into x
    leaf = torch.randn(2, 3, 5, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        rope.apply_rope_(leaf, cos, sin)
    inner = leaf * 1.0  # a non-leaf may be rotated in place, and autograd follows
    rope.apply_rope_(inner, cos, sin)
    grad = torch.randn_like(inner)
    (expected,) = torch.autograd.grad(posenc.apply_rope(leaf, cos, sin), leaf, grad)
    assert torch.equal(torch.autograd.grad(inner, leaf, grad)[0], expected)


def test_vmap_over_a_batch_matches_the_batched_call():
    x = torch.randn(4, 3, 5, 8)
    cos, sin = random_tables(5, 4)
    mapped = torch.func.vmap(lambda t: posenc.apply_rope(t, cos, sin))(x)
    assert torch.equal(mapped, posenc.apply_rope(x, cos, sin))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_compile_traces_apply_rope_in_one_graph(layout):
    counter = torch._dynamo.testing.CompileCounter()

    def step(q, k, cos, sin, compiled):
        q = posenc.apply_rope(q, cos, sin, layout, compiled=compiled)  # traced: no nested compile
        return q, rope.apply_rope_(k.clone(), cos, sin, layout, compiled=compiled)

    traced = torch.compile(step, backend=counter, fullgraph=True)
    for dtype in (torch.float32, torch.bfloat16):
        q, k = torch.randn(2, 4, 9, 12).to(dtype), torch.randn(2, 2, 9, 12).to(dtype)
        cos, sin = random_tables(2, 9, 5)
        for actual, expected in zip(traced(q, k, cos, sin, True), step(q, k, cos, sin, False)):
            assert torch.equal(actual, expected)
    assert counter.frame_count >= 1  # fullgraph=True raises on any graph break


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_embedding_compiles_in_one_graph(case):
    module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS)
    q, k = torch.randn(1, 4, 300, HEAD_DIM), torch.randn(1, 2, 300, HEAD_DIM)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    for actual, expected in zip(compiled(q, k, offset=5), module(q, k, offset=5)):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_everything_runs_on_meta_tensors(case):
    with torch.device("meta"):
        module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS)
        q = torch.empty(2, 4, 16, HEAD_DIM, requires_grad=True)
        k = torch.empty(2, 2, 16, HEAD_DIM)
    q_out, k_out = module(q, k, offset=3)
    assert q_out.device.type == k_out.device.type == "meta" and q_out.shape == q.shape
    q_out.sum().backward()
    assert q.grad.device.type == "meta"
    cos, sin = module.cos_sin(torch.arange(16, device="meta"), seq_len=16)
    for compiled in (False, True):
        assert posenc.apply_rope(k, cos, sin, compiled=compiled).device.type == "meta"
        assert rope.apply_rope_(k, cos, sin, compiled=compiled).device.type == "meta"


def failing_backend(graph_module, example_inputs):
    raise RuntimeError("no C++ compiler here")


def test_a_failed_compile_falls_back_to_the_eager_kernel_and_warns_once(monkeypatch):
    monkeypatch.setattr(
        _rope_dispatch.ENGINE,
        "compiled",
        CompiledFunction(
            _rope_dispatch.rotation_formula, _rope_dispatch.ENGINE.rotate_default, backend=failing_backend
        ),
    )
    x = torch.randn(2, 3, 7, 16)
    cos, sin = random_tables(7, 8)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here"):
        result = posenc.apply_rope(x, cos, sin, compiled=True)
    assert torch.equal(result, posenc.apply_rope(x, cos, sin))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(posenc.apply_rope(x, cos, sin, compiled=True), result)
    assert set(_rope_dispatch.ENGINE.compiled.failures) == {"cpu"}


def test_a_missing_cpp_compiler_falls_back(monkeypatch):
    import torch._inductor.config as inductor_config

    function = CompiledFunction(
        _rope_dispatch.rotation_formula, _rope_dispatch.ENGINE.rotate_default, dynamic=False, fullgraph=True
    )
    x, (cos, sin) = torch.randn(1, 2, 3, 4), random_tables(3, 2)
    with (
        inductor_config.patch(
            {"cpp.cxx": (None, "/nonexistent/posenc-test-c++"), "fx_graph_cache": False, "autotune_local_cache": False}
        ),
        pytest.warns(RuntimeWarning, match="eager"),
    ):
        result = function(x, cos, sin, "half")
    assert torch.equal(result, posenc.apply_rope(x, cos, sin))


def test_the_compiled_kernel_equals_the_reference_with_gradients(monkeypatch):
    """A real inductor build (seconds on first run, then inductor's disk cache)."""
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this platform")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    cos, sin = random_tables(33, 12)  # partial rotary, odd length: tails of the vector loops
    for dtype, layout in ((torch.float32, "half"), (torch.bfloat16, "half")):
        x = (3 * torch.randn(2, 3, 33, 32)).to(dtype)
        expected = posenc.apply_rope(x, cos, sin, layout)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            actual = posenc.apply_rope(x, cos, sin, layout, compiled=True)
        # posenc's fallback warning would mean nothing was compiled; warnings from inside torch's own compiler
        # (e.g. a DeprecationWarning under ATEN_CPU_CAPABILITY=default) are not posenc's business
        fallbacks = [str(w.message) for w in caught if str(w.message).startswith("posenc: torch.compile")]
        # the fallback warning is given once per process: an earlier test may have had it
        failed = fallbacks + [repr(error) for error in _rope_dispatch.ENGINE.compiled.failures.values()]
        if failed and os.environ.get("ATEN_CPU_CAPABILITY") == "default":
            # torch 2.13's inductor emits at::vec code that does not build without a vector ISA (".ci/run"'s
            # second pass); the fallback itself is tested by the two tests above
            pytest.skip(f"inductor cannot build C++ kernels with ATEN_CPU_CAPABILITY=default: {failed[0][:200]}")
        assert not fallbacks, fallbacks
        # one rounding of the float32 result at most; for bf16, one unit in the last place
        tolerance = dict(rtol=2**-7, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(actual, expected, **tolerance)
    with monkeypatch.context() as patch:  # small inputs: the fused in-place kernel, not the blocked one
        patch.setattr(_rope_kernels, "KERNEL_MIN_NUMEL", 1 << 16)
        x = (3 * torch.randn(2, 3, 33, 32)).to(torch.bfloat16)
        expected = posenc.apply_rope(x, cos, sin, layout)
        in_place = rope.apply_rope_(x.clone(), cos, sin, layout, compiled=True)
    torch.testing.assert_close(in_place, expected, rtol=2**-7, atol=0)
    x = torch.randn(2, 3, 33, 32, requires_grad=True)
    grad = torch.randn(2, 3, 33, 32)
    (expected,) = torch.autograd.grad(posenc.apply_rope(x, cos, sin), x, grad)
    (actual,) = torch.autograd.grad(posenc.apply_rope(x, cos, sin, compiled=True), x, grad)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    assert not _rope_dispatch.ENGINE.compiled.failures and not _rope_dispatch.ENGINE._compiled_in_place.failures
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs  # really compiled, not skipped


def _blocked(x, cos, sin, layout, block, in_place=False):
    cos, sin = (_rope_dispatch.align_table(t, x) for t in (cos, sin))
    out = x if in_place else torch.empty_like(x)
    return _rope_dispatch.ENGINE.rotate_into(out, x, cos, sin, layout, block_elements=block)


@settings(max_examples=60, deadline=None)
@given(
    **ROTATION_CASES,
    length=st.integers(1, 23),
    block=st.integers(1, 400),
    run=st.integers(1, 200),
    threads=st.integers(1, 3),
)
def test_blocked_kernel_is_bit_exact_for_any_block_size_and_thread_count(
    dtype, layout, pairs, extra, length, batch_tables, transposed, block, run, threads, seed
):
    """Blocks that cut through heads and sequences at odd places (tails of every loop), runs of a sequence shared
    by several heads, any intra-op thread count (restored afterwards)."""
    x, cos, sin = rotation_case(dtype, pairs, extra, length, batch_tables, transposed, seed)
    expected = rope.rope_reference(x, cos, sin, layout, seq_dim=-2)
    before, run_before = torch.get_num_threads(), _rope_kernels.RUN_ELEMENTS
    torch.set_num_threads(threads)
    _rope_kernels.RUN_ELEMENTS = run  # hypothesis reuses the test function: no monkeypatch fixture here
    try:
        assert torch.equal(_blocked(x, cos, sin, layout, block), expected)
        copy = x.clone()
        assert torch.equal(_blocked(copy, cos, sin, layout, block, in_place=True), expected)
    finally:
        torch.set_num_threads(before)
        _rope_kernels.RUN_ELEMENTS = run_before


def test_blocks_cover_every_element_once():
    for shape in ((2, 3, 37, 20), (5, 16), (1, 1, 1, 2), (3, 1, 4, 7, 6)):
        for target, run in itertools.product((1, 6, 20, 50, 10**6), (1, 7, 40, 10**6)):
            seen = torch.zeros(shape, dtype=torch.int64)
            for index in _rope_kernels._blocks(shape, max(target, shape[-1]), run):
                assert seen[index].numel() <= max(target, shape[-1])
                seen[index] += 1
            assert torch.equal(seen, torch.ones_like(seen)), (shape, target, run)


def test_blocked_kernel_respects_the_callers_grad_and_inference_modes():
    x = torch.randn(2, 3, 50, 8, requires_grad=True)
    cos, sin = random_tables(50, 4)
    with torch.no_grad():  # in place on a leaf that requires grad is fine without grad mode, in the kernel
        y = x.detach().clone().requires_grad_()
        _blocked(y, cos, sin, "half", 16, in_place=True)
        assert torch.equal(y, rope.rope_reference(x.detach(), cos, sin, "half", seq_dim=-2))
    with torch.inference_mode():
        z = torch.randn(2, 3, 50, 8)
        assert torch.equal(_blocked(z, cos, sin, "half", 16), rope.rope_reference(z, cos, sin, "half", seq_dim=-2))
        assert torch.equal(
            _blocked(z.clone(), cos, sin, "half", 16, in_place=True),
            rope.rope_reference(z, cos, sin, "half", seq_dim=-2),
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_blocked_gradients_are_bit_exact_with_autograd_of_the_formula(dtype, layout, monkeypatch):
    """Batched (per-sequence) tables, partial rotary and an odd length, with blocks that cut the sequence."""
    monkeypatch.setattr(_rope_kernels, "BLOCK_ELEMENTS", 30)
    x = (3 * torch.randn(2, 3, 13, 10)).to(dtype).requires_grad_()
    cos, sin = random_tables(2, 13, 4)
    grad = torch.randn(2, 3, 13, 10).to(dtype)
    (expected,) = torch.autograd.grad(rope.rope_reference(x, cos, sin, layout, seq_dim=-2), x, grad)
    (actual,) = torch.autograd.grad(posenc.apply_rope(x, cos, sin, layout), x, grad)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_small_eager_path_is_the_formula_bit_for_bit(dtype, layout, monkeypatch):
    """A decode-sized input without gradients takes rotate_small (out= into one output, no cat): the formula's
    products and sums, each rounded as the formula rounds them, so equal bit for bit."""
    monkeypatch.undo()  # the real threshold: this input is below it
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
