"""What a team plugs into the pipeline: its own code and steps (``tpuflow.pipeline.workload.Workload``).

The DAG factories (tpuflow.pipeline.factory.build_pipeline_dag, tpuflow.pipeline.gke.build_gke_pipeline_dag)
read every step from one Workload; each optional step that is None removes its task(s), and the
pipeline's guarantees (lease, budget, preflight, ledger, teardowns) stay wired around what is left.

The steps' contracts (what each is called with on the Ray cluster):

- ``prep``: ``python -m <prep> --output-dir RUN/data --date YYYY-MM-DD --num-train N --num-heldout M``;
  it writes the training dataset to RUN/data/train (and the held-out set to RUN/data/heldout), which the
  train loop gets as its ``train`` dataset shard. RUN/data is emptied before each new prep job (a rerun of the
  date replaces the data, never adds to it).
- ``train_loop``: Ray Train's ``train_loop_per_worker`` (JaxTrainer or TorchTrainer, Param ``framework``),
  given ``train_loop_config={"num_steps": <Param train_steps>, "checkpoint_every": <Param checkpoint_every>}``
  (steps between the checkpoints it reports to Ray Train).
- ``evaluate``: ``python -m <evaluate> --framework F --checkpoint CKPT --output RUN/eval/F.json``
  (``--data RUN/data/heldout`` with ``prep``; ``--num-hosts``, ``--tpu-per-host``, ``--accelerator-type``
  when it runs on the training slice); its result line's ``accuracy`` is gated by Param
  ``accuracy_threshold`` before anything is deployed.
- ``evaluate_in_training``: the train loop evaluates instead, on its warm workers after the last step (no
  second job starts actors, imports the framework and loads the checkpoint again while the slice is held):
  its config gets ``heldout`` (RUN/data/heldout, with ``prep``), and with the last checkpoint it reports
  the metric ``evaluation``, a dict with ``accuracy`` (gated by Param ``accuracy_threshold``) and whatever
  else it measured (``n``, ``examples_per_s``, ``samples``, ...; the demo workload's loop does this). The
  ``evaluate`` module is then not run by the pipeline (it stays for a run of its own).
- ``serve_app``: a Ray Serve application builder, called with args ``checkpoint``, ``framework``,
  ``model_name`` (= ``serve_name``) and the TPU placement of the serve slice; deployed under
  ``/<serve_name>``. The smoke test POSTs ``smoke_request`` to ``/<serve_name>/<smoke_path>`` and expects
  ``smoke_expect`` in the answer.
- ``serve_user_config`` / ``check_serve_user_config``: the app deployment's ``user_config`` (its own
  settings: request limits, batching, ...), the defaults under ``deployment_options["user_config"]``; the
  check, ``function(user_config: dict, deployment: dict) -> None`` (``deployment``: the app's ``deployments:``
  entry), runs in the ``build_serve_config`` task and raises ``UserInputError`` before anything is deployed.
- ``params`` / ``train_loop_config``: the workload's own Params (added to the trigger form beside the
  pipeline's; a name the pipeline already has is refused) and what its train loop gets besides
  ``num_steps`` and ``checkpoint_every`` (values may be templates, e.g. ``{"horizon": "{{ params.horizon }}"}``).
- ``check_params``: runs in the ``check_params`` task (on the Airflow worker, not on the cluster), called
  with the run's Params (a dict); raises ``tpuflow.errors.UserInputError`` for a value the workload
  cannot train with, before any slice is leased.

Import paths may contain ``{framework}``, replaced by the run's Param ``framework`` (``jax`` or ``torch``).
``Workload.check_code`` finds each step's module, and the function a "module:function" names, without importing
them (tpuflow.pipeline.step_paths): ``tpu_pipeline`` runs it while the DAG file is parsed when there is a
``code_dir``, and the ``check_params`` task for the run's framework, before any slice is leased.

Storage: the steps on the cluster (prep, train loop, evaluate, serve app) use gs:// paths as they are, with
pyarrow (``pyarrow.parquet``, ``pyarrow.fs.FileSystem.from_uri``), Ray Data (``read_parquet``,
``write_parquet``), gcsfs or google-cloud-storage: no filesystem, endpoint or credentials in the code. On GKE
they reach Cloud Storage as the pods' service account; on the rehearsal (a GCS emulator) their environment
(tpuflow.storage.emulator_env, in every job's and replica's runtime_env) points each of these libraries at the
emulator and at a GCE metadata stand-in that gives them a token.
Cheap to import (a DAG file builds its Workload while it is parsed): no Airflow, Ray or ML imports.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuflow import workloads_dir
from tpuflow.errors import UserInputError
from tpuflow.pipeline.step_paths import NotFound, Unresolved, check_import_path
from tpuflow.serve.deployment_options import check_user_config

FRAMEWORK = "{framework}"
# What FRAMEWORK becomes in the DAG: the run's Param, rendered by Airflow.
FRAMEWORK_TEMPLATE = "{{ params.framework }}"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"{_NAME}(\.{_NAME})*")
_CALLABLE = re.compile(rf"{_NAME}(\.{_NAME})*:{_NAME}")
# A Serve application's name: also its route prefix and the model name a client asks for.
_SERVE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_MODULE_FIX = 'give a dotted module name, e.g. "acme_forecast.prep"'
_CALLABLE_FIX = 'give "package.module:function", e.g. "acme_forecast.fit:train_loop"'
# The fields that name code, in the order check_code looks at them: prep and evaluate run as `python -m`,
# the two checks on the Airflow worker, the rest on the Ray cluster.
STEP_FIELDS = ("train_loop", "prep", "evaluate", "serve_app", "check_params", "check_serve_user_config")
_RUN_WITH_PYTHON_M = frozenset({"prep", "evaluate"})
_ON_AIRFLOW = frozenset({"check_params", "check_serve_user_config"})


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A team's code and steps, as the pipeline runs them (see the module docstring for each contract).

    :param train_loop: import path of the train loop, ``"pkg.module:function"`` (may contain ``{framework}``).
    :param code_dir: the package folder shipped with every job and Serve app (Ray ``py_modules``: its folder
        name is what the steps import, e.g. ``.../acme_forecast`` for ``acme_forecast.fit:loop``); None: the
        modules are importable on the cluster already (in its image, or tpuflow's own workloads).
    :param prep: module run as the Ray Data preparation job; None: no ``prep`` task, no dataset given to training.
    :param evaluate: module run as the evaluation job; None: no ``evaluate`` task and no quality gate.
    :param evaluate_in_training: the train loop evaluates after its last step and reports ``evaluation``
        (see the module docstring); no ``evaluate`` job runs.
    :param serve_app: import path of the Ray Serve application builder; None: nothing is deployed.
    :param serve_name: the Serve application's name, route prefix and model name (default: the top-level
        package of ``serve_app``).
    :param serve_deployment: the app's deployment that ``deployment_options`` configure; None: the app takes none.
    :param smoke_request: JSON body the smoke test POSTs to the endpoint; None: no smoke test.
    :param smoke_path: where under ``/<serve_name>`` the smoke test POSTs.
    :param smoke_expect: text the smoke test's answer must contain (required with ``smoke_request``).
    :param check_params: import path of ``function(params: dict) -> None`` checking the workload's own Params.
    :param params: the workload's own Params, name -> ``airflow.sdk.Param`` (or a plain default); None: none.
    :param train_loop_config: more of the train loop's config (templated), beside ``num_steps`` and ``checkpoint_every``.
    :param serve_user_config: the app deployment's user_config defaults (JSON values); None: none.
    :param check_serve_user_config: import path of the function checking the app's user_config before deploy.
    :param compilation_cache: a jax loop keeps JAX's persistent compilation cache under the run's storage, so a
        retried, resumed or next-day run reads its compiled programs back (tpuflow_driver.compile_cache);
        False: every attempt compiles afresh.
    """

    train_loop: str
    code_dir: str | Path | None = None
    prep: str | None = None
    evaluate: str | None = None
    evaluate_in_training: bool = False
    serve_app: str | None = None
    serve_name: str | None = None
    serve_deployment: str | None = None
    smoke_request: Mapping[str, Any] | None = None
    smoke_path: str = "v1/completions"
    smoke_expect: str | None = None
    check_params: str | None = None
    serve_user_config: Mapping[str, Any] | None = None
    check_serve_user_config: str | None = None
    params: Mapping[str, Any] | None = None
    train_loop_config: Mapping[str, Any] | None = None
    compilation_cache: bool = True

    def __post_init__(self) -> None:
        _check_path("train_loop", self.train_loop, _CALLABLE, _CALLABLE_FIX, optional=False)
        _check_path("prep", self.prep, _MODULE, _MODULE_FIX)
        _check_path("evaluate", self.evaluate, _MODULE, _MODULE_FIX)
        _check_path("serve_app", self.serve_app, _CALLABLE, 'give "package.module:builder", e.g. "acme.serve:app"')
        _check_path(
            "check_params", self.check_params, _CALLABLE, 'give "package.module:function", e.g. "acme.checks:check"'
        )
        _check_path(
            "check_serve_user_config", self.check_serve_user_config, _CALLABLE, 'give "package.module:function"'
        )
        self._check_serve()
        self._check_own_config()
        if self.code_dir is not None:
            object.__setattr__(self, "code_dir", self._checked_code_dir())

    # --- checks (parse time: format and the folder, nothing imported) ------------------------------
    def _check_serve(self) -> None:
        if self.serve_name is not None and not (
            isinstance(self.serve_name, str) and _SERVE_NAME.fullmatch(self.serve_name)
        ):
            raise _error("serve_name", self.serve_name, "give a name of letters, digits, '_', '-' or '.', e.g. acme")
        if self.serve_deployment is not None and not (isinstance(self.serve_deployment, str) and self.serve_deployment):
            raise _error("serve_deployment", self.serve_deployment, "give the deployment's name in the Serve app")
        if self.serve_app is None:
            serve_fields = ("serve_name", "serve_deployment", "smoke_request", "smoke_expect", "serve_user_config")
            for field in (*serve_fields, "check_serve_user_config"):
                if getattr(self, field) is not None:
                    raise _error(field, getattr(self, field), "give serve_app too (nothing is deployed without it)")
            return
        if self.serve_user_config is not None:
            check_user_config("workload.serve_user_config", self.serve_user_config)
            if self.serve_deployment is None:
                raise _error("serve_deployment", None, "name the app's deployment that serve_user_config configures")
        if (self.smoke_request is None) != (self.smoke_expect is None):
            field = "smoke_expect" if self.smoke_expect is None else "smoke_request"
            raise _error(field, getattr(self, field), "give smoke_request and smoke_expect together (or neither)")
        if self.smoke_request is not None:
            self._check_smoke()

    def _check_own_config(self) -> None:
        for field in ("params", "train_loop_config"):
            value = getattr(self, field)
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise _error(field, value, "give a dict")
            for key in value:
                if not (isinstance(key, str) and re.fullmatch(_NAME, key)):
                    raise _error(
                        f"{field}[{key!r}]", value[key], "name it with letters, digits and '_' (a Python name)"
                    )
        if not isinstance(self.evaluate_in_training, bool):
            raise _error("evaluate_in_training", self.evaluate_in_training, "give True or False")
        if self.evaluate_in_training and self.prep and self.train_loop_config and "heldout" in self.train_loop_config:
            raise _error(
                "train_loop_config['heldout']",
                self.train_loop_config["heldout"],
                "leave it out: with evaluate_in_training the loop gets prep's held-out set there",
            )
        for key, param in (("num_steps", "train_steps"), ("checkpoint_every", "checkpoint_every")):
            if self.train_loop_config and key in self.train_loop_config:
                raise _error(
                    f"train_loop_config[{key!r}]", self.train_loop_config[key], f"set it with the Param {param}"
                )

    def _check_smoke(self) -> None:
        if not isinstance(self.smoke_request, Mapping):
            raise _error("smoke_request", self.smoke_request, "give the request's JSON body as a dict")
        try:
            json.dumps(dict(self.smoke_request))
        except (TypeError, ValueError):
            raise _error("smoke_request", self.smoke_request, "give a JSON-serialisable dict") from None
        if not (isinstance(self.smoke_expect, str) and self.smoke_expect):
            raise _error("smoke_expect", self.smoke_expect, "give the text the endpoint's answer must contain")
        if not (isinstance(self.smoke_path, str) and self.smoke_path and not self.smoke_path.startswith("/")):
            raise _error("smoke_path", self.smoke_path, 'give a path under the app\'s route, e.g. "v1/completions"')

    def _checked_code_dir(self) -> Path:
        if not isinstance(self.code_dir, str | Path) or not str(self.code_dir).strip():
            raise _error("code_dir", self.code_dir, "give the package folder to ship, or None")
        folder = Path(self.code_dir).expanduser().resolve()
        if not folder.is_dir():
            raise _error("code_dir", str(self.code_dir), "give an existing folder: the package the steps import")
        if not (folder / "__init__.py").is_file():  # Ray ships a py_modules folder as one package
            raise _error("code_dir", str(self.code_dir), f"give a package folder (add {folder / '__init__.py'})")
        if folder.name not in self.top_level_modules():
            raise _error(
                "code_dir",
                str(self.code_dir),
                f"ship the package folder itself, named as the steps import it ({', '.join(self.top_level_modules())}); "
                f"e.g. {folder / self.top_level_modules()[0]}",
            )
        return folder

    # --- what the factories read ---------------------------------------------------------------------
    def top_level_modules(self) -> list[str]:
        """The top-level packages the steps import, in field order, once each."""
        paths = (self.train_loop, self.prep, self.evaluate, self.serve_app)
        return list(dict.fromkeys(p.split(":")[0].split(".")[0] for p in paths if p))

    @property
    def app_name(self) -> str | None:
        """The Serve application's name (its route prefix and model name); None without serve_app."""
        if self.serve_app is None:
            return None
        return self.serve_name or self.serve_app.split(":")[0].split(".")[0]

    @property
    def evaluate_job(self) -> str | None:
        """The module the pipeline runs as its evaluate job; None: no such job (none, or the loop evaluates)."""
        return None if self.evaluate_in_training else self.evaluate

    @property
    def has_smoke_test(self) -> bool:
        return self.smoke_request is not None

    def runtime_env(self) -> dict[str, Any] | None:
        """The Ray jobs' runtime_env for the code (py_modules; Ray uploads the folder); None: nothing to ship."""
        return {"py_modules": [str(self.code_dir)]} if self.code_dir else None

    def local_code_uri(self) -> str | None:
        """The code as a Serve app on a cluster of this machine sees it (a local:// folder); None: nothing."""
        return f"local://{self.code_dir}" if self.code_dir else None

    def check_code(self, frameworks: Sequence[str]) -> None:
        """Every step's module, and the function a "module:function" names, found without importing them
        (``{framework}`` as each of ``frameworks``); UserInputError naming the field for the first that is
        missing. Looked for in ``code_dir`` (the package the steps import), else where each step runs from
        this machine's view: tpuflow's own workloads (every Ray job's working_dir) or the local imports.
        A step whose top-level package is in none of them (in the cluster's image) is not judged."""
        for field in STEP_FIELDS:
            raw = getattr(self, field)
            for framework, path in _expanded(raw, frameworks):
                try:
                    self._check_step(field, path)
                except Unresolved as err:
                    raise _error(field, raw, _unresolved_fix(err, framework)) from None

    def _check_step(self, field: str, path: str) -> None:
        for roots in self._search_roots(field, path.split(".")[0].split(":")[0]):
            try:
                check_import_path(path, roots, runnable=field in _RUN_WITH_PYTHON_M)
            except NotFound:
                continue
            return

    def _search_roots(self, field: str, top: str) -> list[list[str] | None]:
        """Where a step's top-level package is looked for, in order (None: where ``import`` looks here)."""
        if self.code_dir is not None and Path(self.code_dir).name == top:
            return [[str(Path(self.code_dir).parent)]]
        if field in _ON_AIRFLOW:
            return [None]
        return [[workloads_dir()], None]

    def load_check(self, field: str = "check_params") -> Callable[..., Any] | None:
        """The check function of ``field`` (check_params, check_serve_user_config), imported (code_dir's
        parent first on sys.path); None when not set. Runs in its task, never at parse time."""
        path = getattr(self, field)
        if not path:
            return None

        if self.code_dir and str(Path(self.code_dir).parent) not in sys.path:
            sys.path.insert(0, str(Path(self.code_dir).parent))
        module, name = path.split(":")
        try:
            check: Callable[..., Any] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise _error(field, path, f"give an importable function ({err})") from None
        return check


def templated(path: str) -> str:
    """An import path with ``{framework}`` as the Airflow template of Param ``framework``."""
    return path.replace(FRAMEWORK, FRAMEWORK_TEMPLATE)


def _expanded(raw: str | None, frameworks: Sequence[str]) -> Iterator[tuple[str | None, str]]:
    """(framework, concrete path) for each framework an import path stands for; nothing for an unset step."""
    if not raw:
        return
    if FRAMEWORK not in raw:
        yield None, raw
        return
    for framework in frameworks:
        yield framework, raw.replace(FRAMEWORK, framework)


def _unresolved_fix(err: Unresolved, framework: str | None) -> str:
    if framework is None:
        return f'{err.what}; did you mean "{err.fixed}"?' if err.fixed else f"{err.what}; {err.fix}"
    # a concrete path would not fit the template: no "did you mean"
    alone = f", or leave {FRAMEWORK} out if the workload trains with one framework" if err.missing else ""
    return f"with framework {framework}, {err.what}; {err.fix}{alone}"


def _error(field: str, value: object, fix: str) -> UserInputError:
    return UserInputError(f"workload.{field}", value, fix)


def _check_path(field: str, value: Any, pattern: re.Pattern[str], fix: str, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    fix += f" ({FRAMEWORK} may stand for the run's framework)" + ("" if optional else "; required")
    if not isinstance(value, str) or not pattern.fullmatch(value.replace(FRAMEWORK, "jax")):
        raise _error(field, value, fix)
