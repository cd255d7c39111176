"""python -m bench [--quick | --device] [--only NAME ...] [--results DIR]: run the measures, write the results."""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.core import MEASURES, REPO, Context, Result, exit_on_sigterm, write_json

RESULTS = Path(__file__).resolve().parent / "results"
MODULES = (
    "bench.dag_parse",
    "bench.clusters",
    "bench.ray_jobs",
    "bench.workload",
    "bench.preflight",
    "bench.serving",
    "bench.pipeline",
    "bench.chip_hours",
    "bench.storage",
    "bench.controlplane",
    "bench.device",
)
DEVICE_MODULES = ("bench.device",)  # --device imports no other: the chip machine has no Ray, Airflow or pyarrow


def _airflow_home() -> None:
    """A throw-away Airflow home (as tests/conftest.py does), set before anything imports airflow."""
    if "AIRFLOW_HOME" in os.environ and os.environ.get("TPUFLOW_BENCH_KEEP_AIRFLOW_HOME"):
        return
    home = Path(tempfile.mkdtemp(prefix="tpuflow-bench-airflow-"))
    (home / "dags").mkdir()
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(home / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("ray", "jax", "torch", "apache-airflow-core", "apache-airflow-task-sdk"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "ray": versions["ray"],
        "jax": versions["jax"],
        "torch": versions["torch"],
        "airflow": versions["apache-airflow-core"],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_average_at_start": [round(x, 2) for x in load],
    }


def commit() -> str | None:
    """The commit measured: TPUFLOW_BENCH_COMMIT (a machine the tracked files were copied to), else git's."""
    if os.environ.get("TPUFLOW_BENCH_COMMIT"):
        return os.environ["TPUFLOW_BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def device_machine() -> dict[str, Any]:
    """machine() plus the chip jax finds, its JAX/jaxlib/libtpu versions and the commit."""
    from bench.device import chip

    found = chip()
    return {**machine(), "chip": found, "jax": found.get("jax"), "commit": commit()}


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    chip = m.get("chip") or {}
    lines = [
        *(
            [
                f"Chip: {chip.get('device_kind')} x {chip.get('device_count')} ({chip.get('platform')}), JAX "
                f"{chip.get('jax')}, jaxlib {chip.get('jaxlib')}, libtpu {chip.get('libtpu')}; commit {m.get('commit')}"
                + (f"; rows skipped: {chip['skip']}" if chip.get("skip") else ""),
                "",
            ]
            if chip
            else []
        ),
        f"Measured {m['date']} on {m['cpu_count']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, "
        f"Python {m['python']}, Ray {m['ray']}, JAX {m['jax']}, torch {m['torch']}, Airflow {m['airflow']}; "
        f"load average at start {m['load_average_at_start']}; {data['mode']} run, {data['wall_s']:.0f} s.",
        "",
        "| measure | value | unit | baseline | ratio | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["measures"]:
        name = f"{r['name']} ({r['variant']})" if r.get("variant") else r["name"]
        lines.append(f"| {name} | {_fmt(r['value'])} | {r['unit']} | {_fmt(r['baseline'])} | {_fmt(r['ratio'])} | "
                     f"{r['goal']} | {_fmt(r['met'])} |")  # fmt: skip
    lines += ["", "Baselines and notes:", ""]
    for r in data["measures"]:
        name = f"{r['name']} ({r['variant']})" if r.get("variant") else r["name"]
        text = "; ".join(x for x in (f"baseline: {r['baseline_is']}" if r.get("baseline_is") else "",
                                     f"ratio: {r['ratio_means']}", r.get("notes") or "") if x)  # fmt: skip
        lines.append(f"- **{name}** — {text}")
    if data.get("errors"):
        lines += ["", "Measures that failed in this run:", ""]
        lines += [f"- **{e['measure']}**: {e['error']}" for e in data["errors"]]
    return "\n".join(lines) + "\n"


def charts(results: list[Result], out: Path) -> list[str]:
    """One PNG per result with series (e.g. latency percentiles, step times), plus a summary of ratios."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib is not installed: no charts (pip install matplotlib, or make install)")
        return []
    written = []
    for r in results:
        if not r.series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, ys in r.series.items():
            if label.endswith("_x"):
                continue
            xs = r.series.get(f"{label}_x") or list(range(len(ys)))
            ax.plot(xs, ys, marker="." if len(ys) < 60 else None, label=label)
        ax.set_title(f"{r.name} {r.variant}".strip())
        ax.set_ylabel(r.details.get("series_unit", r.unit))
        ax.set_xlabel(r.details.get("series_x", "sample"))
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        name = f"{r.name}{'_' + r.variant if r.variant else ''}.png".replace("/", "_").replace(" ", "_")
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        written.append(name)
    rows = [r for r in results if r.ratio is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
        labels = [f"{r.name} {r.variant}".strip() for r in rows]
        colors = ["tab:green" if r.met else "tab:red" if r.met is False else "tab:gray" for r in rows]
        ax.barh(labels, [r.ratio for r in rows], color=colors)
        ax.set_xscale("log")
        ax.set_xlabel("ratio to the baseline measured in the same run (green: goal met)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(out / "summary.png", dpi=90)
        plt.close(fig)
        written.append("summary.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the CI-sized set (the two pipeline measures are left out)"
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run only this measure (repeatable)"
    )
    parser.add_argument(
        "--serving",
        action="store_true",
        help="the serving set: every serve_* measure, the slice replicas (multi-host, single-host TPU) included",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the evaluate job's driver (eval_examples_per_s; one more job, ~25 s)",
    )
    parser.add_argument(
        "--device",
        action="store_true",
        help="the rows measured on a TPU chip (bench/device.py), written to device.json; skipped without one",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"output folder (default {RESULTS})")
    parser.add_argument("--list", action="store_true", help="list the measures and exit")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if not args.device:
        _airflow_home()  # (it sets JAX_PLATFORMS=cpu: never on the chip)
    sys.path.insert(0, str(REPO))
    for mod in DEVICE_MODULES if args.device else MODULES:
        importlib.import_module(mod)
    if args.list:
        for m in MEASURES.values():
            where = ("  (--device)" if m.device else "" if m.in_quick else "  (full set only)" if m.in_full
                     else "  (--serving / --only only)")  # fmt: skip
            print(f"{m.name}{where}: rows {', '.join(m.produces)}")
        return 0
    unknown = [n for n in args.only if not any(n in m.produces for m in MEASURES.values() if m.device == args.device)]
    if unknown:
        parser.error(
            f"unknown measure(s) {unknown}"
            + (
                " (a chip row needs --device)"
                if any(n in m.produces for m in MEASURES.values() for n in unknown)
                else ""
            )
            + f"; known: {sorted({p for m in MEASURES.values() if m.device == args.device for p in m.produces})}"
        )
    only = [*args.only, *(m.name for m in MEASURES.values() if args.serving and m.name.startswith("serve_"))]
    chosen = [m for m in MEASURES.values() if m.device == args.device and
              (any(n in m.produces for n in only) if only else m.device or (m.in_quick if args.quick else m.in_full))]  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.device:
        for old in args.results.glob("*.png"):
            old.unlink()
    started = time.perf_counter()
    data: dict[str, Any] = {
        "machine": device_machine() if args.device else machine(),
        "mode": "device"
        if args.device
        else "quick"
        if args.quick
        else "serving"
        if args.serving and not args.only
        else "full",
        "measures": [],
        "errors": [],
    }
    results: list[Result] = []
    ctx = Context(args.quick, args.results, profile=args.profile)
    try:
        for m in chosen:
            t = time.perf_counter()
            ctx.log(f"--- {m.name}")
            try:
                rows = m.fn(ctx)
            except Exception as err:  # one broken measure must not lose the others' figures
                traceback.print_exc()
                data["errors"].append({"measure": m.name, "error": f"{type(err).__name__}: {str(err)[:500]}"})
                continue
            for r in rows:
                r.details.setdefault("measure_wall_s", round(time.perf_counter() - t, 1))
            results += rows
            ctx.log(f"{m.name} done in {time.perf_counter() - t:.0f}s: "
                    + ", ".join(f"{r.name}{'/' + r.variant if r.variant else ''}={_fmt(r.value)} {r.unit} "
                                f"(ratio {_fmt(r.ratio)}, met {_fmt(r.met)})" for r in rows))  # fmt: skip
    finally:
        ctx.close()
    data["wall_s"] = round(time.perf_counter() - started, 1)
    data["measures"] = [r.row() for r in results]
    data["charts"] = [] if args.device else charts(results, args.results)
    stem = "device" if args.device else "latest"
    write_json(args.results / f"{stem}.json", data)
    (args.results / f"{stem}.md").write_text(markdown(data))
    print((args.results / f"{stem}.md").read_text())
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
