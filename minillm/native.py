"""minillm's C++ kernels for the CPU (``minillm/csrc``), built on first use.

Four pieces, measured against what PyTorch offers (``docs/benchmarks.md``):

* ``minillm::int8_linear`` (``int8_linear.cpp``, ``int8_product.h``): int8 weights times
  activations rounded to uint8 per row, the product of :mod:`minillm.quant.int8_activations`;
* ``minillm::w4a8_linear`` (``w4a8_linear.cpp``, ``int4_product.h``): int4 weights in
  groups times activations rounded to int8 per row (:mod:`minillm.quant.w4a8`);
* ``minillm::paged_decode_attention`` (``paged_attention.cpp``): a decode step's attention
  over the paged KV pool, for the compiled executor;

  these three are torch ops (schemas, shapes and Python references: :mod:`minillm.ops`);
  loading the library registers their CPU kernels, which then run instead of the references;
* ``DecodeLayers`` (``decode_layers.cpp``): a whole decode step through every block, for
  the native executor (:mod:`minillm.engine.executors.native`).

PyTorch's extension loader compiles them with the machine's C++ compiler (g++ and ninja)
for the CPU it runs on (``-march=native``: AVX-512 VNNI, or the 256-bit AVX-VNNI, where
there is one): a minute or two the first time, announced on stderr, instant afterwards.
The build lives in a directory of torch's extension cache named by a key
(:func:`build_name`) that hashes everything the library depends on: the CPU's instruction
set flags (a library built for one CPU is never loaded on another, in a shared home, a
Docker layer or a CI cache, where an instruction it lacks would kill the process), the
compiler flags, the sources' contents, and the torch and Python it is built against. The
sources are compiled from a copy in that directory, so two checkouts of the same sources
share one build, and a library already there is imported without asking the compiler.

Without a compiler, or when the build fails, the ops keep running their Python references
(the same numbers, bit for bit for int8, only slower) after one warning that says what to
install; the native executor and compiled steps are then unavailable and the engine runs
eagerly.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .machine import cpu_flags

SOURCES = Path(__file__).with_name("csrc")
SOURCE_FILES = ["int8_linear.cpp", "w4a8_linear.cpp", "paged_attention.cpp",
                "decode_layers.cpp"]
SOURCE_PATTERNS = ("*.cpp", "*.h")  # what a build reads: the files above and their headers
# -ffp-contract=off: no fused multiply-adds, so x * (1 / s) + z rounds as it does in PyTorch.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]
PROGRESS_EVERY_S = 1.0


def compiler_flags() -> list[str]:
    """``FLAGS``, with ``$MINILLM_NATIVE_CFLAGS`` appended (e.g. ``-mno-avx512f``, to build
    the 256-bit path on a CPU that also has AVX-512: the tests do)."""
    return FLAGS + os.environ.get("MINILLM_NATIVE_CFLAGS", "").split()


def source_files(directory: Path = SOURCES) -> list[Path]:
    """The C++ sources and headers in ``directory``, sorted by name."""
    return sorted((path for pattern in SOURCE_PATTERNS for path in directory.glob(pattern)),
                  key=lambda path: path.name)


def source_digest(directory: Path = SOURCES) -> str:
    """A hash of the sources' names and contents: where they live does not count."""
    digest = hashlib.sha256()
    for path in source_files(directory):
        content = path.read_bytes()
        digest.update(f"{path.name}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()


def build_name(flags: list[str], extra_flags: list[str], sources: str = "") -> str:
    """The cache entry of a library built for a CPU with ``flags``, with these compiler
    flags, from sources with this :func:`source_digest`, against this torch and Python:
    change any of them and the entry changes."""
    python = f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}"
    key = " ".join([*flags, "|", *extra_flags, "|", sources, "|", torch.__version__, python])
    return f"minillm_native_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@functools.cache
def native_kernels():
    """The compiled module (``DecodeLayers``, ``vector_paths``); loading it registers the
    ops' CPU kernels. None when it cannot be built: the ops then run their references."""
    # torch's extension builder takes ~0.5 s to import: paid only where the kernels are used.
    from torch.utils import cpp_extension

    flags = compiler_flags()
    name = build_name(cpu_flags(), flags, source_digest())
    try:
        # torch's extension cache: $TORCH_EXTENSIONS_DIR, or ~/.cache/torch_extensions/pyXY_cpu.
        directory = Path(cpp_extension._get_build_directory(name, verbose=False))
        library = directory / f"{name}{cpp_extension.LIB_EXT}"
        module = _import_built(name, library) if library.exists() else None
        if module is None:
            sources = _copy_sources(directory / "csrc")
            with _announce_build(directory):
                module = cpp_extension.load(name, [str(sources / f) for f in SOURCE_FILES],
                                            extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                            build_directory=str(directory))
    except (OSError, RuntimeError, ImportError) as error:
        warnings.warn(
            f"minillm's C++ kernels could not be built ({_first_line(error)}); int8 and int4 "
            "products run their Python reference (the same numbers, much slower) and "
            "decode steps run eagerly. Install a C++ compiler and ninja to build them "
            "(Debian: apt-get install g++; pip install ninja).", RuntimeWarning, stacklevel=2)
        return None
    paths = module.vector_paths()
    if "vnni" not in paths["int8"]:
        warnings.warn(f"this CPU has no VNNI dot-product instructions: int8 products run "
                      f"16-bit multiply-adds and int4 products a plain loop (several times "
                      f"slower); kernels: {paths}",
                      RuntimeWarning, stacklevel=2)
    return module


def _import_built(name: str, library: Path):
    """The library a previous build left, imported as torch's loader would, but without
    running the compiler (whose command line names this checkout's torch: another checkout
    would rebuild). None if it cannot be imported (a build cut short): build it then."""
    spec = importlib.util.spec_from_file_location(name, library)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


def _copy_sources(directory: Path) -> Path:
    """The sources, copied into the build's own directory the first time (a file there is
    never rewritten: a newer timestamp would make ninja build again)."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in source_files():
        target = directory / source.name
        if not target.exists():
            partial = directory / f".{source.name}.{os.getpid()}"
            shutil.copyfile(source, partial)
            os.replace(partial, target)  # whole or absent, for a build running beside us
    return directory


@contextlib.contextmanager
def _announce_build(directory: Path):
    """Say on stderr that a build starts and where it goes, and show its elapsed time
    (a background thread refreshes the line) until it ends, well or not."""
    where = str(directory).replace(str(Path.home()), "~", 1)
    print(f"minillm: building the C++ kernels for this CPU (once, a minute or two; cached in "
          f"{where})", file=sys.stderr, flush=True)
    bar = tqdm(desc="minillm: compiling", bar_format="{desc} {elapsed}", file=sys.stderr)
    finished = threading.Event()

    def tick():
        while not finished.wait(PROGRESS_EVERY_S):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="minillm-build-progress", daemon=True)
    ticker.start()
    outcome = "minillm: the build failed after"
    try:
        yield
        outcome = "minillm: built in"
    finally:
        finished.set()
        ticker.join()
        bar.set_description_str(outcome, refresh=False)
        bar.close()


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
