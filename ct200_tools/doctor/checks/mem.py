"""mem.*: /dev/shm and the memory cgroup: room for every model the serving servers serve."""

from __future__ import annotations

from ct200_tools.doctor.checks.base import (
    Context,
    Outcome,
    Remedy,
    check,
    failed,
    gib,
    passed,
    skipped,
)

#: tmpfs rounds its size to pages and df to blocks; a hair under the spec is not a fault.
SIZE_SLACK = 0.005


def model_sizes(ctx: Context) -> tuple[dict[str, int], list[str]]:
    """Bytes of each served model (persistent copy measured, else the spec's size) and the
    names whose size is unknown."""
    facts = {m.name: m for m in ctx.facts.models or ()}
    sizes, unknown = {}, []
    for m in ctx.needed_models():
        f = facts.get(m.name)
        size = f.source_bytes if f and f.source_bytes is not None else m.size
        if size is None:
            unknown.append(m.name)
        else:
            sizes[m.name] = size
    return sizes, unknown


@check(
    "mem.shm",
    "/dev/shm size",
    "error",
    needs=("memory", "models", "serving"),
    needs_spec=True,
    tags=("container_shm",),
)
def check_shm(ctx: Context) -> Outcome:
    """/dev/shm is a tmpfs at least shm.size large, and the models of the serving servers fit
    (the serving set's when one is recorded, else the spec's enabled ones)."""
    mem = ctx.facts.memory
    if mem is None:
        return skipped("memory facts not read", ctx.unreadable("memory") or "")
    tag = "container_shm"
    if not mem.shm_exists:
        return failed(
            f"{mem.shm_path} does not exist",
            Remedy(
                "mount a tmpfs there",
                "container",
                f"mount -t tmpfs -o size={ctx.site.shm.size or '<size>'} tmpfs /dev/shm",
                tag,
            ),
        )
    if mem.shm_fstype not in (None, "tmpfs"):
        return failed(
            f"{mem.shm_path} is {mem.shm_fstype}, not tmpfs",
            Remedy("mount a tmpfs at /dev/shm", "container", "mount -t tmpfs tmpfs /dev/shm", tag),
        )
    if mem.shm_size is None:
        return skipped("size of /dev/shm not readable", ctx.unreadable("memory.shm") or "")
    want = ctx.site.shm.size
    sizes, unknown = model_sizes(ctx)
    need = sum(sizes.values())
    evidence = [
        f"/dev/shm: {gib(mem.shm_size)} ({gib(mem.shm_free)} free)",
        f"served models: {gib(need)}" + (f" + unknown size: {unknown}" if unknown else ""),
    ]
    if want is not None and mem.shm_size < want * (1 - SIZE_SLACK):
        return failed(
            f"/dev/shm is {gib(mem.shm_size)}, the spec wants {gib(want)}",
            Remedy(
                "resize it now (for later boots the container's fstab: recover.yml or the "
                "container_shm tag)",
                "container",
                f"mount -o remount,size={want} /dev/shm",
                tag,
            ),
            *evidence,
        )
    if need > mem.shm_size:
        return failed(
            f"served models ({gib(need)}) do not fit /dev/shm ({gib(mem.shm_size)})",
            Remedy(
                "enlarge /dev/shm (shm.size) or serve fewer models at once",
                "container",
                f"mount -o remount,size={need + (1 << 30)} /dev/shm",
                tag,
            ),
            *evidence,
        )
    return passed(f"/dev/shm is tmpfs, {gib(mem.shm_size)}", *evidence)


@check(
    "mem.headroom",
    "memory for staging",
    "error",
    needs=("memory", "models", "serving"),
    needs_spec=True,
    tags=("lxc_passthrough",),
)
def check_headroom(ctx: Context) -> Outcome:
    """The memory cgroup (tmpfs pages count against it) and /dev/shm have room for the models
    still to stage plus shm.reserve_ram."""
    mem = ctx.facts.memory
    if mem is None:
        return skipped("memory facts not read", ctx.unreadable("memory") or "")
    sizes, unknown = model_sizes(ctx)
    staged = {m.name: m.staged_bytes or 0 for m in ctx.facts.models or ()}
    to_stage = sum(max(0, size - staged.get(name, 0)) for name, size in sizes.items())
    reserve = ctx.site.shm.reserve_ram
    ram: int | None
    if mem.memory_max is not None and mem.memory_current is not None:
        ram_name, ram = "memory cgroup headroom", mem.memory_max - mem.memory_current
    else:
        ram_name, ram = "MemAvailable", mem.mem_available
    if ram is None and mem.shm_free is None:
        return skipped("neither the memory cgroup nor /dev/shm could be read")
    evidence = [f"still to stage: {gib(to_stage)}, reserve_ram: {gib(reserve)}"]
    if ram is not None:
        evidence.append(f"{ram_name}: {gib(ram)}")
    if mem.shm_free is not None:
        evidence.append(f"/dev/shm free: {gib(mem.shm_free)}")
    if unknown:
        evidence.append(f"size unknown (not counted): {unknown}")
    short = []
    if ram is not None and to_stage + reserve > ram:
        short.append(
            f"{ram_name} is {gib(ram)}, staging needs {gib(to_stage + reserve)} with the reserve"
        )
    if mem.shm_free is not None and to_stage > mem.shm_free:
        short.append(f"/dev/shm has {gib(mem.shm_free)} free for {gib(to_stage)}")
    if not short:
        return passed(f"room to stage {gib(to_stage)} and keep {gib(reserve)} free", *evidence)
    vmid = ctx.site.pve.vmid if ctx.site.pve else "<vmid>"
    want_mib = (to_stage + reserve + (mem.memory_current or 0)) // 2**20 + 1024
    return failed(
        "not enough memory to stage: " + "; ".join(short),
        Remedy(
            "raise the container's memory (tmpfs pages count against it) or stage fewer models",
            "host",
            f"pct set {vmid} --memory {want_mib}",
            "lxc_passthrough",
        ),
        *evidence,
    )
