"""The machine a measurement ran on, and whether it was quiet enough to time anything.

A timing means little without the machine's name, and nothing if another process shared
the cores while it ran: :func:`describe` names the CPU and its cores for a notebook's last
line or a benchmark's header, and :func:`quiet_problem` says why a run should not be
recorded (other work is using the cores). :func:`vector_extensions` says which vector
instructions a CPU kernel can use here (the int8 dot products of chapter 17, for one).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo), or, elsewhere, the
    platform's description of the processor."""
    try:
        with open("/proc/cpuinfo") as info:
            line = next(line for line in info if line.startswith("flags"))
        return sorted(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        return [platform.machine(), platform.processor()]


# The x86 vector extensions a CPU decode kernel chooses between (Linux's names for them).
VECTOR_EXTENSIONS = {
    "avx2": "256-bit integer vectors (8 int32 or 16 int16 lanes)",
    "fma": "fused multiply-add on float vectors",
    "avx512f": "512-bit vectors",
    "avx512_vnni": "int8 dot products into int32, 64 byte pairs at once (vpdpbusd)",
    "avx_vnni": "the same int8 dot products on 256-bit vectors (32 byte pairs)",
    "amx_int8": "int8 tile matrix products (Sapphire Rapids and later)",
}


def vector_extensions() -> dict[str, bool]:
    """Which of :data:`VECTOR_EXTENSIONS` this CPU has, e.g. ``{"avx2": True, ...}``."""
    flags = set(cpu_flags())
    return {name: name in flags for name in VECTOR_EXTENSIONS}


def describe() -> str:
    """For example ``AMD EPYC 9B14, 2 cores``."""
    return f"{cpu_name()}, {os.cpu_count()} cores"


def busy_cores(seconds: float = 2.0) -> float:
    """How many cores' worth of work the whole machine did over the next ``seconds``
    (Linux's /proc/stat; 0.0 means idle, 2.0 means two cores fully busy)."""
    def ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    busy_before, total_before = ticks()
    time.sleep(seconds)
    busy_after, total_after = ticks()
    share = (busy_after - busy_before) / max(total_after - total_before, 1)
    return share * (os.cpu_count() or 1)


def quiet_problem(max_busy_cores: float = 0.2) -> str | None:
    """Why timings taken now would not be honest, or None when the machine is quiet:
    more than ``max_busy_cores`` of work going on while this process sleeps means
    something else shares the cores."""
    if not Path("/proc/stat").exists():
        return None  # not Linux: nothing to read; the caller's run is not checked
    busy = busy_cores()
    if busy > max_busy_cores:
        return (f"the machine is busy ({busy:.1f} of {os.cpu_count()} cores in use while "
                "idle here): stop what else is running and run again")
    return None
