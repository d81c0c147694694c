"""Which compressed-tensors releases read which quantization format, and version arithmetic.

FORMATS was read off compressed-tensors' own releases: every wheel on PyPI from 0.3.3 to
0.20.1, in src/compressed_tensors/config/base.py (the CompressionFormat enum) and the
compressors registered under compressed_tensors/compressors/ (`BaseCompressor.register(name=
CompressionFormat.X.value)`): a format is readable from the first release that registers a
compressor for it. The repository is github.com/vllm-project/compressed-tensors (formerly
neuralmagic/compressed-tensors); the pull requests that added the formats are named below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FormatSupport:
    since: str
    #: The release whose compressors no longer read it, if one dropped it.
    until: str | None = None
    source: str = ""


FORMATS: dict[str, FormatSupport] = {
    "int-quantized": FormatSupport("0.4.0", source="IntQuantizationCompressor, 0.4.0"),
    "pack-quantized": FormatSupport("0.4.0", source="PackedQuantizationCompressor (#47), 0.4.0"),
    "marlin-24": FormatSupport(
        "0.4.0", "0.15.0", "Marlin24Compressor (#77), 0.4.0; not registered from 0.15.0"
    ),
    "float-quantized": FormatSupport("0.5.0", source="FloatQuantizationCompressor, 0.5.0"),
    "naive-quantized": FormatSupport("0.5.0", source="QuantizationCompressor, 0.5.0"),
    "sparse-24-bitmask": FormatSupport("0.9.0", source="Sparse24BitMaskCompressor, 0.9.0"),
    "nvfp4-pack-quantized": FormatSupport(
        "0.10.0", source="NVFP4PackedCompressor (#311, merged May 2025), 0.10.0"
    ),
    "mixed-precision": FormatSupport(
        "0.11.0", source="per-group formats (#415), 0.11.0; each group's format must be read too"
    ),
    "mxfp4-pack-quantized": FormatSupport("0.13.0", source="MXFP4 compressor (#502), 0.13.0"),
    "mxfp8-quantized": FormatSupport("0.15.0", source="MXFP8 compressor, 0.15.0"),
    "mxfp6-pack-quantized": FormatSupport("0.20.0", source="MXFP6 compressor, 0.20.0"),
}
#: Formats that store no quantized weights: any release reads them.
PLAIN = ("dense", "sparse-bitmask")
#: The last release FORMATS was checked against: a format it does not list is newer.
CHECKED_UP_TO = "0.20.1"


def version_tuple(text: str) -> tuple[int, ...]:
    """The release numbers of a version ("0.14.0.1" -> (0, 14, 0, 1); "0.10.0rc1" ->
    (0, 10, 0)); pre-release and local parts are ignored, which is all these checks need."""
    nums = []
    for part in text.strip().split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        nums.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(nums)


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def at_least(version: str, floor: str) -> bool:
    return _cmp(version_tuple(version), version_tuple(floor)) >= 0


_CLAUSE = re.compile(r"^\s*(===|==|!=|~=|>=|<=|>|<)\s*([0-9][0-9A-Za-z.+*!-]*)\s*$")


def requirement_spec(requirement: str) -> str:
    """The version specifier of a Requires-Dist entry: "compressed-tensors (==0.12.2) ; extra ==
    'srt'" -> "==0.12.2"."""
    head = requirement.split(";", 1)[0]
    head = re.sub(r"^\s*compressed[-_.]tensors(\[[^\]]*\])?", "", head, flags=re.I)
    return head.strip().strip("()").strip()


def satisfies(version: str, spec: str) -> bool | None:
    """Whether `version` meets a PEP 440 specifier ("==0.12.2", ">=0.10,<0.13", "==0.12.*",
    "~=0.12.0"); None when the specifier is not one this understands (then nothing is claimed)."""
    v = version_tuple(version)
    for clause in (c for c in spec.split(",") if c.strip()):
        m = _CLAUSE.match(clause)
        if m is None:
            return None
        op, want = m.groups()
        if want.endswith(".*") and op in ("==", "!="):
            prefix = version_tuple(want[:-2])
            match = v[: len(prefix)] + (0,) * (len(prefix) - len(v[: len(prefix)])) == prefix
            ok = match if op == "==" else not match
        else:
            w = version_tuple(want)
            c = _cmp(v, w)
            ok = {
                "==": c == 0,
                "===": c == 0,
                "!=": c != 0,
                ">=": c >= 0,
                "<=": c <= 0,
                ">": c > 0,
                "<": c < 0,
                "~=": c >= 0 and v[: max(1, len(w) - 1)] == w[: max(1, len(w) - 1)],
            }[op]
        if not ok:
            return False
    return True


def format_problem(fmt: str, installed: str) -> str | None:
    """Why compressed-tensors `installed` cannot read `fmt`, or None when it can (or when the
    format is not known: format_known says so)."""
    support = FORMATS.get(fmt)
    if support is None:
        return None
    if not at_least(installed, support.since):
        return f"compressed-tensors {installed} cannot read {fmt} (read from {support.since})"
    if support.until is not None and at_least(installed, support.until):
        return f"compressed-tensors {installed} no longer reads {fmt} (dropped in {support.until})"
    return None


def format_known(fmt: str) -> bool:
    return fmt in FORMATS or fmt in PLAIN
