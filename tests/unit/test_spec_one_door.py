"""Every site spec the repository ships goes through the one door and out again.

The validate play exports the canonical form (`ct200_validated.site`, spec_to_dict) and every role
reads that, never the raw spec: the render filters, the serving set's filter, the units. So the
canonical form of each shipped spec must validate again to the same spec, and each role filter
must take it. A spec with no GPU (the quickstart's inventory/testbed/serving.yml) once wrote
`model: ""`, which the roles' second validation refused, and the quickstart stopped at its
container play: no test converged that spec.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from ct200_tools.serve.render import site_of, unit_files
from ct200_tools.spec import validate

REPO = Path(__file__).resolve().parents[2]
#: The site specs a user is pointed at: the example site, the testbed's, the quickstart's.
SPEC_FILES = (
    "inventory/ct200/group_vars/all/ct200_site.yml",
    "inventory/testbed/group_vars/all.yml",
    "inventory/testbed/serving.yml",
)


def _filter_module(rel: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(rel).stem, REPO / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def raw_site(rel: str) -> dict[str, Any]:
    data = yaml.safe_load((REPO / rel).read_text())
    site: dict[str, Any] = data["ct200_site"]
    return site


@pytest.mark.parametrize("rel", SPEC_FILES)
def test_the_canonical_form_validates_again_to_the_same_spec(rel: str) -> None:
    validate_filter = _filter_module("playbooks/filter_plugins/ct200_spec.py")
    exported = validate_filter.ct200_validate_spec(json.dumps(raw_site(rel)))
    again = site_of(exported["site"])
    assert again == dataclasses.replace(validate(raw_site(rel)), source=again.source)


@pytest.mark.parametrize("rel", SPEC_FILES)
def test_every_role_filter_takes_the_exported_site(rel: str) -> None:
    site = _filter_module("playbooks/filter_plugins/ct200_spec.py").ct200_validate_spec(
        json.dumps(raw_site(rel))
    )["site"]
    serving = _filter_module("roles/ct200_tools/filter_plugins/ct200_serving.py")
    chosen = serving.ct200_serving_set(None, site)
    assert set(chosen["servers"]) <= {s["name"] for s in site["servers"]}
    units = unit_files(site["servers"], site, "/opt/ct200-tools/bin", "/etc/systemd/system", "")
    assert len(units) == len(site["servers"])
    assert all(u["content"].startswith("# ct200-server-") for u in units), units[0]["content"][:80]
