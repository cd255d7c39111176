"""Every operator extra link class the project defines, found by module (light imports only).

Used by the plugin (to list them) and by the provider info (`airflow providers links`).
A module that does not exist yet (work in progress elsewhere) is skipped.
"""

from __future__ import annotations

import importlib
import inspect

from airflow.sdk import BaseOperatorLink

LINK_MODULES = (
    "tpuflow.ray.links",
    "tpuflow.serve.operators",
    "tpuflow.output_links",
    "tpuflow.gke.links",
    "tpuflow.kuberay.links",
)


def link_classes() -> list[type[BaseOperatorLink]]:
    found: dict[str, type[BaseOperatorLink]] = {}
    for module_name in LINK_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseOperatorLink)
                and obj.__module__ == module_name
                and not name.startswith("_")
                and isinstance(getattr(obj, "name", None), str)
            ):
                found[f"{module_name}.{name}"] = obj
    return list(found.values())


def link_class_paths() -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in link_classes()]
