"""The engine kinds: one module each in this package, found here (issue 30).

Each module that holds an `ENGINE` (an instance of base.Engine) is an engine kind, named by
ENGINE.name, the spec's `engine:` value. Nothing else lists them: adding a kind is adding its
module (and its test), as a node_exporter collector registers itself. The package sits below
the spec (which reads what each kind accepts) and imports nothing of it at run time.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Final

from ct200_tools.engines.base import ENGINE_CHILD, Engine

__all__ = ["ENGINES", "ENGINE_CHILD", "Engine", "names"]


def _discover() -> dict[str, Engine]:
    found: dict[str, Engine] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        engine = getattr(module, "ENGINE", None)
        if isinstance(engine, Engine):
            if engine.name in found:  # two modules claiming one name: a programming error
                raise RuntimeError(f"engine {engine.name!r} is declared twice ({info.name})")
            found[engine.name] = engine
    return found


#: Every engine kind, by the spec's `engine:` value, in module-name order.
ENGINES: Final[dict[str, Engine]] = _discover()


def names() -> tuple[str, ...]:
    return tuple(ENGINES)
