"""Execute the book's notebooks, each top to bottom on a fresh kernel, offline, in parallel.

Executed copies go to ``_build/executed/<same path>``, timings to ``_build/executed/times.json``, one log per
chapter to ``_build/executed/logs/<chapter>.log`` (a failing cell's source and full traceback). One line is
printed per chapter as it finishes, then a table of each chapter's time against its target (book_files.TARGETS:
reported, never enforced). A chapter fails when a cell raises, or when it runs longer than ten times its target:
a hang guard, so that a stuck kernel fails and a slow machine does not. A failure names the chapter, the cell
(its position in the notebook's cell list), the first lines of the error and the log.

Usage, from the repository root:
``python -m book.tools.run_notebooks [--jobs N] [--output-dir DIR] [--figures MODE] [--no-table] [NAME ...]``
(names filter by substring), or ``python -m book.tools.run_notebooks --report`` for the table of the last run.
Figures are static sliders (the book build) unless ``--figures live`` (or ``POSENC_RUN_FIGURES=live``) asks for the
live ipywidgets, as Jupyter and Colab show them: then matplotlib keeps the kernel's own inline backend, as there.

The kernels are local processes, reached over Unix sockets (IPC transport), not TCP.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from book.tools.book_files import (
    HANG_GUARD_FACTOR,
    ROOT,
    executed_dir,
    hang_guard_seconds,
    target_seconds,
    toc_notebooks,
)

KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "POSENC_FIGURES": "static",
    "MPLBACKEND": "Agg",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # no progress bars: in a kernel tqdm draws an ipywidgets bar, which a static page would keep as a dead widget
    # (e.g. transformers dequantising chapter 12's GGUF file when its cache is missing)
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}

FIGURE_MODES = ("static", "live")
ERROR_LINES = 8  # lines of a failing cell's error printed; the log has all of them
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def kernel_env(figures: str, threads: int) -> dict:
    if figures not in FIGURE_MODES:
        raise ValueError(f"figures must be one of {FIGURE_MODES}, got {figures!r}")
    # the kernels start in notebooks/: PYTHONPATH makes them import this checkout's posenc, also where the venv's
    # editable install points at another checkout (a git worktree sharing the venv)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env = {
        **os.environ,
        **KERNEL_ENV,
        "POSENC_FIGURES": figures,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    if figures == "live":
        env.pop("MPLBACKEND")
    return env


def kernel_arguments(figures: str) -> list[str]:
    """A static build's kernels draw no progress widget (book/tools/kernel_startup.py); live ones are as in Jupyter."""
    if figures == "static":
        return [f"--IPKernelApp.exec_files={[str(Path(__file__).with_name('kernel_startup.py'))]}"]
    return []


def kernel_config():
    """Kernels on Unix sockets (IPC transport; TCP on Windows, which has none). Over TCP ipykernel warns that its
    traffic is unencrypted; the kernels here are local, and over IPC nothing leaves the machine to encrypt."""
    from traitlets.config import Config

    config = Config()
    if os.name != "nt":
        config.KernelManager.transport = "ipc"
        # the socket files' prefix: absolute (the kernel runs in the notebook's folder) and unique to this process
        prefix = f"posenc-kernel-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        config.KernelManager.ip = str(Path(tempfile.gettempdir()) / prefix)
    return config


def log_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "logs"


def widget_views(nb) -> list[int]:
    """Indices of the cells whose outputs hold an ipywidgets view (dead on a static page)."""
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and any(WIDGET_VIEW in output.get("data", {}) for output in cell.get("outputs", []))
    ]


def execute(path: str, threads: int, output_dir: str | None = None, figures: str = "static") -> dict:
    """Run one notebook; return a record with its time and, on failure, the failing cell and the error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    notebook_path = Path(path)
    output_dir = Path(output_dir or executed_dir())
    env = kernel_env(figures, threads)
    relative = notebook_path.relative_to(ROOT)
    guard = hang_guard_seconds(notebook_path)
    record = {"notebook": str(relative), "ok": True, "target": target_seconds(notebook_path), "hang_guard": guard}
    current = {"cell": None}
    for attempt in (1, 2):
        start = time.perf_counter()
        deadline = start + guard
        nb = nbformat.read(notebook_path, as_version=4)

        def remaining(cell, deadline=deadline):  # each cell may use what is left of the chapter's hang guard
            return max(1, int(deadline - time.perf_counter()) + 1)

        def started(cell, cell_index, **_):
            current["cell"] = cell_index

        client = NotebookClient(
            nb,
            kernel_name="python3",
            config=kernel_config(),
            startup_timeout=120,
            extra_arguments=kernel_arguments(figures),
            timeout_func=remaining,
            on_cell_execute=started,
            resources={"metadata": {"path": str(notebook_path.parent)}},
        )
        try:
            client.execute(env=env)
        except CellTimeoutError:
            index = current["cell"]
            record.update(
                ok=False,
                cell=index,
                source=nb.cells[index].source if index is not None else "",
                error=(
                    f"hang guard: the chapter was still running after {guard} s, {HANG_GUARD_FACTOR} "
                    f"times its time target of {record['target']} s, so it was stopped in this cell. "
                    "Time targets are reported, not enforced; only a run this long fails (a hang)."
                ),
            )
        except CellExecutionError as error:
            index = next(
                (
                    i
                    for i, cell in enumerate(nb.cells)
                    if cell.cell_type == "code"
                    and any(o.get("output_type") == "error" for o in cell.get("outputs", []))
                ),
                current["cell"],
            )
            record.update(
                ok=False,
                cell=index,
                source=nb.cells[index].source if index is not None else "",
                error=error_text(nb, index) or ANSI.sub("", str(error)),
            )
        except Exception as error:  # the kernel itself failed to start or died: once more
            if attempt == 2:
                record.update(ok=False, cell=current["cell"], source="", error=f"kernel failure: {error!r}")
            else:
                print(f"retrying {relative}: kernel failure {error!r}", flush=True)
                continue
        break
    record["seconds"] = round(time.perf_counter() - start, 2)
    if record["ok"] and figures == "static" and widget_views(nb):
        cells = widget_views(nb)
        record.update(
            ok=False,
            cell=cells[0],
            source=nb.cells[cells[0]].source,
            error=f"cells {cells} display an ipywidgets view, which a static page cannot show (a progress "
            "bar? book/tools/kernel_startup.py and TQDM_DISABLE keep tqdm's off)",
        )
    target = output_dir / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    record["log"] = str(write_log(record, log_dir(output_dir), stderr_of(nb)))
    return record


def stderr_of(nb) -> list[str]:
    """What the cells wrote to stderr (warnings, mostly), each headed by its cell's index."""
    return [
        f"--- cell {i} stderr ---\n{ANSI.sub('', output.get('text', '')).rstrip()}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("name") == "stderr"
    ]


def error_text(nb, index) -> str:
    """The error output of cell ``index``: ``Name: value`` and the traceback, without terminal colours."""
    if index is None:
        return ""
    for output in nb.cells[index].get("outputs", []):
        if output.get("output_type") == "error":
            traceback = ANSI.sub("", "\n".join(output.get("traceback", [])))
            return f"{output.get('ename')}: {output.get('evalue')}\n{traceback}".strip()
    return ""


def write_log(record: dict, directory: Path, stderr: list[str] = ()) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{Path(record['notebook']).stem}.log"
    lines = [
        f"{record['notebook']}: {'ok' if record['ok'] else 'FAILED'} in {record.get('seconds')} s "
        f"(target {record['target']} s, hang guard {record['hang_guard']} s)"
    ]
    if not record["ok"]:
        lines += [
            f"cell {record['cell']} (position in the notebook's cell list)",
            "--- cell source ---",
            record["source"],
            "--- error ---",
            record["error"],
        ]
    lines += stderr
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path.resolve()


def display_path(path) -> str:
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def failure_summary(record: dict) -> str:
    """Chapter, cell, the first lines of the error, and where the full log is."""
    lines = record["error"].splitlines()
    head = "\n".join(f"    {line}" for line in lines[:ERROR_LINES])
    more = f"\n    ... ({len(lines) - ERROR_LINES} more lines)" if len(lines) > ERROR_LINES else ""
    return (
        f"{Path(record['notebook']).stem} FAILED in cell {record['cell']}:\n{head}{more}\n"
        f"  full log: {display_path(record['log'])}"
    )


def progress_line(record: dict, done: int, total: int) -> str:
    status = "ok" if record["ok"] else f"FAILED (cell {record['cell']})"
    return f"[{done}/{total}] {Path(record['notebook']).stem:28s} {record['seconds']:7.1f} s  {status}"


def run(names=(), jobs: int = 2, output_dir: Path | None = None, figures: str = "static") -> list[dict]:
    notebooks = [p for p in toc_notebooks() if not names or any(n in p.name for n in names)]
    if not notebooks:
        raise SystemExit(f"no notebook in _toc.yml matches {list(names)}")
    # the longest-running chapters start first (by last recorded time), so two workers finish together
    output_dir = Path(output_dir or executed_dir())
    times_file = output_dir / "times.json"
    previous = json.loads(times_file.read_text()) if times_file.exists() else {}
    notebooks.sort(key=lambda p: -previous.get(str(p.relative_to(ROOT)), {}).get("seconds", 0))
    threads = max(1, (os.cpu_count() or 1) // jobs)  # as in a full run, however few chapters are selected
    jobs = max(1, min(jobs, len(notebooks)))
    print(
        f"executing {len(notebooks)} chapter{'s' * (len(notebooks) > 1)}, {jobs} at a time, each on a fresh local "
        f"kernel; logs in {display_path(log_dir(output_dir))}",
        flush=True,
    )
    records = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(execute, str(p), threads, str(output_dir), figures) for p in notebooks]
        for future in as_completed(futures):
            record = future.result()
            records.append(record)
            print(progress_line(record, len(records), len(notebooks)), flush=True)
    merged = {**previous, **{r["notebook"]: r for r in records}}
    times_file.parent.mkdir(parents=True, exist_ok=True)
    times_file.write_text(json.dumps(merged, indent=1))
    order = [str(p.relative_to(ROOT)) for p in toc_notebooks()]
    return sorted(records, key=lambda r: order.index(r["notebook"]) if r["notebook"] in order else len(order))


def time_table(records: list[dict]) -> str:
    """Each chapter's time against its target; "over" where it missed it. Targets are for an idle 2-core machine."""
    rows = [f"{'chapter':28s} {'seconds':>8s} {'target':>7s}", f"{'-' * 28} {'-' * 8} {'-' * 7}"]
    over = 0
    for record in records:
        seconds, target = record.get("seconds"), target_seconds(record["notebook"])
        late = seconds is not None and seconds > target
        over += late
        status = "over" if late else ""
        if not record.get("ok", True):
            status = (status + " FAILED").strip()
        rows.append(
            f"{Path(record['notebook']).stem:28s} {seconds if seconds is not None else '-':>8} "
            f"{target:>7d}  {status}".rstrip()
        )
    total = sum(r.get("seconds") or 0 for r in records)
    rows.append(f"{'sum':28s} {total:8.1f}")
    rows.append(
        f"{over} of {len(records)} over target. Time targets (idle 2-core machine) are reported, never "
        f"enforced; a chapter fails only past {HANG_GUARD_FACTOR}x its target (hang guard)."
    )
    return "\n".join(rows)


def last_records(output_dir: Path | None = None) -> list[dict]:
    """The records of the book's chapters in times.json (the last run of each), in reading order."""
    times_file = Path(output_dir or executed_dir()) / "times.json"
    recorded = json.loads(times_file.read_text()) if times_file.exists() else {}
    return [recorded[n] for n in (str(p.relative_to(ROOT)) for p in toc_notebooks()) if n in recorded]


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m book.tools.run_notebooks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("POSENC_JOBS", "2")))
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where the executed copies go (default: _build/executed, which the HTML build reads)",
    )
    parser.add_argument(
        "--figures",
        choices=FIGURE_MODES,
        default=os.environ.get("POSENC_RUN_FIGURES", "static"),
        help="static sliders (the book build, default) or live ipywidgets (Jupyter, Colab)",
    )
    parser.add_argument(
        "--no-table",
        action="store_true",
        help="no time table after a successful run (make book prints it at its very end)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="execute nothing: print the time table of the last run recorded in times.json",
    )
    args = parser.parse_args()
    if args.report:
        records = last_records(args.output_dir)
        print(f"\nchapter times ({display_path(Path(args.output_dir or executed_dir()) / 'times.json')})")
        print(time_table(records) if records else "no chapter has run yet")
        return 0
    records = run(args.names, args.jobs, args.output_dir, args.figures)
    failures = [r for r in records if not r["ok"]]
    if failures or not args.no_table:
        print("\n" + time_table(records))
    for record in failures:
        print("\n" + failure_summary(record))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
