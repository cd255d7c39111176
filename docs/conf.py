"""Sphinx configuration of tpuflow's docs (``make docs``: warnings are errors, nitpicky references)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The provider's source root, so autodoc imports this checkout's tpuflow; _ext holds the docs' own extension.
sys.path[:0] = [str(ROOT / "operators"), str(DOCS / "_ext")]
# Importing the provider imports Airflow: give it a throw-away home, never the user's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="tpuflow-docs-airflow-"))

project = "tpuflow"
author = "tpuflow contributors"
copyright = "tpuflow contributors"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "tpuflow_reference",  # the generated configuration and API references (docs/_ext/tpuflow_reference.py)
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4

# Nitpicky: every cross-reference must resolve. autodoc writes no type hints into signatures or fields
# (they name Airflow's, Kubernetes' and Google's types, which have no inventory offline); the docstrings' own
# :class: / :func: references to tpuflow are checked.
nitpicky = True
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
# A method without a docstring of its own shows none (not Airflow's or requests' base-class text).
autodoc_inherit_docstrings = False
add_module_names = False
# Third-party names docstrings mention with a role; there is no intersphinx inventory offline (CI may have no
# internet), so these are listed, never silenced wholesale.
nitpick_ignore_regex = [
    ("py:.*", r"(airflow|kubernetes|kubernetes_asyncio|google|ray|pyarrow|jsonschema|requests)(\..*)?"),
    ("py:.*", r"(Any|Callable|Mapping|Sequence|Iterable|Iterator|Path|datetime|timedelta|Context)"),
    # typing forms autodoc prints for annotated module data and type variables
    ("py:.*", r"'?(dict|list|tuple|set|Callable)\[.*"),
    ("py:obj", r"tpuflow\..*\._?[A-Z]\w?"),
]

html_theme = "alabaster"
html_title = "tpuflow"
# The code is 120 columns wide (ruff's line length): a page wide enough to show it without scrolling.
html_theme_options = {"page_width": "1360px", "sidebar_width": "260px"}
html_static_path: list[str] = []
