"""C++ from a string, compiled once per content and called through ``ctypes``.

Chapter 17's lab has the learner write a kernel in C++ and run it from Python. PyTorch's
``torch.utils.cpp_extension.load_inline`` compiles a source string with the machine's
compiler (the one torch uses: ``$CXX``, else ``c++``) through ninja. Two choices keep that
quick enough to grade every submission and every mutant:

* the source includes only standard headers (``no_implicit_headers``: no
  ``torch/extension.h``, whose templates take a minute or more to compile) and exports
  plain ``extern "C"`` functions over raw pointers, which Python calls with ``ctypes``
  (:func:`pointer` gives a tensor's address). A build then takes a second or two;
* the build is cached in torch's extension directory (``$TORCH_EXTENSIONS_DIR``, else
  ``~/.cache/torch_extensions``) under a name that hashes the source, the compiler flags,
  the CPU's instruction-set flags and the torch version: the same source is compiled once
  per machine, and a library built for one CPU (``-march=native``) is never loaded on
  another, where an instruction it lacks would kill the process.

Without a compiler or ninja, :func:`compiler_problem` says what is missing before anything
is attempted, and :func:`compile_cpp` raises :class:`CompilerMissing` with that message.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil

import torch

from .machine import cpu_flags

# -O3 -march=native: vectorise for this CPU. -fopenmp: '#pragma omp' loops run on torch's
# threads (the library links the OpenMP runtime torch already loaded).
FLAGS = ("-O3", "-march=native", "-fopenmp")


class CompilerMissing(RuntimeError):
    """No C++ toolchain here: the message says what to install."""


def compiler_problem() -> str | None:
    """Why C++ cannot be compiled here (no compiler, no ninja), or None."""
    # torch's extension builder takes ~0.5 s to import: paid only where C++ is compiled.
    from torch.utils import cpp_extension

    compiler = cpp_extension.get_cxx_compiler()
    if shutil.which(compiler) is None:
        return (f"no C++ compiler: torch compiles with {compiler!r} ($CXX), which is not on "
                "PATH (Debian: apt-get install g++; macOS: xcode-select --install)")
    if not cpp_extension.is_ninja_available():
        return "no ninja, which torch's C++ builds need (pip install ninja)"
    return None


def build_name(source: str, prefix: str, flags: tuple[str, ...] = FLAGS) -> str:
    """The cache entry of ``source`` built with ``flags`` for this CPU and torch: change any
    of them and the name changes."""
    key = "\0".join([source, *flags, *cpu_flags(), torch.__version__])
    return f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


@functools.cache
def compile_cpp(source: str, prefix: str = "minillm_inline",
                flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    """The shared library built from ``source`` (C++ with ``extern "C"`` functions and only
    standard headers), compiled the first time and loaded from the cache afterwards.

    Raises :class:`CompilerMissing` without a toolchain, and RuntimeError with the
    compiler's messages when the source does not compile.
    """
    from torch.utils import cpp_extension  # see compiler_problem

    if (problem := compiler_problem()) is not None:
        raise CompilerMissing(problem)
    name = build_name(source, prefix, flags)
    path = cpp_extension.load_inline(
        name, source, extra_cflags=list(flags), extra_ldflags=["-fopenmp"],
        no_implicit_headers=True, is_python_module=False, verbose=False)
    return ctypes.CDLL(path)


def pointer(tensor: torch.Tensor) -> ctypes.c_void_p:
    """The address of a contiguous tensor's first element, for a C function's argument."""
    if not tensor.is_contiguous():
        raise ValueError("C code reads tensors as one block of memory: pass a contiguous "
                         "tensor (.contiguous())")
    return ctypes.c_void_p(tensor.data_ptr())
