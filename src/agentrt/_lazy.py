"""A package's public names imported on first use (PEP 562), so that importing the
package costs only what its caller reaches for (`agentrt runs` never loads the gate,
a stdio proxy never loads the inbox)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: a name in `where` is imported from the
    module it maps to (relative to `package`) and kept in `namespace`; any other name
    is the usual `AttributeError`."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
