"""Execute the book's notebooks, each top to bottom on a fresh kernel, offline, in parallel.

Executed copies go to ``_build/executed/<same path>``, timings to ``_build/executed/times.json``. A failure
names the notebook and the cell. Usage, from the repository root:
``python -m book.tools.run_notebooks [--jobs N] [--output-dir DIR] [--figures MODE] [NAME ...]`` (names filter by
substring). Figures are static sliders (the book build) unless ``--figures live`` (or
``POSENC_RUN_FIGURES=live``) asks for the live ipywidgets, as Jupyter and Colab show them: then matplotlib keeps
the kernel's own inline backend, as there.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from book.tools.book_files import ROOT, executed_dir, execution_settings, toc_notebooks

KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "POSENC_FIGURES": "static",
    "MPLBACKEND": "Agg",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


FIGURE_MODES = ("static", "live")


def kernel_env(figures: str, threads: int) -> dict:
    if figures not in FIGURE_MODES:
        raise ValueError(f"figures must be one of {FIGURE_MODES}, got {figures!r}")
    env = {**os.environ, **KERNEL_ENV, "POSENC_FIGURES": figures,
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if figures == "live":
        env.pop("MPLBACKEND")
    return env


def execute(path: str, threads: int, output_dir: str | None = None, figures: str = "static") -> dict:
    """Run one notebook; return a record with its time and, on failure, the failing cell."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    settings = execution_settings()
    notebook_path = Path(path)
    env = kernel_env(figures, threads)
    relative = notebook_path.relative_to(ROOT)
    record = {"notebook": str(relative), "ok": True}
    start = time.perf_counter()
    for attempt in (1, 2):
        nb = nbformat.read(notebook_path, as_version=4)
        client = NotebookClient(nb, timeout=settings.get("timeout", 300), kernel_name="python3",
                                resources={"metadata": {"path": str(notebook_path.parent)}})
        try:
            client.execute(env=env)
        except (CellExecutionError, CellTimeoutError) as error:
            index = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                          and any(o.get("output_type") == "error" for o in cell.get("outputs", []))), None)
            record.update(ok=False, cell=index, source=nb.cells[index].source if index is not None else "",
                          error=str(error)[-4000:])
        except Exception as error:  # the kernel itself failed (e.g. two kernels raced for one port): once more
            if attempt == 2:
                record.update(ok=False, cell=None, source="", error=f"kernel failure: {error!r}")
            else:
                print(f"retrying {relative}: kernel failure {error!r}", flush=True)
                start = time.perf_counter()
                continue
        break
    record["seconds"] = round(time.perf_counter() - start, 2)
    target = Path(output_dir or executed_dir()) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return record


def run(names=(), jobs: int = 2, output_dir: Path | None = None, figures: str = "static") -> list[dict]:
    notebooks = [p for p in toc_notebooks() if not names or any(n in p.name for n in names)]
    if not notebooks:
        raise SystemExit(f"no notebook in _toc.yml matches {list(names)}")
    # the longest-running chapters start first (by last recorded time), so two workers finish together
    output_dir = Path(output_dir or executed_dir())
    times_file = output_dir / "times.json"
    previous = json.loads(times_file.read_text()) if times_file.exists() else {}
    notebooks.sort(key=lambda p: -previous.get(str(p.relative_to(ROOT)), {}).get("seconds", 0))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    records = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(execute, str(p), threads, str(output_dir), figures) for p in notebooks]
        for future in as_completed(futures):
            record = future.result()
            records.append(record)
            status = "ok" if record["ok"] else f"FAILED in code cell {record['cell']}"
            print(f"{record['seconds']:8.1f} s  {record['notebook']}  {status}", flush=True)
    merged = {**previous, **{r["notebook"]: r for r in records}}
    times_file.parent.mkdir(parents=True, exist_ok=True)
    times_file.write_text(json.dumps(merged, indent=1))
    return records


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m book.tools.run_notebooks", description=__doc__)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("POSENC_JOBS", "2")))
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where the executed copies go (default: _build/executed, which the HTML build reads)")
    parser.add_argument("--figures", choices=FIGURE_MODES, default=os.environ.get("POSENC_RUN_FIGURES", "static"),
                        help="static sliders (the book build, default) or live ipywidgets (Jupyter, Colab)")
    args = parser.parse_args()
    records = run(args.names, args.jobs, args.output_dir, args.figures)
    failures = [r for r in records if not r["ok"]]
    for r in failures:
        print(f"\n=== {r['notebook']}: cell {r['cell']} raised ===\n{r['source']}\n--- error ---\n{r['error']}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
