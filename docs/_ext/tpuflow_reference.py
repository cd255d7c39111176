"""The docs' generated references, read from the code at build time so they cannot drift from it.

- ``{tpuflow-params}``: every DAG Param of the pipeline factory (``tpuflow.pipeline.params``: the common Params'
  specs and the GKE pipeline's own), with default and schema.
- ``{tpuflow-variables}``: every Airflow Variable the provider reads, found in its source (``var.value.get(...)``
  templates, ``Variable.get``, ``tpuflow.limits.variable`` and the ``*_VARIABLE`` constants), with the default
  the code gives and the modules that read it.
- ``{tpuflow-connections}``: the connection types ``tpuflow.provider_info`` registers, and the connection ids the
  operators and the pipeline default to.
- ``{tpuflow-env}``: every environment variable the provider reads (``os.environ`` / ``getenv`` in
  operators/tpuflow outside the rehearsal lab, names resolved through module constants, plus the ``*_ENV``
  constants and every ``TPUFLOW_*`` name in the code).
- ``{tpuflow-api}``: one ``automodule`` per public module of the provider (not the rehearsal lab, not the CLI).

The provider's docstrings are plain text with reST's literals and ``:param:`` fields: ``plain_docstring`` (an
``autodoc-process-docstring`` hook) reads an indented block under prose (a code example, a column table) as a
literal block, so the API reference builds without warnings and without editing the code.

``python docs/_ext/tpuflow_reference.py env`` prints the environment variables, one a line (tests/docs use it).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operators" / "tpuflow"
# Not the provider's public surface: the rehearsal lab (moving to tpuflow_rehearsal) and the command line.
PRIVATE_PACKAGES = ("dev", "cli")
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")
TPUFLOW_ENV = re.compile(r"\$(TPUFLOW_[A-Z0-9_]*[A-Z0-9])\b")


def provider_files() -> list[Path]:
    """The provider's Python files (the rehearsal lab and the CLI left out), sorted."""
    files = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if rel[0] in PRIVATE_PACKAGES or "__pycache__" in rel:
            continue
        files.append(path)
    return files


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def public_modules() -> list[str]:
    return [
        module_name(p) for p in provider_files() if not any(s.startswith("_") for s in module_name(p).split(".")[1:])
    ]


# --- environment variables ------------------------------------------------------------------------------
@dataclass
class Found:
    name: str
    modules: set[str] = field(default_factory=set)
    defaults: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def _constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level NAME = "str" / ("str", ...) assignments."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value: Any = None
            if isinstance(node.value, ast.Constant):
                value = node.value.value
            elif isinstance(node.value, ast.Tuple):  # strings and names of earlier string constants
                items = [
                    e.value if isinstance(e, ast.Constant) else out.get(getattr(e, "id", "")) for e in node.value.elts
                ]
                value = tuple(items) if all(isinstance(v, str) for v in items) else None
            if isinstance(value, str) or (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
                out[node.targets[0].id] = value
    return out


def _is_environ(node: ast.AST) -> bool:
    """os.environ, or a local name such code binds it to (environ, source, env)."""
    if isinstance(node, ast.Attribute) and node.attr == "environ":
        return True
    return isinstance(node, ast.Name) and node.id in {"environ", "source"}


def _env_reads(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """(name expression, default expression) of every environment read in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in {"get", "pop", "setdefault"} and _is_environ(f.value):
                if node.args:
                    yield node.args[0], node.args[1] if len(node.args) > 1 else None
            elif isinstance(f, ast.Attribute) and f.attr == "getenv" and node.args:
                yield node.args[0], node.args[1] if len(node.args) > 1 else None
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            yield node.slice, None


def _line_comment(lines: list[str], lineno: int) -> str:
    """The comment at the end of line ``lineno``, else the whole comment block right above it."""
    line = lines[lineno - 1]
    if "#" in line and not line.lstrip().startswith("#") and line.count('"') % 2 == 0:
        return line.split("#", 1)[1].strip()
    block: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        block.insert(0, lines[i].strip()[1:].strip())
        i -= 1
    return " ".join(block)


def environment_variables() -> dict[str, Found]:
    """Every environment variable the provider reads or hands on, by name."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in provider_files()}
    constants: dict[str, Any] = {}
    for tree in trees.values():
        constants.update(_constants(tree))
    found: dict[str, Found] = {}

    def add(name: str, module: str, default: str | None = None, note: str = "") -> None:
        if not ENV_NAME.match(name):
            return
        entry = found.setdefault(name, Found(name))
        entry.modules.add(module)
        if default:
            entry.defaults.add(default)
        if note and note not in entry.notes:
            entry.notes.append(note)

    for path, tree in trees.items():
        module, lines = module_name(path), path.read_text().splitlines()
        local = {**constants, **_constants(tree)}
        functions = [
            (f.lineno, f.end_lineno or f.lineno, (ast.get_docstring(f) or "").split("\n\n")[0].replace("\n", " "))
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        ]

        def purpose(lineno: int, comment: str, functions: list[tuple[int, int, str]] = functions) -> str:
            """The comment at the read, else the docstring's first paragraph of the function that reads it."""
            if comment:
                return comment
            around = [f for f in functions if f[0] <= lineno <= f[1] and f[2]]
            return min(around, key=lambda f: f[1] - f[0])[2] if around else ""

        for name_expr, default_expr in _env_reads(tree):
            default = None
            if default_expr is not None:
                try:
                    default = repr(ast.literal_eval(default_expr))
                except (ValueError, SyntaxError, TypeError):
                    default = ast.unparse(default_expr)
            if isinstance(name_expr, ast.Constant) and isinstance(name_expr.value, str):
                add(name_expr.value, module, default, purpose(name_expr.lineno, _line_comment(lines, name_expr.lineno)))
            elif isinstance(name_expr, ast.Name) and isinstance(local.get(name_expr.id), str):
                add(local[name_expr.id], module, default, purpose(name_expr.lineno, ""))
            elif isinstance(name_expr, ast.Name):  # a library's constant named as its variable (Ray's)
                add(name_expr.id, module, default, "the library's own variable, read as it reads it")
            elif isinstance(name_expr, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "<NAME>" for v in name_expr.values)
                found.setdefault(text, Found(text)).modules.add(module)
        for node in tree.body:  # NAME_ENV = "X" / NAME_ENV = ("X", "Y"): names the module reads or hands on
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
                value = local.get(target)
                if target.endswith(("_ENV", "_SETTINGS")) and value is not None:
                    for name in (value,) if isinstance(value, str) else value:
                        add(name, module, None, _line_comment(lines, node.lineno))
        for match in TPUFLOW_ENV.finditer(path.read_text()):  # $TPUFLOW_X in a docstring or message
            add(match.group(1), module)
    return dict(sorted(found.items()))


# --- Airflow Variables ------------------------------------------------------------------------------------
_VAR_PATTERNS = [
    re.compile(r"""var\.value\.get\(\s*['"](tpuflow_[\w.{}]+)['"]\s*(?:,\s*([^)]*?))?\s*\)"""),
    re.compile(r"""_var\(\s*['"](tpuflow_\w+)['"]\s*,\s*([^)]*?)\s*\)"""),
    re.compile(r"""Variable\.get\(\s*['"](tpuflow_\w+)['"]\s*(?:,\s*(?:default=)?([^)]*?))?\s*\)"""),
    re.compile(r"""\b[A-Z_]*VARIABLE\s*=\s*['"](tpuflow_[\w.{}]+)['"]()"""),
]


def _default_text(text: str) -> str:
    """A default as the code writes it: a literal in one quoting, a call closed again (the pattern stops at ")")."""
    text = text.strip()
    if text.count("(") > text.count(")"):
        text += ")" * (text.count("(") - text.count(")"))
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


def airflow_variables() -> dict[str, Found]:
    found: dict[str, Found] = {}
    for path in provider_files():
        for pattern in _VAR_PATTERNS:
            for match in pattern.finditer(path.read_text()):
                entry = found.setdefault(match.group(1), Found(match.group(1)))
                entry.modules.add(module_name(path))
                if match.group(2):
                    entry.defaults.add(_default_text(match.group(2)))
    return dict(sorted(found.items()))


# --- rendering --------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _modules(entry: Found) -> str:
    return ", ".join(f"``{m}``" for m in sorted(entry.modules))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", "   :width: 100%", ""]
    for row in [header, *rows]:
        out.append("   * - " + (row[0] or " "))
        out.extend("     - " + (cell or " ") for cell in row[1:])
    return out + [""]


def env_rst() -> list[str]:
    rows = [
        [f"``{e.name}``", ", ".join(f"``{d}``" for d in sorted(e.defaults)), _cell("; ".join(e.notes)), _modules(e)]
        for e in environment_variables().values()
    ]
    return _table(["variable", "default in the code", "note in the code", "read or handed on in"], rows)


def variables_rst() -> list[str]:
    rows = [
        [f"``{e.name}``", ", ".join(f"``{_cell(d)}``" for d in sorted(e.defaults)), _modules(e)]
        for e in airflow_variables().values()
    ]
    return _table(["Variable", "default in the code", "read in"], rows)


def params_rst() -> list[str]:
    from tpuflow.pipeline import params

    specs = dict(params.param_specs())
    gke = {
        params.MAX_RUN_DURATION_PARAM: params.max_run_duration_param(),
        params.ZONES_PARAM: params.zones_param(),
        params.ZONE_FAILOVER_PARAM: params.zone_failover_param(),
    }
    rows = []
    for name, spec in specs.items():
        rows.append(_param_row(name, spec.value, spec.schema, "local, GKE"))
    for name, param in gke.items():
        rows.append(_param_row(name, param.value, dict(param.schema), "GKE"))
    steps = ", ".join(f"{step}: {', '.join(names)}" for step, names in params.STEP_PARAMS.items())
    return [
        *_table(["Param", "default", "pipelines", "schema", "title and description"], rows),
        f"A workload without a step has none of that step's Params ({_cell(steps)}).",
        "",
    ]


def _param_row(name: str, default: Any, schema: dict[str, Any], where: str) -> list[str]:
    shown = {k: v for k, v in schema.items() if k not in {"title", "description", "examples", "enum"}}
    if "enum" in schema:
        enum = [v for v in schema["enum"]]
        shown["enum"] = enum if len(enum) <= 8 else f"{len(enum)} choices"
    if "examples" in schema:
        shown["examples"] = f"{len(schema['examples'])} shapes"
    text = schema.get("title", "") + (": " + schema["description"] if schema.get("description") else "")
    return [f"``{name}``", f"``{json.dumps(default)}``", where, f"``{_cell(json.dumps(shown))}``", _cell(text)]


def connections_rst() -> list[str]:
    from tpuflow.provider_info import get_provider_info

    info = get_provider_info()
    rows = [
        [f"``{c['connection-type']}``", c["hook-name"], f"``{c['hook-class-name']}``"] for c in info["connection-types"]
    ]
    ids: dict[str, set[str]] = defaultdict(set)
    for path in provider_files():
        for match in re.finditer(r"""\b(\w+_conn_id)\s*(?::\s*[\w|\[\] ]+)?=\s*['"]([\w-]+)['"]""", path.read_text()):
            ids[f"``{match.group(1)}`` = ``{match.group(2)}``"].add(module_name(path))
    id_rows = [[key, ", ".join(f"``{m}``" for m in sorted(mods))] for key, mods in sorted(ids.items())]
    return [
        "Connection types the provider registers (``tpuflow.provider_info``):",
        "",
        *_table(["conn_type", "shown as", "hook"], rows),
        "Connection ids the code defaults to (an argument's default; the operators also take other ids):",
        "",
        *_table(["argument = default", "in"], id_rows),
        "The operators also use the providers' own connection types: ``google_cloud_platform`` (GKE, Compute, "
        "Cloud Quotas, GCS) and ``kubernetes`` (a cluster the GKE credentials cannot reach).",
        "",
    ]


def api_rst() -> list[str]:
    out: list[str] = []
    for module in public_modules():
        title = f"``{module}``"
        out += [title, "-" * len(title), "", f".. automodule:: {module}", "   :members:", ""]
    return out


# --- docstrings: the provider's are plain text with reStructuredText's literals and fields -----------------------
_FIELD = re.compile(r"^:[\w ]+:")
_ITEM = re.compile(r"^([-*+]|\d+[.)])\s")
_COLUMNS = re.compile(r"\S {3,}\S.* {3,}\S")  # a line laid out in columns (a table written as text)
_TRAILING_UNDERSCORE = re.compile(r"(?<=[\w\]])_(?=[\s,.;:)\]-]|$)")
_SHARED_PARAM = re.compile(r"^(\s*):param (\w+)((?:, \w+)+):")  # one entry for several arguments


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _escape_references(line: str) -> str:
    """``word_`` outside literals is a reference in reST, in these docstrings just text."""
    parts = line.split("``")
    return "``".join(p if i % 2 else _TRAILING_UNDERSCORE.sub(r"\\_", p) for i, p in enumerate(parts))


def plain_docstring(lines: list[str]) -> list[str]:
    """The docstring as reST reads it the way its author meant it: an indented block under a prose paragraph
    (a code example, a continuation table) is a literal block, a paragraph laid out in columns is one too, and
    a field list after prose starts a block of its own. Fields, list items and blocks already marked ``::``
    are left as they are."""
    out: list[str] = []
    para_start: str | None = None  # the first line of the paragraph being read
    literal_base: int | None = None  # inside a literal block: the indent it must stay deeper than
    shift = ""  # what a literal block this function opened indents its lines by
    for line in lines:
        if not line.strip():
            out.append(line)
            para_start = None if literal_base is None else para_start
            continue
        indent = _indent(line)
        if literal_base is not None:
            if indent > literal_base:
                out.append(shift + line)
                continue
            if out and out[-1].strip():
                out.append("")
            literal_base, para_start, shift = None, None, ""
        prose = (
            para_start is not None and not _FIELD.match(para_start.lstrip()) and not _ITEM.match(para_start.lstrip())
        )
        if para_start is not None and prose and _FIELD.match(line.lstrip()):
            out.append("")  # a field list right under prose
            para_start = line
            out.append(line)
            continue
        if out and not out[-1].strip() and para_start is None and indent > 0 and _prev_prose_indent(out) is not None:
            base = _prev_prose_indent(out)
            if base is not None and indent > base and not _prev_text(out).rstrip().endswith("::"):
                _mark_literal(out)
                literal_base = base
                out.append(line)
                continue
        if para_start is not None and prose and indent > _indent(out[-1]) and not out[-1].rstrip().endswith("::"):
            out[-1] = out[-1].rstrip() + (":" if out[-1].rstrip().endswith(":") else " ::")
            out.append("")
            literal_base = _indent(para_start)
            out.append(line)
            continue
        if para_start is None and _COLUMNS.search(line.strip()) and not _FIELD.match(line.lstrip()):
            out += ["::", ""]
            literal_base, shift = -1, "    "
            out.append(shift + line)
            continue
        if para_start is None:
            para_start = line
        out.append(_escape_references(line))
    return out


def _prev_text(out: list[str]) -> str:
    return next((line for line in reversed(out) if line.strip()), "")


def _prev_prose_indent(out: list[str]) -> int | None:
    """The indent of the paragraph before the blank line(s) at the end of ``out``, when it is prose."""
    i = len(out) - 1
    while i >= 0 and not out[i].strip():
        i -= 1
    if i < 0:
        return None
    while i > 0 and out[i - 1].strip():
        i -= 1
    first = out[i].lstrip()
    if _FIELD.match(first) or _ITEM.match(first) or first.startswith(".. "):
        return None
    return _indent(out[i])


def _mark_literal(out: list[str]) -> None:
    i = len(out) - 1
    while not out[i].strip():
        i -= 1
    text = out[i].rstrip()
    out[i] = text + (":" if text.endswith(":") else " ::")


def _shared_params(line: str) -> str:
    """``:param a, b: text`` (reST would read ``a,`` as a type): ``:param a: with ``b``: text``."""
    match = _SHARED_PARAM.match(line)
    if not match:
        return line
    others = ", ".join(f"``{n.strip()}``" for n in match.group(3).split(",") if n.strip())
    return f"{match.group(1)}:param {match.group(2)}: with {others}:{line[match.end() :]}"


def _process_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = plain_docstring([_shared_params(line) for line in lines])


GENERATORS = {
    "tpuflow-params": params_rst,
    "tpuflow-variables": variables_rst,
    "tpuflow-connections": connections_rst,
    "tpuflow-env": env_rst,
    "tpuflow-api": api_rst,
}


def _generated_pages(app: Any, env: Any, added: set[str], changed: set[str], removed: set[str]) -> list[str]:
    return [doc for doc in ("reference/api", "reference/configuration") if doc in env.found_docs]


def setup(app: Any) -> dict[str, Any]:
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective
    from sphinx.util.nodes import nested_parse_with_titles

    def directive(generate: Any) -> type:
        class Generated(SphinxDirective):
            has_content = False

            def run(self) -> list[Any]:
                from docutils import nodes

                for path in provider_files():  # rebuild the page when the code it reads changes
                    self.env.note_dependency(str(path))
                container = nodes.section() if generate is api_rst else nodes.container()
                lines = StringList(generate(), source=f"<{generate.__name__}>")
                nested_parse_with_titles(self.state, lines, container)
                return list(container.children)

        return Generated

    for name, generate in GENERATORS.items():
        app.add_directive(name, directive(generate))
    app.connect("autodoc-process-docstring", _process_docstring)
    # The generated pages are read again on every build: a module or a setting added to the code shows at once
    # (a file-level dependency would miss a new module).
    app.connect("env-get-outdated", _generated_pages)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if sys.argv[1:] == ["env"]:
        print("\n".join(environment_variables()))
    elif sys.argv[1:] == ["variables"]:
        print("\n".join(airflow_variables()))
    else:
        sys.exit("usage: tpuflow_reference.py env|variables")
