"""benchmarks/gpu.py (make bench-gpu) without a GPU: its no-CUDA path says so in one line and exits 0, and its
measuring code runs end to end on CPU tensors with stand-in timers (every function it calls exists)."""

import json

import pytest
import torch

from benchmarks import gpu


def test_without_cuda_one_line_and_exit_zero(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--output", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0] and not (tmp_path / "out.json").exists()


def cpu_kernel_rows(dtype, backward):
    """The kernel part at a tiny shape on the CPU, its timers stood in for (every contender still runs)."""
    return gpu.kernel_rows(
        "tiny",
        (2, 4, 2, 3),
        dtype,
        torch.device("cpu"),
        backward=backward,
        quick=True,
        compile_peers=False,
        timer=lambda f: (f() and 1.0, "stand-in"),
        host_timer=lambda f: 2.0,
    )


def test_kernel_rows_run_on_the_cpu_with_stand_in_timers():
    rows = cpu_kernel_rows(torch.float32, backward=False)
    assert {"copy", "posenc"} <= set(rows)
    assert rows["posenc"]["fraction_of_copy"] == 1.0 and rows["posenc"]["max_abs_error_vs_float64"] < 1e-5
    if "transformers eager" in rows:
        assert rows["transformers eager"]["max_abs_error_vs_float64"] < 1e-5
    backward = cpu_kernel_rows(torch.bfloat16, backward=True)
    assert all("error" not in row for row in backward.values()), backward
    json.dumps(rows)


def test_the_model_config_is_a_1b_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{**gpu.LLAMA_1B, "num_hidden_layers": 1})
    assert config.rope_parameters["rope_type"] == "llama3" and config.head_dim == 128
    assert config.num_key_value_heads == 8 and gpu.LLAMA_1B["num_hidden_layers"] == 16
