"""What CPU this is, from /proc/cpuinfo: its model string and its generation (vendor, family and
model numbers, the widest vector ISA). The harness's machine kinds (experiments/machine.py) and the
engine's cache of measured GEMM choices (cavs/blas.py) both key on these facts.
"""
from __future__ import annotations

import platform
from pathlib import Path

# the widest vector ISA, best first: /proc/cpuinfo flag (x86-64) or feature (AArch64) -> level
_ISA_LEVELS = (("amx_tile", "amx"), ("avx512f", "avx512f"), ("avx2", "avx2"), ("avx", "avx"),
               ("sse4_2", "sse4.2"), ("sve2", "sve2"), ("sve", "sve"), ("asimd", "neon"))


def cpu_generation(cpuinfo: str | None = None) -> dict:
    """{cpu_vendor, cpu_family, cpu_model_number, cpu_isa} from the text of /proc/cpuinfo (read when
    not given); None where a fact cannot be read. On AArch64 the implementer and part numbers stand
    for vendor and model."""
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:          # the first processor's block
            fields[key.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    isa = next((level for flag, level in _ISA_LEVELS if flag in flags), None)
    vendor = fields.get("vendor_id") or fields.get("CPU implementer")
    family = fields.get("cpu family") or fields.get("CPU architecture")
    model = fields.get("model") if "vendor_id" in fields else fields.get("CPU part")
    if not fields:                                     # no /proc/cpuinfo: what the platform says
        vendor = vendor or (platform.processor() or None)
    return {"cpu_vendor": vendor, "cpu_family": family, "cpu_model_number": model, "cpu_isa": isa}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model string, from the text of /proc/cpuinfo (read when not given)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
