"""posenc on a real CUDA device (``make test-gpu``; marker ``gpu``): the Triton kernel against the formula bit for
bit, a tensor over 2**31 elements, capture in a CUDA graph and under ``torch.compile(mode="reduce-overhead")``,
and ``use_posenc_rope`` generating with a tiny random Llama. Skipped where no CUDA device is present (``make
test-gpu`` then says so in one line and does not run pytest)."""

import pytest
import torch

import posenc
from posenc.rope import rope_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
DEVICE = "cuda"


def tables(length, rotary_dim=128, batch=None, start=0):
    inv_freq, _ = posenc.rope_frequencies(rotary_dim, device=DEVICE)
    positions = torch.arange(length, device=DEVICE) + start
    if batch is not None:
        positions = positions + 37 * torch.arange(batch, device=DEVICE)[:, None]
    return posenc.rope_cos_sin(positions, inv_freq)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_kernel_equals_the_formula_bit_for_bit(dtype, layout, seq_dim):
    """No contraction into FMAs (the launch asks for none): every element equals the formula's."""
    from posenc import _triton_rope as tr

    cos, sin = tables(257, 96, batch=3, start=1000)
    shape = (3, 8, 257, 128) if seq_dim == -2 else (3, 257, 8, 128)
    q = torch.randn(shape, device=DEVICE).to(dtype)
    k = q[:, :2] if seq_dim == -2 else q[:, :, :2]
    assert tr.use_triton(q)
    q_rot, k_rot = posenc.apply_rope_qk(q, k, cos, sin, layout, seq_dim=seq_dim)
    assert torch.equal(q_rot, rope_reference(q, cos, sin, layout, seq_dim=seq_dim))
    assert torch.equal(k_rot, rope_reference(k, cos, sin, layout, seq_dim=seq_dim))


def test_gradients_on_the_device_equal_the_formula():
    cos, sin = tables(64, 128)
    q = torch.randn(2, 8, 64, 128, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 2, 64, 128, device=DEVICE, requires_grad=True)
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    q_rot, k_rot = posenc.apply_rope_qk(q, k, cos, sin)
    ours = torch.autograd.grad((q_rot, k_rot), (q, k), (grad_q, grad_k))
    reference = torch.autograd.grad(
        (rope_reference(q, cos, sin), rope_reference(k, cos, sin)), (q, k), (grad_q, grad_k)
    )
    assert torch.equal(ours[0], reference[0]) and torch.equal(ours[1], reference[1])


def test_a_tensor_over_two_to_the_31_elements():
    """(66, 32, 8192, 128) bf16: 2.2e9 elements, 4.4 GB; checked on the rows past 2**31."""
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip(f"needs 12 GiB of free device memory, {free / 2**30:.1f} free")
    cos, sin = tables(8192, 128)
    q = torch.randn(66, 32, 8192, 128, device=DEVICE, dtype=torch.bfloat16)
    assert q.numel() > 2**31
    k = q[:1, :1]
    q_rot, _ = posenc.apply_rope_qk(q, k, cos, sin)
    for b in (0, 33, 65):
        assert torch.equal(q_rot[b], rope_reference(q[b], cos, sin))
    del q_rot
    before = q[65].clone()
    posenc.apply_rope_(q[64:], cos, sin)  # in place, through a view that starts past 2**31 elements
    assert torch.equal(q[65], rope_reference(before, cos, sin))


def test_apply_rope_qk_and_the_module_in_a_cuda_graph():
    module = posenc.RotaryEmbedding(
        128,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
    ).to(DEVICE)
    q = torch.randn(8, 32, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(8, 8, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    positions = torch.randint(0, 4000, (8, 1), device=DEVICE)
    cos, sin = module.cos_sin(positions)
    eager_qk, eager_module = posenc.apply_rope_qk(q, k, cos, sin), module(q, k, positions)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            posenc.apply_rope_qk(q, k, cos, sin)
            module(q, k, positions)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_qk = posenc.apply_rope_qk(q, k, cos, sin)
        captured_module = module(q, k, positions)
    new_positions = torch.randint(0, 4000, (8, 1), device=DEVICE)
    q.copy_(torch.randn_like(q))
    positions.copy_(new_positions)
    cos.copy_(module.cos_sin(new_positions)[0])
    sin.copy_(module.cos_sin(new_positions)[1])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured_qk[0], posenc.apply_rope_qk(q, k, cos, sin)[0])
    assert torch.equal(captured_module[0], module(q, k, positions)[0])
    assert not torch.equal(captured_module[0], eager_module[0]) and eager_qk[0].shape == q.shape


def test_reduce_overhead_compile_of_the_module():
    module = posenc.RotaryEmbedding(128).to(DEVICE)
    q = torch.randn(4, 8, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(4, 2, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    compiled = torch.compile(lambda q, k, p: module(q, k, p), mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        positions = torch.full((4, 1), 100 + step, device=DEVICE) + torch.arange(4, device=DEVICE)[:, None]
        out = compiled(q, k, positions)
        expected = module(q, k, positions)
        assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])


def test_use_posenc_rope_generates_on_cuda():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEVICE).eval()
    prompt = torch.randint(0, 128, (2, 9), device=DEVICE)
    with torch.no_grad():
        own = model.generate(prompt, max_new_tokens=12, do_sample=False)
        with posenc.use_posenc_rope(model):
            ours = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(own, ours)
