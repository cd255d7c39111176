"""`tpuflow render ...`: print what the operators would send, exactly as sent."""

from __future__ import annotations

import argparse

from tpuflow.cli import render_kuberay, render_nodepool


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("render", help="print a request body or manifest for a slice")
    renderers = parser.add_subparsers(dest="what", required=True)
    # Each renderer module adds one subcommand (nodepool, raycluster, rayservice).
    render_nodepool.register(renderers)
    render_kuberay.register(renderers)
