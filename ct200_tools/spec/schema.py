"""The site spec's schema and rules, and validate(); import the public names from ct200_tools.spec.

Every rule records an issue and carries on, so one run reports every problem with its path and fix.
The servers' fields and the rules between servers are in ct200_tools.spec.servers, the typed
reading in ct200_tools.spec.read, reading files and inventories in ct200_tools.spec.files.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from ct200_tools.spec.model import (
    GpuSpec,
    ModelSpec,
    Passthrough,
    PcieSpec,
    PveSpec,
    ShmSpec,
    SiteSpec,
    SpecError,
    TuningSpec,
)
from ct200_tools.spec.read import (
    Issues,
    Section,
    at,
    did_you_mean,
    entries,
    kind,
    listing,
    section,
    show,
    subsection,
    within,
)
from ct200_tools.spec.servers import MAX_GPUS, Draft, check_servers, read_server
from ct200_tools.tunings import TUNINGS, Tuning

PASSTHROUGH: Final[dict[str, Passthrough]] = {"devn": "devn", "raw-lxc": "raw-lxc"}
SHM_ROOT: Final = "/dev/shm"
#: Trees that are always in RAM or virtual (tmpfs, devtmpfs, procfs, sysfs): a persistent copy
#: there would not survive a reboot. Whether another path is on a tmpfs (a RAM disk mounted at
#: /mnt/ram, or /tmp) is known only on the machine: ct200-stage and the doctor check it there.
VOLATILE: Final = (SHM_ROOT, "/dev", "/run", "/var/run", "/proc", "/sys")
#: Cleaned at boot by systemd-tmpfiles, and a tmpfs on many systems (Debian 13's default).
CLEANED_AT_BOOT: Final = "/tmp"
GIB: Final = 1 << 30
#: The most models, and the most servers, a spec may list.
MAX_ENTRIES: Final = 256

# Each section's keys, with the example that fix texts quote.
ROOT: Final = {
    "pve": "pve: {vmid: 200, passthrough: devn}",
    "gpus": "gpus: {count: 8, model: RTX PRO 6000}",
    "tuning": "tuning: {numa_balancing: 0, pcie_max_read_request: 4096}",
    "shm": "shm: {size: 1200G, reserve_ram: 64G}",
    "models": "models: [{name: ..., source: ..., staged: ...}]",
    "servers": "servers: [{name: ..., engine: sglang, model: ..., gpus: [0, 1], port: 30000}]",
}
PVE: Final = {"vmid": "vmid: 200", "passthrough": "passthrough: devn"}
GPUS: Final = {
    "count": "count: 8",
    "model": "model: RTX PRO 6000",
    "pcie": "pcie: {gen: 5, width: 16}",
    "numa": "numa: [[0, 1, 2, 3], [4, 5, 6, 7]]",
}
PCIE: Final = {"gen": "gen: 5", "width": "width: 16"}
#: From the tunings' table (ct200_tools.tunings): each key with the example fix texts quote.
TUNING: Final = {t.key: t.example for t in TUNINGS}
SHM: Final = {"size": "size: 1200G", "reserve_ram": "reserve_ram: 64G"}
MODEL: Final = {
    "name": "name: qwen3.6-27b",
    "source": "source: /tank/models/Qwen3.6-27B",
    "staged": "staged: /dev/shm/models/qwen3.6-27b",
    "size": "size: 54G",
}


# --- sections --------------------------------------------------------------------------------


def read_pve(root: Section) -> PveSpec | None:
    pve = subsection(root, "pve", PVE, required=("vmid",))
    if pve is None:
        return None
    vmid = pve.get_int("vmid", 100, 999_999_999)
    passthrough = PASSTHROUGH.get(pve.get_choice("passthrough", tuple(PASSTHROUGH)) or "devn")
    return None if vmid is None or passthrough is None else PveSpec(vmid, passthrough)


def read_gpus(root: Section) -> GpuSpec | None:
    if "gpus" not in root.data:
        return None  # the root section already reported it missing
    gpus = section(root.issues, root.data["gpus"], "gpus", GPUS, required=("count",))
    if gpus is None:
        return None
    # 0: a site with no NVIDIA GPU (the testbed, a CPU server): the doctor's GPU checks do not
    # apply there, instead of failing on every machine of it.
    count = gpus.get_int("count", 0, MAX_GPUS)
    if count != 0 and "model" not in gpus.data:
        root.issues.error(gpus.where("model"), "required key is missing", f"add {GPUS['model']}")
    if count == 0 and gpus.data.get("model") in ("", None):
        model: str | None = ""  # no GPU names no model: the canonical form writes it as ""
    else:
        model = gpus.get_str("model") if "model" in gpus.data else ""
    pcie = subsection(gpus, "pcie", PCIE, required=("gen", "width"))
    gen = pcie.get_int("gen", 1, 6) if pcie else None
    width = pcie.get_int("width", 1, 32, choices=(1, 2, 4, 8, 16, 32)) if pcie else None
    numa = read_numa(gpus, count)
    if count is None or model is None:
        return None
    link = PcieSpec(gen, width) if gen is not None and width is not None else None
    return GpuSpec(count, model, link, numa)


def read_numa(gpus: Section, count: int | None) -> tuple[tuple[int, ...], ...]:
    """GPUs per NUMA node; each GPU in exactly one node, so TP groups can be judged."""
    path = gpus.where("numa")
    node_of: dict[int, int] = {}
    nodes: list[tuple[int, ...]] = []
    for n, members in enumerate(entries(gpus, "numa", MAX_GPUS)):
        if not isinstance(members, list):
            gpus.issues.error(at(path, n), f"expected a list, got {kind(members)}", "e.g. [0, 1]")
            continue
        for i, gpu in enumerate(members):
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                gpus.issues.error(at(at(path, n), i), f"{show(gpu)} is not a GPU index", "e.g. 0")
            elif count == 0:
                gpus.issues.error(
                    at(at(path, n), i),
                    f"GPU {show(gpu)}, but the site has no GPU (gpus.count is 0)",
                    "remove gpus.numa, or declare the GPUs in gpus.count",
                )
            elif count is not None and not 0 <= gpu < count:
                gpus.issues.error(
                    at(at(path, n), i),
                    f"GPU {show(gpu)} is out of range 0..{count - 1}",
                    f"list only GPUs 0 to {count - 1}, or raise gpus.count",
                )
            elif gpu in node_of:
                gpus.issues.error(
                    at(at(path, n), i),
                    f"GPU {gpu} is already in node {node_of[gpu]}",
                    "list each GPU in exactly one node",
                )
            else:
                node_of[gpu] = n
        nodes.append(tuple(g for g in members if isinstance(g, int) and node_of.get(g) == n))
    missing = [g for g in range(count or 0) if g not in node_of]
    if nodes and missing:
        gpus.issues.error(
            path,
            f"GPUs {listing(missing)} are in no NUMA node",
            "add each GPU to its node's list (cat /sys/bus/pci/devices/<bdf>/numa_node)",
        )
    return tuple(nodes)


def read_tuning(root: Section) -> TuningSpec:
    """Every tuning of the table: absent means its default, an explicit null "leave the host's
    setting alone" (not managed)."""
    tuning = subsection(root, "tuning", TUNING)
    if tuning is None:
        return TuningSpec()
    return TuningSpec(tuple((t.key, read_one_tuning(tuning, t)) for t in TUNINGS))


def read_one_tuning(tuning: Section, t: Tuning) -> int | str | None:
    if t.key not in tuning.data:
        return t.default
    if tuning.data[t.key] is None:
        return None
    if all(isinstance(v, str) for v in t.values):
        return tuning.get_choice(t.key, [str(v) for v in t.values])
    ints = [v for v in t.values if isinstance(v, int)]
    lo, hi = min(ints), max(ints)
    ranged = ints == list(range(lo, hi + 1))
    return tuning.get_int(t.key, lo, hi, choices=() if ranged else ints, nullable=True)


def read_shm(root: Section) -> ShmSpec:
    shm = subsection(root, "shm", SHM)
    if shm is None:
        return ShmSpec()
    size = shm.get_size("size")
    if size == 0:
        shm.issues.error(shm.where("size"), "is 0", "give /dev/shm a size, e.g. size: 1200G")
    return ShmSpec(size or None, shm.get_size("reserve_ram", nullable=False) or 0)


def read_model(issues: Issues, value: object, path: str) -> ModelSpec | None:
    model = section(issues, value, path, MODEL, required=("name", "source", "staged"))
    if model is None:
        return None
    name, source = model.get_name("name"), model.get_path("source")
    staged, size = model.get_path("staged"), model.get_size("size")
    if source is not None:
        check_persistent(issues, model.where("source"), source, name)
    if source is not None and staged is not None:
        if within(staged, source) or within(source, staged):
            issues.error(
                model.where("staged"),
                f"staged {staged} and source {source} overlap",
                "stage to a separate directory under /dev/shm: the source is the persistent "
                "copy that restages the model after a reboot and must never be touched",
            )
        if staged in ("/", SHM_ROOT):
            issues.error(
                model.where("staged"),
                f"{staged} is a whole filesystem",
                f"use a directory of its own, e.g. {SHM_ROOT}/models/{name or 'NAME'}",
            )
            staged = None  # kept out of the overlap checks, where it would clash with everything
        elif not within(staged, SHM_ROOT):
            issues.warn(
                model.where("staged"),
                f"{staged} is not under {SHM_ROOT}",
                f"stage under {SHM_ROOT} (tmpfs) so loading reads RAM; elsewhere it loads at "
                "disk speed",
            )
    if name is None or source is None or staged is None:
        return None
    return ModelSpec(name, source, staged, size)


def check_persistent(issues: Issues, where: str, source: str, name: str | None) -> None:
    """A model's persistent copy must survive a reboot: staging restages from it after one."""
    fix = (
        f"keep the persistent copy on a local disk, e.g. /tank/models/{name or 'NAME'}: "
        f"staging restages {SHM_ROOT} from it after every reboot"
    )
    volatile = next((v for v in VOLATILE if within(source, v)), None)
    if volatile is not None:
        issues.error(
            where,
            f"{source} is under {volatile}, which lives in RAM (or is virtual): the persistent "
            "copy would not survive a reboot",
            fix,
        )
    elif within(source, CLEANED_AT_BOOT):
        issues.warn(
            where,
            f"{source} is under {CLEANED_AT_BOOT}, which systemd cleans at boot (and which is a "
            "tmpfs on many systems): the copy may not survive a reboot",
            fix,
        )


def read_models(root: Section) -> tuple[list[tuple[str, ModelSpec]], set[str]]:
    """Models with their paths, and every declared name (even of broken entries)."""
    models: list[tuple[str, ModelSpec]] = []
    names: set[str] = set()
    for i, value in enumerate(entries(root, "models", MAX_ENTRIES)):
        path = at("models", i)
        model = read_model(root.issues, value, path)
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            names.add(value["name"])
        if model is None:
            continue
        for other_path, other in models:
            check_model_pair(root.issues, path, model, other_path, other)
        models.append((path, model))
    return models, names


def check_model_pair(
    issues: Issues, path: str, model: ModelSpec, other_path: str, other: ModelSpec
) -> None:
    if model.name == other.name:
        issues.error(
            at(path, "name"),
            f"model name {model.name!r} is already used by {other_path}",
            "give each model its own name",
        )
    if within(model.staged, other.staged) or within(other.staged, model.staged):
        issues.error(
            at(path, "staged"),
            f"staged path {model.staged} overlaps {other_path}.staged ({other.staged})",
            "give each model its own directory: staging one would replace the other",
        )


def check_models(
    issues: Issues, drafts: list[Draft], models: list[tuple[str, ModelSpec]], names: set[str]
) -> None:
    """Server references resolve, and a drafter is neither missing at boot nor the model itself."""
    by_staged = {m.staged: m for _, m in models}
    for server in drafts:
        if server.model is not None and server.model not in names:
            issues.error(
                at(server.path, "model"),
                f"unknown model {server.model!r}{did_you_mean(server.model, names)}",
                f"declare it under models, or use one of: {listing(sorted(names)) or 'none'}",
            )
        draft_path = server.speculative.draft_model if server.speculative else None
        if draft_path is None:
            continue
        where = at(server.path, "speculative.draft_model")
        own = next((m for _, m in models if m.name == server.model), None)
        if own is not None and draft_path in (own.staged, own.source):
            issues.error(
                where,
                f"{draft_path} is the server's own model {own.name}: a model cannot draft for "
                "itself",
                "set draft_model to the drafter's staged path (declare the drafter under "
                "models), or use algorithm NEXTN (the model's own MTP layers) or NGRAM, which "
                "need no draft model",
            )
        elif within(draft_path, SHM_ROOT) and draft_path not in by_staged:
            issues.warn(
                where,
                f"{draft_path} is in {SHM_ROOT} but no model is staged there, so a reboot "
                "loses it for good",
                "declare the drafter under models with this path as its staged path",
            )


def check_fit(issues: Issues, site: SiteSpec) -> None:
    """What the enabled servers need (SiteSpec.needed_models) fits in shm.size."""
    used, shm = site.needed_models(), site.shm
    sized = [m for m in used if m.size is not None]
    total = sum(m.size or 0 for m in sized)
    if shm.size is None or total <= shm.size:
        return
    unsized = len(used) - len(sized)
    issues.error(
        "shm.size",
        f"the models of the enabled servers need {total / GIB:.1f} GiB "
        f"({listing(f'{m.name} {(m.size or 0) / GIB:.1f} GiB' for m in sized)}"
        + (f"; {unsized} without a size not counted" if unsized else "")
        + f") but shm.size is {shm.size / GIB:.1f} GiB",
        f"raise shm.size to at least {-(-total // GIB)}G, or disable servers so fewer models "
        "are staged at once",
    )


# --- the whole spec ----------------------------------------------------------------------------


def validate(data: object, source: str = "") -> SiteSpec:
    """A SiteSpec from the mapping under ct200_site; warnings go into SiteSpec.warnings.

    Raises SpecError with every error found, each with its path (e.g. servers[1].gpus[2]) and
    fix; SpecError.issues holds errors only, so warnings show once the errors are fixed.
    """
    issues = Issues()
    root = section(issues, data, "", ROOT, required=("gpus",))
    if root is None:
        raise SpecError(issues.items, source)
    gpus = read_gpus(root)
    pve, tuning, shm = read_pve(root), read_tuning(root), read_shm(root)
    models, names = read_models(root)
    drafts = [
        draft
        for i, value in enumerate(entries(root, "servers", MAX_ENTRIES))
        if (draft := read_server(issues, value, at("servers", i), gpus)) is not None
    ]
    check_servers(issues, drafts, gpus)
    check_models(issues, drafts, models, names)
    if gpus is None:
        raise SpecError(issues.of("error"), source)
    site = SiteSpec(
        gpus=gpus,
        pve=pve,
        tuning=tuning,
        shm=shm,
        models=tuple(m for _, m in models),
        servers=tuple(s for d in drafts if (s := d.build()) is not None),
        source=source,
    )
    check_fit(issues, site)
    if issues.of("error"):
        raise SpecError(issues.of("error"), source)
    return dataclasses.replace(site, warnings=tuple(issues.of("warning")))
