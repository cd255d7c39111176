"""`tpuflow local up|status|down|env|preempt`: the embedded Ray cluster from a shell. `tpuflow local gcs up|down`
(a GCS emulator on loopback) comes with the rehearsal distribution (tpuflow_rehearsal.cli.gcs_cmd)."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tpuflow.cli.slice_cmd import add_slice_arguments, slice_from_args
from tpuflow.errors import UserInputError
from tpuflow.naming import check_dns_label
from tpuflow.validation import check_count, check_folder, check_seconds

if TYPE_CHECKING:
    from tpuflow.local.cluster import LocalRayCluster

DEFAULT_NAME = "tpuflow-local"


def _base_dir(args: argparse.Namespace) -> Path:
    from tpuflow.local.cluster import default_base_dir

    check_folder("--base-dir", args.base_dir)
    return Path(args.base_dir) if args.base_dir else default_base_dir()


def _clusters(args: argparse.Namespace) -> list[LocalRayCluster]:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

    base = _base_dir(args)
    names = [args.name] if getattr(args, "name", None) else sorted(p.parent.name for p in base.glob(f"*/{STATE_FILE}"))
    found: list[LocalRayCluster] = []
    for name in names:
        if (base / name / STATE_FILE).exists():
            found.append(LocalRayCluster.load(base / name))
        elif getattr(args, "name", None):
            raise UserInputError(
                "name", name, f"no local cluster of that name under {base}; see `tpuflow local status`"
            )
    return found


def _up(args: argparse.Namespace) -> int:
    from tpuflow.local.cluster import LocalRayCluster

    check_dns_label("--name", args.name)

    tpu = slice_from_args(args).require(ray=True)
    if args.host_cpus is not None:
        check_count("--host-cpus", args.host_cpus, minimum=1)
    print(f"Starting {args.name}: {tpu.summary()}", file=sys.stderr)
    for caveat in tpu.ray_caveats():
        print(f"note: {caveat}", file=sys.stderr)
    cluster = LocalRayCluster.start(tpu, args.name, _base_dir(args), host_cpus=args.host_cpus)
    print(json.dumps(cluster.connection_info(), indent=2))
    print(
        f'Use it from a shell: eval "$(tpuflow local env --name {args.name})"; stop it: tpuflow local down --name {args.name}',
        file=sys.stderr,
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    clusters = _clusters(args)
    if not clusters:
        print(f"no local clusters under {_base_dir(args)}")
    for c in clusters:
        state = "running" if c.is_alive() else "dead (state left behind; `tpuflow local down` cleans it)"
        if c.kept and c.is_alive():
            state += " (kept by its run's keep_endpoint: the reaper leaves it; `tpuflow local down` stops it)"
        if c.pending_preemption and c.is_alive():
            p = c.pending_preemption
            state += (
                f" (host {p['slice_index']}/{p['worker_id']} left drained by a killed `tpuflow local preempt`: "
                f"the next `tpuflow local preempt --name {c.name}` or start adopting it replaces it)"
            )
        shape = f"{c.slice['generation']} {c.slice['topology']}" if c.slice else "no slice"
        print(f"{c.name}: {state}; {shape}; {len(c.nodes)} Ray nodes; dashboard {c.dashboard_url}; serve {c.serve_url}")
    return 0


def _down(args: argparse.Namespace) -> int:
    clusters = _clusters(args)
    for c in clusters:
        stopped = c.stop()
        print(f"stopped {c.name} ({len(stopped)} process groups/pids signalled)")
    if not clusters:
        print("nothing to stop")
    return 0


def _env(args: argparse.Namespace) -> int:
    (cluster,) = _clusters(args)  # --name always names one (its default: tpuflow-local)
    for key, value in cluster.client_env().items():
        # Quoted: a state folder (the token file's path) may hold a space, a quote or $(...).
        print(f"export {key}={shlex.quote(str(value))}")
    return 0


def _notice_seconds(text: str) -> float:
    """``30s``, ``2m`` or plain seconds (``0``: no notice, a sudden kill)."""
    from tpuflow.cost.reaper import parse_duration

    value = float(text) if str(text).strip().isdigit() else parse_duration(text, "--notice")
    return check_seconds("--notice", value, allow_zero=True, maximum=3600) or 0.0


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _preempt(args: argparse.Namespace) -> int:

    check_count("--host", args.host, minimum=0, what="a TPU worker id")
    check_count("--slice", args.slice, minimum=0, what="a slice index")
    check_seconds("--restart-after", args.restart_after, allow_zero=True, maximum=3600)
    notice = _notice_seconds(args.notice)
    (cluster,) = _clusters(args)
    if cluster.finish_preemption():  # an earlier preempt of it was killed with its host drained
        print(f"finished the earlier preemption of {cluster.name} that its command left unfinished", flush=True)
    if args.no_restart and notice:
        raise UserInputError("--notice", args.notice, "--no-restart kills at once; drop --notice or --no-restart")
    if args.no_restart:
        pid = cluster.kill_host(args.slice, args.host)
        print(
            f"killed simulated TPU host {args.slice}/{args.host} of {cluster.name} (process group {pid}); it stays down"
        )
        return 0

    def drained(deadline: float) -> None:
        print(
            f"drained simulated TPU host {args.slice}/{args.host} of {cluster.name} for preemption "
            f"(reason PREEMPTION); it is killed in {deadline - time.time():.0f}s",
            flush=True,
        )

    # SIGTERM as Ctrl-C: an interrupted notice still ends with the drained host replaced (preempt_host)
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        pid = cluster.preempt_host(
            args.slice, args.host, restart_after=args.restart_after, notice_s=notice, on_drained=drained
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(
        f"preempted simulated TPU host {args.slice}/{args.host} of {cluster.name} (process group {pid}); "
        f"a replacement joined after {args.restart_after:.0f}s"
    )
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add `tpuflow local`; returns its verbs, where other distributions' verbs join (`local gcs`)."""
    parser = sub.add_parser("local", help="run the embedded Ray cluster with a simulated TPU slice")
    verbs = parser.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser, name_default: str | None) -> None:
        p.add_argument(
            "--name", default=name_default, help="cluster name" + (" (default: all)" if not name_default else "")
        )
        p.add_argument("--base-dir", default=None, help="where cluster state lives (default $TPUFLOW_HOME/clusters)")

    commands = {
        # verb: (help, default --name (None: every cluster), handler)
        "up": ("start a cluster simulating a slice", DEFAULT_NAME, _up),
        "status": ("list local clusters", None, _status),
        "down": ("stop a cluster (default: every local cluster) by pid, never `ray stop`", None, _down),
        "env": ("print the environment for ray CLI / ray.init against a cluster", DEFAULT_NAME, _env),
        "preempt": (
            "preempt one simulated TPU host, with or without notice, as a spot reclaim would",
            DEFAULT_NAME,
            _preempt,
        ),
    }
    parsers = {}
    for verb, (help_text, name_default, func) in commands.items():
        parsers[verb] = verbs.add_parser(verb, help=help_text)
        if verb == "up":
            add_slice_arguments(parsers[verb])
        common(parsers[verb], name_default)
        parsers[verb].set_defaults(func=func)
    parsers["up"].add_argument(
        "--host-cpus",
        type=int,
        default=None,
        help="CPUs each simulated TPU host offers Ray (default: one per TPU device of the host)",
    )
    preempt = parsers["preempt"]
    preempt.add_argument("--host", type=int, required=True, help="TPU worker id within the slice")
    preempt.add_argument("--slice", type=int, default=0, help="slice index (default 0)")
    preempt.add_argument("--restart-after", type=float, default=5.0, help="seconds until the replacement host starts")
    preempt.add_argument("--no-restart", action="store_true", help="leave the host down (the slice stays broken)")
    preempt.add_argument(
        "--notice",
        default="0",
        help="termination notice, e.g. 30s: the host's Ray node is drained with reason PREEMPTION and this "
        "deadline, as on GKE, and killed at it (default 0: a sudden kill)",
    )
    preempt.set_defaults(func=_preempt)
    return verbs
