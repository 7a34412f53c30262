"""C++ from a string (minillm.inline_cpp): built once per content, called through ctypes,
and a clear refusal without a compiler."""

from __future__ import annotations

import ctypes

import pytest
import torch

from minillm.inline_cpp import (
    CompilerMissing,
    build_name,
    compile_cpp,
    compiler_problem,
    pointer,
)

needs_compiler = pytest.mark.skipif(compiler_problem() is not None,
                                    reason=f"no C++ toolchain: {compiler_problem()}")

SCALE = """
#include <cstdint>
extern "C" void scale(const float* x, float* y, int64_t n, float factor) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * factor;
}
"""


@needs_compiler
def test_a_source_compiles_once_and_runs_on_tensors():
    library = compile_cpp(SCALE, "test_scale")
    x, y = torch.arange(5.0), torch.empty(5)
    library.scale(pointer(x), pointer(y), ctypes.c_int64(5), ctypes.c_float(2.5))
    assert torch.equal(y, x * 2.5)
    assert compile_cpp(SCALE, "test_scale") is library  # cached in the process


def test_the_build_name_follows_the_source_and_the_flags():
    assert build_name(SCALE, "p") == build_name(SCALE, "p")
    assert build_name(SCALE, "p") != build_name(SCALE + "\n", "p")
    assert build_name(SCALE, "p") != build_name(SCALE, "p", ("-O2",))
    assert build_name(SCALE, "p").startswith("p_")


@needs_compiler
def test_a_source_that_does_not_compile_raises_with_the_compiler_output():
    with pytest.raises(RuntimeError, match="rror"):
        compile_cpp('extern "C" int broken( { return 0; }', "test_broken")


def test_without_a_compiler_the_problem_is_named(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    problem = compiler_problem()
    assert problem is not None and "/nonexistent/c++" in problem and "install" in problem
    with pytest.raises(CompilerMissing, match="no C\\+\\+ compiler"):
        compile_cpp(SCALE + "// not built", "test_missing")


def test_pointer_refuses_a_strided_tensor():
    with pytest.raises(ValueError, match="contiguous"):
        pointer(torch.zeros(4, 4).T)
