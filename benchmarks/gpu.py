"""RoPE on a GPU as a GPU user reads it (``make bench-gpu``); one line and exit 0 where there is no CUDA device.

Two parts, both written to ``_build/bench-gpu.json`` with the date, the GPU and the versions:

* **kernels**: q and k rotated together at the decode shape (64, 32 + 8, 1, 128), a prefill (1, 32 + 8, 4096, 128)
  and a training batch (4, 32 + 8, 8192, 128), bf16 and fp32, forward (and backward at the training batch). Per
  contender: the device time (``triton.testing.do_bench``, CUDA events, median), the host time of one eager call
  (the calls queued behind a long ``torch.cuda._sleep`` so that the host never waits for the device) and the
  fraction of a copy (bytes moved over time, against a copy of q and k timed the same way). Contenders: posenc
  (``apply_rope_qk``: the Triton kernel), transformers' ``apply_rotary_pos_emb`` eager and compiled, Liger,
  FlashInfer's ``apply_rope_with_cos_sin_cache`` and flash-attn's ``apply_rotary_emb`` where they import, and each
  one's largest difference from the float64 formula.
* **model**: a 1B Llama (random weights, 16 layers, 32 q / 8 kv heads, head 128, llama3 rope, bf16, SDPA): prefill
  of 8,192 tokens (ms) and greedy decode (tokens/s) at batch 1 and 32, with its own RoPE and under
  ``posenc.use_posenc_rope``, eager and with a static cache under ``torch.compile``.

A time budget (``--budget``, default 330 s) keeps the run under six minutes: what does not fit is reported as
skipped. ``python -m benchmarks.gpu [--quick] [--no-model] [--no-compile] [--budget S] [--output PATH]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HEAD_DIM = 128
#: name -> (batch, q heads, kv heads, length)
SHAPES = {
    "decode (64, 32+8, 1, 128)": (64, 32, 8, 1),
    "prefill (1, 32+8, 4096, 128)": (1, 32, 8, 4096),
    "training (4, 32+8, 8192, 128)": (4, 32, 8, 8192),
}
QUICK_SHAPES = {"decode (8, 32+8, 1, 128)": (8, 32, 8, 1), "prefill (1, 32+8, 512, 128)": (1, 32, 8, 512)}
BACKWARD_SHAPES = ("training (4, 32+8, 8192, 128)", "prefill (1, 32+8, 512, 128)")
LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def version(distribution: str) -> str | None:
    from benchmarks.peers import version as installed

    return installed(distribution)


class Budget:
    """Seconds left of the run; parts that would start after it are skipped (and reported so)."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ------------------------------------------------------------------------------------------ timing
def device_ms(function, quick: bool = False) -> tuple[float, str]:
    """Device time of ``function()`` in ms and how it was taken: replay of a CUDA graph of the call
    (``triton.testing.do_bench_cudagraph``: the kernels alone, no host gaps), or, where the call cannot be captured,
    CUDA events around eager calls (``do_bench``, L2 flushed between calls; median)."""
    from triton import testing

    try:
        return float(testing.do_bench_cudagraph(function, rep=10 if quick else 50, return_mode="median")), "cuda graph"
    except Exception:  # not capturable (a host sync, an allocation pattern a graph cannot hold)
        torch.cuda.synchronize()
        return float(
            testing.do_bench(function, warmup=5 if quick else 25, rep=20 if quick else 100, return_mode="median")
        ), "events"


def host_us(function, calls: int = 50, rounds: int = 5) -> float:
    """Host time of one eager call in us: ``calls`` calls queued behind a long sleep kernel, so that no call waits
    for the device; median over ``rounds``."""
    function()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time on any recent GPU: the queue stays ahead
        start = time.perf_counter()
        for _ in range(calls):
            function()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


# ------------------------------------------------------------------------------------------ contenders
def contenders(batch, kv_heads, length, dtype, device, compile_peers: bool = True) -> dict:
    """name -> ``rotate(q, k) -> (q_rot, k_rot)`` for ``q`` (B, H, T, D), ``k`` (B, H_kv, T, D), for every
    implementation that imports (a missing one is left out)."""
    import posenc

    inv_freq, _ = posenc.rope_frequencies(HEAD_DIM, device=device)
    positions = torch.arange(length, device=device)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    found = {"copy": lambda q, k: (q.clone(), k.clone()), "posenc": lambda q, k: posenc.apply_rope_qk(q, k, cos, sin)}
    with contextlib.suppress(ImportError):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        # (1, T, D) in the model dtype, as LlamaRotaryEmbedding returns them
        hf_cos, hf_sin = torch.cat((cos, cos), -1)[None].to(dtype), torch.cat((sin, sin), -1)[None].to(dtype)
        found["transformers eager"] = lambda q, k: apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
        if compile_peers:
            found["transformers compiled"] = torch.compile(lambda q, k: apply_rotary_pos_emb(q, k, hf_cos, hf_sin))
    with contextlib.suppress(ImportError):
        from liger_kernel.ops.rope import LigerRopeFunction

        liger_cos, liger_sin = torch.cat((cos, cos), -1)[None].to(dtype), torch.cat((sin, sin), -1)[None].to(dtype)
        # Liger rotates in place: it is handed copies (a copy's time is in the row; see "copy")
        found["Liger (+ copy)"] = lambda q, k: LigerRopeFunction.apply(q.clone(), k.clone(), liger_cos, liger_sin)
    with contextlib.suppress(ImportError):
        from flashinfer.rope import apply_rope_with_cos_sin_cache

        cache = torch.cat((cos, sin), -1)  # (T, D): cos in the first half, sin in the second, float32
        flat_positions = positions.repeat(batch)

        def flashinfer(q, k):
            q_flat = q.transpose(1, 2).reshape(batch * length, -1)
            k_flat = k.transpose(1, 2).reshape(batch * length, -1)
            q_rot, k_rot = apply_rope_with_cos_sin_cache(flat_positions, q_flat, k_flat, HEAD_DIM, cache, True)
            return (
                q_rot.view(batch, length, -1, HEAD_DIM).transpose(1, 2),
                k_rot.view(batch, length, -1, HEAD_DIM).transpose(1, 2),
            )

        found["FlashInfer"] = flashinfer
    with contextlib.suppress(ImportError):
        from flash_attn.layers.rotary import apply_rotary_emb

        fa_cos, fa_sin = cos.to(dtype), sin.to(dtype)
        found["flash-attn"] = lambda q, k: (
            apply_rotary_emb(q.transpose(1, 2), fa_cos, fa_sin).transpose(1, 2),
            apply_rotary_emb(k.transpose(1, 2), fa_cos, fa_sin).transpose(1, 2),
        )
    return found


def float64_reference(x, positions, device):
    import posenc

    inv_freq, _ = posenc.rope_frequencies(HEAD_DIM, device=device)
    angles = positions.double()[:, None] * inv_freq.double()
    return posenc.rope.rope_reference(x.double(), angles.cos(), angles.sin())


def kernel_rows(
    name, shape, dtype, device, backward: bool, quick: bool, compile_peers: bool = True, timer=None, host_timer=None
) -> dict:
    """One configuration: per contender device ms, host us per eager call, fraction of a copy, max error."""
    timer = timer or (lambda f: device_ms(f, quick))
    host_timer = host_timer or host_us
    batch, heads, kv_heads, length = shape
    rotations = contenders(batch, kv_heads, length, dtype, device, compile_peers)
    q = torch.randn(batch, heads, length, HEAD_DIM, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, length, HEAD_DIM, device=device, dtype=dtype)
    reference = float64_reference(q, torch.arange(length, device=device), device)
    moved = 2 * (q.numel() + k.numel()) * q.element_size()  # q and k read and written once
    rows = {}
    for label, rotate in rotations.items():
        try:
            if backward:
                if label == "copy":
                    call = lambda: (q.clone(), k.clone())
                else:
                    q_grad, k_grad = q.clone().requires_grad_(), k.clone().requires_grad_()
                    q_out, k_out = rotate(q_grad, k_grad)
                    seeds = (torch.randn_like(q_out), torch.randn_like(k_out))
                    call = lambda q_out=q_out, k_out=k_out, q_grad=q_grad, k_grad=k_grad, seeds=seeds: (
                        torch.autograd.grad((q_out, k_out), (q_grad, k_grad), seeds, retain_graph=True)
                    )
                error = None
            else:
                call = lambda rotate=rotate: rotate(q, k)
                out = call()[0]
                error = None if label == "copy" else float((out.double() - reference).abs().max())
            milliseconds, method = timer(call)
            rows[label] = {
                "device_us": 1e3 * milliseconds,
                "timed_by": method,
                "host_us_per_call": host_timer(call),
                "max_abs_error_vs_float64": error,
                "bytes": moved,
            }
        except Exception as failure:  # a peer that fails on this shape or dtype is reported, not fatal
            rows[label] = {"error": f"{type(failure).__name__}: {failure}"[:300]}
    copy = rows.get("copy", {}).get("device_us")
    for row in rows.values():
        if copy and "device_us" in row:
            row["fraction_of_copy"] = copy / row["device_us"]
    return rows


# ------------------------------------------------------------------------------------------ the model
def llama_1b(device, dtype=torch.bfloat16, layers: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA_1B, **({"num_hidden_layers": layers} if layers else {})})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    return model


def _cuda_seconds(function) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def model_rows(device, quick: bool, budget: Budget, compile_model: bool) -> dict:
    """Prefill ms and greedy-decode tokens/s of the 1B Llama, own RoPE against use_posenc_rope."""
    import posenc

    model = llama_1b(device, layers=2 if quick else None)
    prefill_tokens = 512 if quick else 8192
    new_tokens = 16 if quick else 64
    results: dict = {
        "config": {
            **LLAMA_1B,
            "num_hidden_layers": model.config.num_hidden_layers,
            "dtype": "bfloat16",
            "attention": "sdpa",
            "prefill_tokens": prefill_tokens,
            "new_tokens": new_tokens,
            "prompt_tokens": 128,
        }
    }
    generator = torch.Generator(device=device).manual_seed(0)

    def prompt(batch, length):
        return torch.randint(0, LLAMA_1B["vocab_size"], (batch, length), device=device, generator=generator)

    def measure(label):
        row = {}
        long_prompt = prompt(1, prefill_tokens)
        with torch.no_grad():
            model(long_prompt, use_cache=False)  # warm-up
            row["prefill_ms"] = 1e3 * statistics.median(
                _cuda_seconds(lambda: model(long_prompt, use_cache=False)) for _ in range(3)
            )
            for batch in (1, 32):
                start = prompt(batch, 128)
                kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
                model.generate(start, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
                seconds = statistics.median(_cuda_seconds(lambda: model.generate(start, **kwargs)) for _ in range(2))
                row[f"decode_tokens_per_s_batch_{batch}"] = batch * new_tokens / seconds
        results[label] = row
        print(f"  {label:32s} " + "  ".join(f"{key} {value:,.1f}" for key, value in row.items()), flush=True)

    for compiled in (False, True) if compile_model else (False,):
        mode = "compiled (static cache)" if compiled else "eager"
        for rope in ("own RoPE", "use_posenc_rope"):
            label = f"{rope}, {mode}"
            if budget.left() < (150 if compiled else 30):
                results[label] = {"skipped": "time budget"}
                continue
            original_forward = model.forward
            try:
                if compiled:
                    torch._dynamo.reset()
                    model.generation_config.cache_implementation = "static"
                    model.forward = torch.compile(model.forward, mode="reduce-overhead")
                with posenc.use_posenc_rope(model) if rope == "use_posenc_rope" else contextlib.nullcontext():
                    measure(label)
            except Exception as failure:
                results[label] = {"error": f"{type(failure).__name__}: {failure}"[:400]}
                print(f"  {label}: {results[label]['error']}", flush=True)
            finally:
                model.forward = original_forward
                model.generation_config.cache_implementation = None
    for mode in ("eager", "compiled (static cache)"):
        own, ours = results.get(f"own RoPE, {mode}", {}), results.get(f"use_posenc_rope, {mode}", {})
        ratios = {}
        if "prefill_ms" in own and "prefill_ms" in ours:
            ratios["prefill_speedup"] = own["prefill_ms"] / ours["prefill_ms"]
        for key in ("decode_tokens_per_s_batch_1", "decode_tokens_per_s_batch_32"):
            if key in own and key in ours:
                ratios[key.replace("tokens_per_s", "speedup")] = ours[key] / own[key]
        if ratios:
            results[f"posenc / own, {mode}"] = ratios
    return results


# ------------------------------------------------------------------------------------------ report
def print_rows(title: str, rows: dict) -> None:
    print(title, flush=True)
    for label, row in rows.items():
        if "error" in row:
            print(f"  {label:24s} {row['error']}")
            continue
        error = row.get("max_abs_error_vs_float64")
        print(
            f"  {label:24s} device {row['device_us']:9.1f} us  host {row['host_us_per_call']:7.1f} us/call  "
            f"{row.get('fraction_of_copy', float('nan')):5.2f} of a copy"
            + (f"  max error {error:.2e}" if error is not None else ""),
            flush=True,
        )


def environment(device) -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{
            name: version(name)
            for name in ("triton", "transformers", "liger-kernel", "flashinfer-python", "flash-attn")
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small shapes, a two-layer model, short timings")
    parser.add_argument("--no-model", action="store_true", help="the kernels only")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile (peers and the model)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds; later parts are skipped past it")
    parser.add_argument("--output", type=Path, default=ROOT / "_build" / "bench-gpu.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench-gpu: no CUDA device on this machine; nothing measured (run make bench-gpu on a machine with one)")
        return 0
    budget = Budget(args.budget)
    device = torch.device("cuda")
    report = {**environment(device), "kernels": {}, "skipped": []}
    print(" ".join(f"{key}={value}" for key, value in report.items() if key not in ("kernels", "skipped")))
    shapes = QUICK_SHAPES if args.quick else SHAPES
    for name, shape in shapes.items():
        for dtype in (torch.bfloat16, torch.float32):
            for backward in (False, True) if name in BACKWARD_SHAPES else (False,):
                key = f"{name}, {str(dtype).removeprefix('torch.')}, {'backward' if backward else 'forward'}"
                if budget.left() < (200 if not args.no_model else 20):
                    report["skipped"].append(key)
                    continue
                report["kernels"][key] = kernel_rows(
                    name, shape, dtype, device, backward, args.quick, compile_peers=not args.no_compile
                )
                print_rows(key, report["kernels"][key])
                torch.cuda.empty_cache()
    if not args.no_model:
        print("1B Llama (random weights), own RoPE against use_posenc_rope", flush=True)
        try:
            report["model"] = model_rows(device, args.quick, budget, compile_model=not args.no_compile)
        except ImportError as missing:
            report["model"] = {"skipped": f"transformers missing: {missing}"}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    if report["skipped"]:
        print("skipped for time:", ", ".join(report["skipped"]))
    print(f"bench-gpu: wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
