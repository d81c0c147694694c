"""Where each server's pieces live: its unit's name, EnvironmentFile, engine config and cache.

The same for every engine kind; the roles, the units, ct200-serve and the doctor name them so.
"""

from __future__ import annotations

from typing import Final

from ct200_tools.units import SERVER, STAGE

# Their names are the project's unit list's (units.py).
UNIT_PREFIX: Final = SERVER.prefix
STAGE_UNIT_PREFIX: Final = STAGE.prefix
CONFIG_DIR: Final = "/etc/ct200/servers"
CACHE_ROOT: Final = "/var/cache/ct200/servers"


def unit_name(name: str) -> str:
    return SERVER.name(name)


def server_of_unit(unit: str) -> str | None:
    """The server a unit name belongs to, or None for any other unit."""
    return SERVER.instance(unit)


def stage_unit(model: str) -> str:
    return STAGE.name(model)


def env_path(name: str) -> str:
    return f"{CONFIG_DIR}/{name}.env"


def config_path(name: str) -> str:
    """An engine's config file beside its argv (SGLang's --config; other engines have none)."""
    return f"{CONFIG_DIR}/{name}.yaml"


def cache_dir(name: str) -> str:
    return f"{CACHE_ROOT}/{name}"
