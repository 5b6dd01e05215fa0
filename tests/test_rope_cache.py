"""The table cache of posenc.RotaryEmbedding (posenc._rope_cache, a private engine): rows reused, grown,
rebuilt when inv_freq changes, gathered by index for integer CPU positions, and always the direct computation's
numbers (posenc.rope_cos_sin and posenc.rope.rope_reference) bit for bit."""

import pytest
import torch

import posenc
from posenc import rope


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


def test_a_decode_step_with_its_own_position_per_sequence_reads_the_cache_exactly():
    """(B, 1) position ids, each sequence elsewhere: the cache's rows gathered by index, equal to the direct
    computation bit for bit, in every dtype; positions past the cache grow it, past the limit are computed."""
    module = posenc.RotaryEmbedding(64)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        q, k = torch.randn(8, 4, 1, 64).to(dtype), torch.randn(8, 2, 1, 64).to(dtype)
        for ids in (torch.tensor([3, 900, 17, 4000, 0, 1, 2, 65]), torch.tensor([70_000] * 8)):
            ids = ids[:, None]
            cos, sin = posenc.rope_cos_sin(ids, module.inv_freq)
            q_rot, k_rot = module(q, k, ids)
            assert torch.equal(q_rot, rope.rope_reference(q, cos, sin))
            assert torch.equal(k_rot, rope.rope_reference(k, cos, sin))
    assert module._table_cache.entry[1].shape[0] == 4096  # grown to 4,000, not to 70,000


def test_gathered_rows_follow_a_changed_inv_freq():
    """Position ids read by index (a decode step) after inv_freq changed in place: the rebuilt rows, not stale ones."""
    module = posenc.RotaryEmbedding(32)
    q = torch.randn(4, 2, 1, 32)
    ids = torch.tensor([[3], [40], [7], [0]])
    module(q, q, ids)  # fills the cache
    with torch.no_grad():
        module.inv_freq.mul_(0.5)
    expected = rope.rope_reference(q, *posenc.rope_cos_sin(ids, module.inv_freq))
    assert torch.equal(module(q, q, ids)[0], expected)


def test_a_repeated_decode_step_keeps_every_check_and_every_bit():
    """After the first call of a signature, decode steps take the remembered short path (posenc.rope
    posenc._rope_steps.DecodeSteps): the same numbers as the direct computation bit for bit, in both layouts and
    both tensor layouts; negative values, values past the cache, gradients and bad arguments still meet the
    general path's checks."""
    for layout, seq_dim, dtype in (
        ("half", None, torch.bfloat16),
        ("interleaved", None, torch.float32),
        ("half", -3, torch.float16),
    ):
        module = posenc.RotaryEmbedding(64, layout=layout, seq_dim=seq_dim)
        shape_q, shape_k = ((8, 4, 1, 64), (8, 2, 1, 64)) if seq_dim is None else ((8, 1, 4, 64), (8, 1, 2, 64))
        q, k = torch.randn(shape_q).to(dtype), torch.randn(shape_k).to(dtype)
        axis = -2 if seq_dim is None else -3
        for step in range(3):
            offsets = torch.tensor([3, 900, 17, 40, 0, 1, 2, 65]) + step * 1000  # past the cache at step 2
            cos, sin = posenc.rope_cos_sin(offsets[:, None], module.inv_freq)
            for q_rot, k_rot in (module(q, k, offset=offsets), module(q, k, positions=offsets[:, None])):
                assert torch.equal(q_rot, rope.rope_reference(q, cos, sin, layout, seq_dim=axis))
                assert torch.equal(k_rot, rope.rope_reference(k, cos, sin, layout, seq_dim=axis))
        assert len(module._steps) == 2  # one signature per kind of call, remembered
        with pytest.raises(ValueError, match="offset must be >= 0"):
            module(q, k, offset=torch.tensor([3, -1, 0, 0, 0, 0, 0, 0]))
        with pytest.raises(ValueError, match="positions must be >= 0"):
            module(q, k, positions=torch.tensor([[3], [-1], [0], [0], [0], [0], [0], [0]]))
        with pytest.raises(ValueError, match="one offset per sequence"):
            module(q, k, offset=torch.arange(3))
    with pytest.raises(TypeError, match="q"):
        module([[0.0] * 64], k, offset=offsets)
    with pytest.raises(TypeError, match="offset"):
        module(q, k, offset=offsets.float())
    # a gradient wanted after the signature was remembered: recorded by the general path, equal to the formula's
    module(q.float(), k.float(), offset=offsets)
    assert len(module._steps) == 3
    leaf = q.float().requires_grad_()
    rotated, _ = module(leaf, k.float(), offset=offsets)
    expected = rope.rope_reference(leaf, cos, sin, "half", seq_dim=-3)
    assert rotated.grad_fn is not None and torch.equal(rotated, expected)
    (gradient,) = torch.autograd.grad(rotated.sum(), leaf)
    assert torch.equal(gradient, torch.autograd.grad(expected.sum(), leaf)[0])
