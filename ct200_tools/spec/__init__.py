"""The site spec: one YAML description of what a site wants, read, validated and typed here.

Ansible renders machines from it, the playbooks copy it to /etc/ct200/site.yml, and the doctor
judges the machine against it. Validation runs before anything changes and reports every problem
with its field path and the fix, not only the first.

The modules depend on each other in one direction only, each on those before it:
sizes (byte sizes) -> model (the frozen values) -> read (typed reading of untrusted YAML data)
-> servers, schema (the rules; validate) -> files (finding and reading files and inventories).
Import the public names from here.
"""

from ct200_tools.spec.files import (
    MAX_BYTES,
    MAX_NODES,
    SPEC_ENV,
    SpecChoice,
    find_spec,
    load_spec,
)
from ct200_tools.spec.model import (
    DEFAULT_SPEC_PATH,
    NVIDIA_CORE_NODES,
    SPEC_KEY,
    Engine,
    GpuSpec,
    ModelSpec,
    Passthrough,
    PcieSpec,
    PveSpec,
    ServerSpec,
    Severity,
    ShmSpec,
    SiteSpec,
    SpecError,
    SpecIssue,
    SpeculativeSpec,
    TuningSpec,
    model_to_dict,
    spec_to_dict,
)
from ct200_tools.spec.schema import validate
from ct200_tools.spec.sizes import format_size, parse_size
from ct200_tools.tunings import MRRS_SIZES, mrrs_code

#: The modules of this package in dependency order: each imports only modules before it.
MODULES = ("sizes", "model", "read", "servers", "schema", "files")

__all__ = [
    "DEFAULT_SPEC_PATH",
    "MAX_BYTES",
    "MAX_NODES",
    "MODULES",
    "MRRS_SIZES",
    "NVIDIA_CORE_NODES",
    "SPEC_ENV",
    "SPEC_KEY",
    "Engine",
    "GpuSpec",
    "ModelSpec",
    "Passthrough",
    "PcieSpec",
    "PveSpec",
    "ServerSpec",
    "Severity",
    "ShmSpec",
    "SiteSpec",
    "SpecChoice",
    "SpecError",
    "SpecIssue",
    "SpeculativeSpec",
    "TuningSpec",
    "find_spec",
    "format_size",
    "load_spec",
    "model_to_dict",
    "mrrs_code",
    "parse_size",
    "spec_to_dict",
    "validate",
]
