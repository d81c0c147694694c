"""Where each server's pieces live: its unit's name, EnvironmentFile, engine config and cache.

The same for every engine kind; the roles, the units, ct200-serve and the doctor name them so.
"""

from __future__ import annotations

from typing import Final

UNIT_PREFIX: Final = "ct200-server-"
STAGE_UNIT_PREFIX: Final = "ct200-stage@"
CONFIG_DIR: Final = "/etc/ct200/servers"
CACHE_ROOT: Final = "/var/cache/ct200/servers"


def unit_name(name: str) -> str:
    return f"{UNIT_PREFIX}{name}.service"


def server_of_unit(unit: str) -> str | None:
    """The server a unit name belongs to, or None for any other unit."""
    if unit.startswith(UNIT_PREFIX) and unit.endswith(".service"):
        return unit.removeprefix(UNIT_PREFIX).removesuffix(".service") or None
    return None


def stage_unit(model: str) -> str:
    return f"{STAGE_UNIT_PREFIX}{model}.service"


def env_path(name: str) -> str:
    return f"{CONFIG_DIR}/{name}.env"


def config_path(name: str) -> str:
    """An engine's config file beside its argv (SGLang's --config; other engines have none)."""
    return f"{CONFIG_DIR}/{name}.yaml"


def cache_dir(name: str) -> str:
    return f"{CACHE_ROOT}/{name}"
