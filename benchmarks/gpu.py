"""RoPE on a GPU: posenc's fused Triton kernel against what a GPU user would pick instead (``make bench-gpu``).

Runs only where CUDA is available; elsewhere it prints one line and exits 0. For the shapes
(1, 32, 4096, 128), (4, 16, 2048, 128) with 8 kv heads and the decode step (64, 32, 1, 128), in float32 and
bfloat16, forward and backward, it times:

* posenc's default (the Triton kernel, q and k in one launch) and posenc compiled (``torch.compile`` of the formula,
  ``POSENC_KERNEL=formula`` semantics);
* transformers' ``apply_rotary_pos_emb``, eager and compiled (cos/sin precomputed by ``LlamaRotaryEmbedding``);
* Liger-Kernel's and flash-attn's RoPE where they import;
* a plain device copy of q and k, the bandwidth yardstick.

Each is reported in milliseconds and as a fraction of the measured copy bandwidth: bytes moved (q and k read and
written once, plus the tables) over time, divided by the copy's bytes over its time. It also checks each
contender's output against the float64 formula (largest difference), and then runs every chapter of the book once
with ``POSENC_DEVICE=cuda`` and reports which pass. Results: ``_build/bench-gpu.json`` with the device name and the
versions. ``python -m benchmarks.gpu [--quick] [--no-chapters]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.peers import version
from benchmarks.timing import interleaved, synchronizer

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"prefill (1, 32, 4096, 128), kv 32": (1, 32, 32, 4096, 128),
          "prefill (4, 16, 2048, 128), kv 8": (4, 16, 8, 2048, 128),
          "decode (64, 32, 1, 128), kv 32": (64, 32, 32, 1, 128)}


def contenders(batch, heads, kv_heads, length, head_dim, dtype, device):
    """name -> rotate(q, k) for every implementation that imports; q (B, H, T, D), k (B, Hk, T, D)."""
    import posenc

    inv_freq, _ = posenc.rope_frequencies(head_dim, device=device)
    cos, sin = posenc.rope_cos_sin(torch.arange(length, device=device), inv_freq)
    found = {"copy": lambda q, k: (q.clone(), k.clone()),
             "posenc (Triton)": lambda q, k: posenc.rope._triton_rope.rope_qk(q, k, cos, sin)}
    formula = torch.compile(lambda q, k: (posenc.rope._rotation_formula(q, cos, sin, "half"),
                                          posenc.rope._rotation_formula(k, cos, sin, "half")))
    found["posenc compiled"] = formula
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

        config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, max_position_embeddings=length)
        hf_cos, hf_sin = LlamaRotaryEmbedding(config, device=device)(torch.zeros(1, device=device, dtype=dtype),
                                                                     torch.arange(length, device=device)[None])
        found["transformers eager"] = lambda q, k: apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
        found["transformers compiled"] = torch.compile(lambda q, k: apply_rotary_pos_emb(q, k, hf_cos, hf_sin))
    except ImportError:
        pass
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        liger_cos, liger_sin = torch.cat((cos, cos), -1)[None].to(dtype), torch.cat((sin, sin), -1)[None].to(dtype)
        found["Liger"] = lambda q, k: LigerRopeFunction.apply(q.clone(), k.clone(), liger_cos, liger_sin)
    except ImportError:
        pass
    try:
        from flash_attn.layers.rotary import apply_rotary_emb

        found["flash-attn"] = lambda q, k: (apply_rotary_emb(q.transpose(1, 2), cos, sin).transpose(1, 2),
                                           apply_rotary_emb(k.transpose(1, 2), cos, sin).transpose(1, 2))
    except ImportError:
        pass
    return found, (cos, sin)


def reference(x, cos, sin):
    from posenc.rope import _rotation_formula

    return _rotation_formula(x.double(), cos.double(), sin.double(), "half")


def bench_shape(name, shape, dtype, device, rounds, backward):
    batch, heads, kv_heads, length, head_dim = shape
    rotations, (cos, sin) = contenders(batch, heads, kv_heads, length, head_dim, dtype, device)
    q = torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, length, head_dim, device=device, dtype=dtype)
    errors = {}
    for label, rotate in rotations.items():
        if label == "copy":
            continue
        q_rot, _ = rotate(q, k)
        errors[label] = float((q_rot.double() - reference(q, cos, sin)).abs().max())
    if backward:
        def timed(rotate):
            q_grad, k_grad = q.clone().requires_grad_(), k.clone().requires_grad_()
            q_out, k_out = rotate(q_grad, k_grad)
            seed_q, seed_k = torch.ones_like(q_out), torch.ones_like(k_out)
            return lambda: torch.autograd.grad((q_out, k_out), (q_grad, k_grad), (seed_q, seed_k))
        prepare = {label: (lambda r=rotate: timed(r)) for label, rotate in rotations.items() if label != "copy"}
        calls = {label: (lambda: None) for label in prepare} | {"copy": lambda: (q.clone(), k.clone())}
        times = interleaved(calls, rounds, synchronizer(device), prepare=prepare)
    else:
        calls = {label: (lambda r=rotate: r(q, k)) for label, rotate in rotations.items()}
        for call in calls.values():   # warm-up: compiles and autotunes outside the timing
            call()
        times = interleaved(calls, rounds, synchronizer(device))
    seconds = {label: statistics.median(values) for label, values in times.items()}
    moved = 2 * (q.numel() + k.numel()) * q.element_size()
    copy_rate = moved / seconds["copy"]
    return {label: {"ms": 1e3 * value,
                    "fraction_of_copy_bandwidth": (moved / value) / copy_rate,
                    "max_abs_error_vs_float64": errors.get(label)}
            for label, value in seconds.items()}


def chapters_on_cuda() -> dict:
    env = {**os.environ, "POSENC_DEVICE": "cuda"}
    result = subprocess.run([sys.executable, "-m", "book.tools.run_notebooks", "--output-dir", "_build/executed-cuda"],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.strip().endswith(("ok", "FAILED")) or "FAILED" in line]
    return {"returncode": result.returncode, "lines": lines}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three rounds per configuration")
    parser.add_argument("--no-chapters", action="store_true", help="skip running the chapters on CUDA")
    parser.add_argument("--output", type=Path, default=ROOT / "_build" / "bench-gpu.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench-gpu: no CUDA device on this machine; nothing measured (run `make bench-gpu` on a machine with one)")
        return 0
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "triton": version("triton"), "transformers": version("transformers"),
              "liger-kernel": version("liger-kernel"), "flash-attn": version("flash-attn"), "results": {}}
    rounds = 3 if args.quick else 15
    for shape_name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            for backward in (False, True):
                key = f"{shape_name}, {str(dtype).removeprefix('torch.')}, {'backward' if backward else 'forward'}"
                report["results"][key] = bench_shape(shape_name, shape, dtype, device, rounds, backward)
                print(key)
                for label, row in report["results"][key].items():
                    error = row["max_abs_error_vs_float64"]
                    print(f"  {label:24s} {row['ms']:9.3f} ms  {row['fraction_of_copy_bandwidth']:6.2f} of copy"
                          + (f"  max error {error:.2e}" if error is not None else ""))
    if not args.no_chapters:
        report["chapters"] = chapters_on_cuda()
        print("\n".join(report["chapters"]["lines"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"bench-gpu: wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
