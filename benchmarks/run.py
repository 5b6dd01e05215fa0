"""make bench: posenc's RoPE against the libraries people use, and the book's timings.

Prints a table and writes it as JSON to _build/bench.json. Every speed figure is a ratio of contenders
measured side by side in one run (their repetitions interleaved, see timing.py), so it holds on a busy
machine even when the absolute times do not.

Sections: RoPE forward on CPU (fp32 and bf16, two shapes, q and k both; throughput relative to posenc and as
a fraction of the bandwidth of a plain out-of-place copy of q and k); backward and in place (CPU, fp32); in fp32
also a copy and posenc's kernel writing into buffers that already exist (the difference to the plain copy is the
cost of a fresh output's memory pages, which every out-of-place operation pays);
one generation step at (8, 32 + 8 kv, 1, 128), one thread, each sequence at its own position (decode: cos/sin
and the rotation of q and k, against transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb); a summary in the form
of the README's table; bf16 precision against
float64 at positions 0..100 000; the book (each chapter's execution time against its target, "over" where missed,
never a failure; with ``--book`` also ``make book`` from nothing, timed in a fresh copy); the live redraw time,
median and slowest run, of every interactive
figure of the book (each chapter executed with ``POSENC_REDRAW_LOG``); the same forward harness on CUDA when a
GPU is present.

Usage, from the repository root:
python -m benchmarks.run [--book] [--quick] [--budget SECONDS] [--output PATH] [--sections LIST]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import torch

import posenc
from benchmarks import peers
from benchmarks.timing import interleaved, median_ratio, rounds_for, synchronizer, time_call

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((1, 32, 4096, 128), (4, 16, 2048, 128))
QUICK_SHAPES = ((1, 8, 1024, 128),)
PRECISION_POSITIONS = 100_001
SLIDER_LIMIT_SECONDS = 0.1
DECODE_SHAPE = (8, 32, 1, 128)  # (B, H, T, D): one new token per sequence, as in generation
DECODE_KV_HEADS = 8  # k: (8, 8, 1, 128), grouped-query attention as in Llama 3
DECODE_STEPS = 200  # steps per timed sample: one step is tens of microseconds


# ----------------------------------------------------------------------------------------------- machine
def machine() -> dict:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        model = names[0] if names else model
    info = {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for name, (_, distribution) in peers.PEERS.items():
        info[name] = peers.version(distribution)
    if info["torchtune"]:
        info["torchtune_loaded_from"] = peers.torchtune_module()[1]
    return info


# ----------------------------------------------------------------------------------------------- speed
def forward_contenders(shape, dtype, device, in_place: bool, available: dict) -> tuple[dict, dict]:
    """name -> zero-argument call rotating q and k; name -> the check of its result against posenc."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    k = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    head_dim, seq_len = shape[-1], shape[-2]
    cos, sin = peers.posenc_tables(head_dim, seq_len, device)
    expected = {layout: posenc.apply_rope(q, cos, sin, layout) for layout in ("half", "interleaved")}
    calls = {"copy": lambda: (q.clone(), k.clone())}
    calls["posenc"] = lambda r=peers.posenc_rotation(head_dim, seq_len, dtype, device): r(q, k)
    calls["posenc compiled"] = lambda r=peers.posenc_rotation(head_dim, seq_len, dtype, device, True): r(q, k)
    if in_place:
        buffers = q.clone(), k.clone()  # rotated again and again: a rotation keeps them bounded
        calls["posenc in-place"] = lambda r=peers.posenc_in_place(head_dim, seq_len, dtype, device): r(*buffers)
        calls["posenc in-place compiled"] = lambda r=peers.posenc_in_place(head_dim, seq_len, dtype, device, True): r(
            *buffers
        )
        # what a fresh output costs: the same two results written into buffers whose pages already exist
        targets = torch.empty_like(q).zero_(), torch.empty_like(k).zero_()
        calls["copy into reused buffers"] = lambda: (targets[0].copy_(q), targets[1].copy_(k))
        calls["posenc into reused buffers"] = lambda r=peers.posenc_into(head_dim, seq_len, dtype, device): r(
            q, k, *targets
        )
    checks = {}
    for name, builder in available.items():
        rotate = builder(head_dim, seq_len, dtype, device)
        native = peers.native_layout(name, q), peers.native_layout(name, k)
        calls[name] = lambda rotate=rotate, native=native: rotate(*native)
        layout = "interleaved" if name in peers.INTERLEAVED else "half"
        checks[name] = lambda out, name=name, layout=layout: _max_difference(
            peers.native_layout(name, out[0]), expected[layout]
        )
    checks["posenc compiled"] = lambda out: _max_difference(out[0], expected["half"])
    return calls, checks


def _max_difference(actual, expected) -> float:
    return float((actual.float() - expected.float()).abs().max())


def measure(calls: dict, checks: dict, shape, dtype, device, budget: float, reference: str = "posenc") -> dict:
    """Warm every contender up (first calls compile), then time them interleaved."""
    sync = synchronizer(device)
    first_call, warm, differences, caught = {}, {}, {}, []
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            first_call[name] = time_call(call, sync)  # compiles, fills caches
            sync()
            start = time.perf_counter()
            out = call()
            sync()
            warm[name] = time.perf_counter() - start
        caught += [f"{name}: {w.message}" for w in record if issubclass(w.category, RuntimeWarning)]
        if name in checks:
            differences[name] = checks[name](out)
        del out
    rounds = rounds_for(sum(warm.values()), budget)
    times = interleaved(calls, rounds, sync)
    return summary(times, shape, dtype, device, first_call, differences, caught, reference)


def summary(times, shape, dtype, device, first_call, differences, caught, reference="posenc") -> dict:
    """One row per contender: median time, bandwidth, and the two side-by-side ratios."""
    nbytes = 4 * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()  # read q, k; write two outputs
    rows = []
    for name, samples in times.items():
        median = sorted(samples)[len(samples) // 2]
        rows.append(
            {
                "contender": name,
                "median_ms": round(1e3 * median, 2),
                "GB_per_s": round(nbytes / median / 1e9, 2),
                "vs_posenc": round(median_ratio(times[reference], samples), 3),
                "fraction_of_copy": round(median_ratio(times["copy"], samples), 3),
                "first_call_s": round(first_call.get(name, 0.0), 2),
                "max_diff_vs_posenc": None if name not in differences else round(differences[name], 5),
            }
        )
    return {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "shape": list(shape),
        "rounds": len(times[reference]),
        "rows": rows,
        "warnings": caught,
        "times_s": times,
    }


def forward_section(device, shapes, budget, available) -> list:
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for shape in shapes:
            in_place = dtype == torch.float32
            calls, checks = forward_contenders(shape, dtype, device, in_place, available)
            results.append(measure(calls, checks, shape, dtype, device, budget))
            print_speed(f"forward, {device}, {results[-1]['dtype']}, q and k {tuple(shape)}", results[-1])
    return results


def backward_section(shapes, budget, available) -> list:
    """CPU fp32: time of the backward pass alone (the forward runs untimed before each repetition)."""
    device, dtype, results = torch.device("cpu"), torch.float32, []
    for shape in shapes:
        head_dim, seq_len = shape[-1], shape[-2]
        generator = torch.Generator().manual_seed(1)
        q, k = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        grads = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        rotations = {
            "posenc": peers.posenc_rotation(head_dim, seq_len, dtype, device),
            "posenc compiled": peers.posenc_rotation(head_dim, seq_len, dtype, device, True),
        }
        rotations.update({name: b(head_dim, seq_len, dtype, device) for name, b in available.items()})

        def prepare(name, rotate):
            def forward_then_backward():
                leaves = [peers.native_layout(name, t).detach().requires_grad_() for t in (q, k)]
                outputs = rotate(*leaves)
                upstream = [peers.native_layout(name, g) for g in grads]
                return lambda: torch.autograd.grad(outputs, leaves, upstream)

            return forward_then_backward

        calls = {"copy": lambda: (q.clone(), k.clone())}
        preparers = {}
        for name, rotate in rotations.items():
            preparers[name] = prepare(name, rotate)
            calls[name] = None
        first = {name: time_call(preparers[name](), lambda: None) for name in rotations}  # compiles
        warm = {name: time_call(preparers[name](), lambda: None) for name in rotations}
        warm["copy"] = time_call(calls["copy"], lambda: None)
        rounds = rounds_for(2 * sum(warm.values()), budget)  # x2: the untimed forward passes
        times = interleaved(calls, rounds, lambda: None, prepare=preparers)
        results.append(summary(times, shape, dtype, device, first, {}, []))
        print_speed(f"backward, cpu, float32, q and k {tuple(shape)}", results[-1])
    return results


def decode_section(
    budget, available, shape=DECODE_SHAPE, steps: int = DECODE_STEPS, kv_heads: int = DECODE_KV_HEADS
) -> list:
    """CPU: one generation step, q ``shape`` and k with ``kv_heads`` heads (GQA) of one new token per sequence,
    each sequence at its own position (``1000 + 37 b + step``: batched decoding of sequences of different lengths).

    A sample is ``steps`` consecutive steps; transformers computes its cos and sin from ``position_ids`` ``(B, 1)``
    inside every step, as its models do (``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb``); posenc's
    ``RotaryEmbedding`` is called with the per-sequence offsets (a ``(B,)`` tensor) and with the position ids.
    Per-step times; ``vs_transformers`` = transformers' time / the contender's (target: >= 1, one thread).
    """
    device, results = torch.device("cpu"), []
    if "transformers" not in available:
        print("\ndecode: transformers is not installed, skipped")
        return results
    batch, n_heads, _, head_dim = shape
    for dtype in (torch.float32, torch.bfloat16):
        generator = torch.Generator().manual_seed(2)
        q = torch.randn(shape, generator=generator).to(dtype)
        k = torch.randn((batch, kv_heads, *shape[2:]), generator=generator).to(dtype)
        starts = [1000 + 37 * torch.arange(batch) + s for s in range(steps)]  # (B,): each sequence elsewhere
        ids = [start[:, None] for start in starts]
        builders = {
            "transformers": peers.transformers_decode_step(head_dim, n_heads, dtype, device),
            "posenc (per-sequence offsets)": peers.posenc_decode_step(head_dim, n_heads, dtype, device, "offset"),
            "posenc (position ids)": peers.posenc_decode_step(head_dim, n_heads, dtype, device, "positions"),
        }
        expected = builders["transformers"](q, k, starts[0], ids[0])
        differences = {
            name: max(_max_difference(o, e) for o, e in zip(step(q, k, starts[0], ids[0]), expected))
            for name, step in builders.items()
        }

        def run(step):
            def many():
                for s in range(steps):
                    step(q, k, starts[s], ids[s])

            return many

        calls = {name: run(step) for name, step in builders.items()}
        for call in calls.values():
            call()  # warm up: the first call builds posenc's table cache
        warm = sum(time_call(call, lambda: None) for call in calls.values())
        times = interleaved(calls, rounds_for(warm, budget, low=5, high=21), lambda: None)
        rows = []
        for name, samples in times.items():
            median = sorted(samples)[len(samples) // 2]
            rows.append(
                {
                    "contender": name,
                    "us_per_step": round(1e6 * median / steps, 1),
                    "vs_transformers": round(median_ratio(times["transformers"], samples), 3),
                    "max_diff_vs_transformers": round(differences[name], 6),
                }
            )
        results.append(
            {
                "device": "cpu",
                "dtype": str(dtype).replace("torch.", ""),
                "shape": list(shape),
                "kv_heads": kv_heads,
                "threads": torch.get_num_threads(),
                "steps_per_sample": steps,
                "rounds": len(times["transformers"]),
                "rows": rows,
                "times_s": times,
            }
        )
        print_table(
            f"decode step, cpu, {results[-1]['dtype']}, q {tuple(shape)}, {kv_heads} kv heads, each sequence "
            f"at its own position, {torch.get_num_threads()} thread(s), {steps} steps per sample  "
            f"[{results[-1]['rounds']} interleaved rounds]",
            ["contender", "us_per_step", "vs_transformers", "max_diff_vs_transformers"],
            rows,
        )
    return results


# ----------------------------------------------------------------------------------------------- precision
def float64_rotation(x: torch.Tensor, positions: torch.Tensor, base: float = 10_000.0) -> torch.Tensor:
    """The exact RoPE of ``x`` (half layout) in float64: angles ``m * base^(-2i/D)`` in float64 throughout."""
    head_dim = x.shape[-1]
    inv_freq = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * inv_freq
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.double()[..., : head_dim // 2], x.double()[..., head_dim // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def precision_section(available, n_positions: int = PRECISION_POSITIONS) -> list:
    """Every library rotates the same feature pairs: interleaved libraries get ``x`` permuted so that their
    pair ``(2i, 2i + 1)`` holds the values of posenc's pair ``(i, i + D/2)``, and their output is permuted back."""
    head_dim = 128
    x = torch.randn(1, 1, n_positions, head_dim, generator=torch.Generator().manual_seed(2)).bfloat16()
    exact = float64_rotation(x, torch.arange(n_positions))
    to_half = posenc.interleaved_to_half_permutation(head_dim)
    to_interleaved = torch.argsort(to_half)
    rotations = {
        "posenc": peers.posenc_rotation(head_dim, n_positions, torch.bfloat16, "cpu"),
        "posenc compiled": peers.posenc_rotation(head_dim, n_positions, torch.bfloat16, "cpu", True),
    }
    rotations.update({name: b(head_dim, n_positions, torch.bfloat16, "cpu") for name, b in available.items()})
    rows = []
    for name, rotate in rotations.items():
        interleaved = name in peers.INTERLEAVED
        native = peers.native_layout(name, x[..., to_interleaved] if interleaved else x)
        out = peers.native_layout(name, rotate(native, native)[0])  # back to (B, H, L, D)
        error = (out[..., to_half] if interleaved else out).double().sub(exact).abs()
        rows.append(
            {
                "contender": name,
                "max_error": float(error.max()),
                "mean_error": float(error.mean()),
                "max_error_first_4096": float(error[..., :4096, :].max()),
            }
        )
    floor = (exact.bfloat16().double() - exact).abs()  # rounding the exact result to bf16: no output does better
    rows.append(
        {
            "contender": "exact result rounded to bf16",
            "max_error": float(floor.max()),
            "mean_error": float(floor.mean()),
            "max_error_first_4096": float(floor[..., :4096, :].max()),
        }
    )
    print_table(
        f"precision: bf16 x (1, 1, {n_positions}, {head_dim}), positions 0..{n_positions - 1}, "
        "absolute error against float64",
        ["contender", "max_error", "mean_error", "max_error_first_4096"],
        rows,
    )
    return rows


# ----------------------------------------------------------------------------------------------- the book
def chapter_times(times_file: Path) -> dict:
    """Each chapter's last recorded time against its target (book_files.TARGETS: reported, never enforced)."""
    from book.tools.book_files import target_seconds

    if not times_file.exists():
        return {"measured": False, "note": f"{times_file.relative_to(ROOT)} not found: run make book first"}
    records = json.loads(times_file.read_text())
    chapters = {}
    for name, record in sorted(records.items()):
        seconds, target = record.get("seconds"), target_seconds(name)
        chapters[Path(name).stem] = {
            "seconds": seconds,
            "target": target,
            "ok": record.get("ok"),
            "over_target": seconds is not None and seconds > target,
        }
    return {
        "measured": True,
        "source": str(times_file.relative_to(ROOT)) if times_file.is_relative_to(ROOT) else str(times_file),
        "chapters": chapters,
        "sum_seconds": round(sum(c["seconds"] or 0 for c in chapters.values()), 1),
        "over_target": [name for name, c in chapters.items() if c["over_target"]],
    }


def clean_book_build() -> dict:
    """``make book`` in a fresh copy of the working tree (so the shared _build is left alone), timed."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    with tempfile.TemporaryDirectory(prefix="posenc-book-") as tmp:
        copy = Path(tmp) / "book"
        for name in filter(None, files):
            source = ROOT / name
            if source.is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, copy / name)
        (copy / ".venv").symlink_to(ROOT / ".venv")  # the installed environment, not a new install
        print(
            "\nbook: `make book` from nothing (no _build: model cache, every chapter, the HTML) in a fresh copy ...",
            flush=True,
        )
        start = time.perf_counter()
        # the copy's posenc and tools, not the venv's editable install of this tree: its kernels write the figure
        # files and the model cache into the copy's _build, from nothing
        env = {**os.environ, "PYTHONPATH": str(copy)}
        for name in ("POSENC_FRAMES_DIR", "POSENC_CACHE_DIR"):
            env.pop(name, None)
        # -o: the shared venv's install stamp is taken as up to date (the copy's files must not reinstall it)
        result = subprocess.run(
            ["make", "book", "-o", ".venv/.installed-stamp"], cwd=copy, capture_output=True, text=True, env=env
        )
        seconds = time.perf_counter() - start
        chapters = chapter_times(copy / "_build" / "executed" / "times.json")
        chapters.pop("source", None)
        return {
            "seconds": round(seconds, 1),
            "ok": result.returncode == 0,
            "chapters": chapters,
            "load_average_at_end": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
            "tail": result.stdout[-2000:] + result.stderr[-2000:] if result.returncode else "",
        }


def book_section(run_book: bool) -> dict:
    section = {"chapters": chapter_times(ROOT / "_build" / "executed" / "times.json")}
    section["clean_make_book"] = (
        clean_book_build()
        if run_book
        else {"measured": False, "note": "not run: pass --book (a clean make book takes minutes)"}
    )
    print_book(section)
    return section


# ----------------------------------------------------------------------------------------------- sliders
def redraw_section(names=(), log_dir: Path | None = None) -> dict:
    """The live redraw time (draw + PNG, what a dragged slider waits for) of every interactive figure of the book,
    in wall time and in CPU time.

    Each chapter is executed on a fresh kernel with live figures, one thread (as run_notebooks.py with two jobs
    gives each) and ``POSENC_REDRAW_LOG`` set, so that every
    :class:`posenc.lab.interactive.InteractiveFigure` it shows times 7 redraws that step through its sliders
    (after one untimed redraw that lays it out) and logs them. ``log_dir`` keeps the logs (default: a temporary
    directory).
    """

    notebooks = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if not names or any(n in p.stem for n in names))
    rows, chapters = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(log_dir or scratch)
        logs.mkdir(parents=True, exist_ok=True)
        for notebook in notebooks:
            log = (logs / f"{notebook.stem}.jsonl").resolve()
            log.unlink(missing_ok=True)
            start = time.perf_counter()
            errors = execute_for_redraws(notebook, log)
            records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            chapters[notebook.stem] = {
                "ok": not errors,
                "figures": len(records),
                "errors": errors,
                "seconds": round(time.perf_counter() - start, 1),
            }
            for number, record in enumerate(records, 1):
                rows.append(
                    {
                        "chapter": notebook.stem[:2],
                        "figure": number,
                        "caption": record["caption"][:60],
                        "axes": record["axes"],
                        "runs": len(record.get("times_ms", [])),
                        "median_ms": record["median_ms"],
                        "slowest_ms": record["max_ms"],
                        "cpu_ms": record["median_cpu_ms"],
                        "slowest_cpu_ms": record.get("max_cpu_ms"),
                        "load": record["load_average"],
                        "under_100_ms": record["median_ms"] <= 1e3 * SLIDER_LIMIT_SECONDS,
                        "slowest_under_100_ms": record["max_ms"] <= 1e3 * SLIDER_LIMIT_SECONDS,
                        "cpu_under_100_ms": record["median_cpu_ms"] <= 1e3 * SLIDER_LIMIT_SECONDS,
                    }
                )
            status = "ok" if not errors else "errors in cells " + ", ".join(str(e["cell"]) for e in errors)
            print(
                f"  {notebook.stem}: {len(records)} interactive figures, {status} "
                f"({chapters[notebook.stem]['seconds']} s)",
                flush=True,
            )
    columns = ["chapter", "figure", "caption", "axes", "runs", "median_ms", "slowest_ms", "cpu_ms"]
    if any(r["slowest_cpu_ms"] is not None for r in rows):
        columns.append("slowest_cpu_ms")
    print_table(
        "live slider: one redraw (draw + PNG) of every interactive figure, median and slowest of the runs",
        columns + ["load", "under_100_ms", "cpu_under_100_ms"],
        rows,
    )
    slow = [r for r in rows if not r["under_100_ms"]]
    slowest = [r for r in rows if not r["slowest_under_100_ms"]]
    slow_cpu = [r for r in rows if not r["cpu_under_100_ms"]]
    print(
        f"  {len(rows)} figures: {len(slow)} over {1e3 * SLIDER_LIMIT_SECONDS:.0f} ms of wall time at the median, "
        f"{len(slowest)} in their slowest run, {len(slow_cpu)} at the median in CPU time (cpu_ms: the process time "
        "of a redraw; wall time also counts waits for a busy core)"
    )
    return {"limit_ms": 1e3 * SLIDER_LIMIT_SECONDS, "figures": rows, "chapters": chapters}


def execute_for_redraws(notebook: Path, log: Path) -> list:
    """Execute ``notebook`` on a fresh kernel as the book does, but with live figures and every cell run even
    after an error (so that a failing assert does not hide the figures below it); returns the errors."""
    import nbformat
    from nbclient import NotebookClient

    from book.tools.book_files import hang_guard_seconds
    from book.tools.run_notebooks import kernel_config, kernel_env
    from posenc.lab.interactive import REDRAW_LOG_ENV

    env = {**kernel_env("live", 1), REDRAW_LOG_ENV: str(log), "PYTHONPATH": str(ROOT)}
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb,
        timeout=hang_guard_seconds(notebook),
        kernel_name="python3",
        config=kernel_config(),
        allow_errors=True,
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    client.execute(env=env)
    return [
        {"cell": i, "error": f"{o.get('ename')}: {o.get('evalue', '')[:200]}"}
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
        if o.get("output_type") == "error"
    ]


# ----------------------------------------------------------------------------------------------- summary
def issue_table(report: dict) -> list:
    """The headline figures: posenc's default path, compiled=True and transformers, as fractions of a copy."""

    def row_of(result, name):
        return next((r for r in result["rows"] if r["contender"] == name), None)

    rows = []
    for result in report.get("forward_cpu", []):
        for name in ("posenc", "posenc in-place"):
            compiled = "posenc compiled" if name == "posenc" else "posenc in-place compiled"
            mine, fused, hf = row_of(result, name), row_of(result, compiled), row_of(result, "transformers")
            if mine is None:
                continue
            rows.append(
                {
                    "case": f"{'in place, ' if 'in-place' in name else ''}{result['dtype']} "
                    f"{tuple(result['shape'])}, fraction of copy",
                    "posenc default": mine["fraction_of_copy"],
                    "compiled=True": fused["fraction_of_copy"] if fused else None,
                    "transformers eager": hf["fraction_of_copy"] if hf and "in-place" not in name else None,
                    "default vs transformers": round(1 / hf["vs_posenc"], 2) if hf and "in-place" not in name else None,
                }
            )
    for result in report.get("decode_cpu", []):
        hf = row_of(result, "transformers")
        for name in ("posenc (per-sequence offsets)", "posenc (position ids)"):
            mine = row_of(result, name)
            rows.append(
                {
                    "case": f"decode step ({name[8:-1]}), {result['dtype']} {tuple(result['shape'])}, "
                    f"us per step (transformers {hf['us_per_step']})",
                    "posenc default": mine["us_per_step"],
                    "default vs transformers": mine["vs_transformers"],
                }
            )
    for result in report.get("backward_cpu", []):
        mine, fused, hf = (row_of(result, n) for n in ("posenc", "posenc compiled", "transformers"))
        rows.append(
            {
                "case": f"backward, {result['dtype']} {tuple(result['shape'])}, fraction of copy",
                "posenc default": mine["fraction_of_copy"],
                "compiled=True": fused["fraction_of_copy"],
                "transformers eager": hf["fraction_of_copy"] if hf else None,
                "default vs transformers": round(1 / hf["vs_posenc"], 2) if hf else None,
            }
        )
    print_table(
        "summary (fractions of a plain copy of q and k; last column: speed of posenc's default path "
        "relative to transformers)",
        ["case", "posenc default", "compiled=True", "transformers eager", "default vs transformers"],
        rows,
    )
    return rows


# ----------------------------------------------------------------------------------------------- printing
def print_table(title: str, columns: list[str], rows: list[dict]) -> None:
    def cell(value):
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 10 else f"{value:,.1f}"
        return "-" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))


def print_speed(title: str, result: dict) -> None:
    print_table(
        f"{title}  [{result['rounds']} interleaved rounds]",
        ["contender", "median_ms", "GB_per_s", "vs_posenc", "fraction_of_copy", "first_call_s", "max_diff_vs_posenc"],
        result["rows"],
    )
    for warning in result["warnings"]:
        print(f"  warning: {warning}")


def print_chapters(title: str, chapters: dict) -> None:
    rows = [
        {
            "chapter": n,
            "seconds": c["seconds"],
            "target": c.get("target"),
            "over": "over" if c.get("over_target") else "",
            "ok": c["ok"],
        }
        for n, c in chapters["chapters"].items()
    ]
    print_table(title, ["chapter", "seconds", "target", "over", "ok"], rows)
    print(
        f"  sum {chapters['sum_seconds']} s (run_notebooks.py runs two chapters at a time); "
        f"{len(chapters['over_target'])} of {len(rows)} over target "
        "(targets: idle 2 cores; reported, never enforced)"
    )


def print_book(section: dict) -> None:
    chapters = section["chapters"]
    if chapters.get("measured"):
        print_chapters(f"book: chapter execution times against their targets (from {chapters['source']})", chapters)
    else:
        print(f"\nbook: chapter times not measured ({chapters['note']})")
    build = section["clean_make_book"]
    if "seconds" in build:
        if build["chapters"].get("measured"):
            print_chapters("book: chapter times of that clean make book", build["chapters"])
        print(
            f"  clean make book (from nothing): {build['seconds']} s, {'ok' if build['ok'] else 'FAILED'} "
            f"(load average at the end {build.get('load_average_at_end')})"
        )
        if not build["ok"]:
            print(build["tail"])
    else:
        print(f"  clean make book: {build['note']}")


# ----------------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--book", action="store_true", help="also time `make book` from nothing, in a fresh copy of the tree (minutes)"
    )
    parser.add_argument("--quick", action="store_true", help="small shapes, few rounds: a smoke test")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timing per configuration")
    parser.add_argument("--output", type=Path, default=ROOT / "_build" / "bench.json")
    parser.add_argument(
        "--sections",
        default="forward,decode,backward,precision,book,redraw",
        help="comma-separated subset of forward,decode,backward,precision,book,redraw",
    )
    parser.add_argument(
        "--redraw-logs",
        type=Path,
        default=ROOT / "_build" / "redraw",
        help="where the per-chapter redraw logs are kept",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    budget = args.budget or (3.0 if args.quick else 20.0)
    start = time.perf_counter()
    report = {"machine": machine()}
    print("machine: " + ", ".join(f"{k}={v}" for k, v in report["machine"].items()))
    available, missing = peers.available_peers()
    report["missing_peers"] = missing
    for name, reason in missing.items():
        print(f"  {name}: skipped ({reason})")
    cpu = torch.device("cpu")
    if "forward" in sections:
        report["forward_cpu"] = forward_section(cpu, shapes, budget, available)
    if "backward" in sections:
        report["backward_cpu"] = backward_section(shapes, budget, available)
    if "decode" in sections:  # one thread, as the target (>= 1.0x transformers) is stated
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            report["decode_cpu"] = decode_section(budget / 2, available)
        finally:
            torch.set_num_threads(threads)
    if {"forward", "backward", "decode"} & sections:
        report["summary"] = issue_table(report)
    if "precision" in sections:
        report["precision_bf16"] = precision_section(available, 4097 if args.quick else PRECISION_POSITIONS)
    if "book" in sections:
        report["book"] = book_section(args.book)
    if "redraw" in sections:
        report["redraw"] = redraw_section(("01",) if args.quick else (), args.redraw_logs)
    if torch.cuda.is_available() and "forward" in sections:
        report["forward_cuda"] = forward_section(torch.device("cuda"), shapes, budget, available)
    else:
        report["forward_cuda"] = {"measured": False, "note": "no CUDA device"}
        print("\nCUDA: no device, skipped")
    report["machine"]["load_average_at_end"] = (
        [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
    )
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output} in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
