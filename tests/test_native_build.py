"""The C++ kernels cannot crash a process: the build cache is named after the CPU's
instruction sets (and the sources' contents, not their place); without a compiler every op
runs its Python reference after one warning that says what to install (and the engine runs
eagerly); a build for a CPU with only 256-bit AVX-VNNI takes its vector path, and one without
VNNI AVX2's 16-bit multiply-adds for int8 and the plain loop for int4, with a warning. A
build says so on stderr; a cached one says nothing. Loading the library makes the ops' CPU
kernels take over from the references; building a layer loads nothing, running it does.
Each case runs in a fresh process, the builds with their own cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minillm.native import (
    SOURCES,
    build_name,
    compiler_flags,
    cpu_flags,
    native_kernels,
    source_digest,
    source_files,
)

PROBE = """
import json, warnings
import torch
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from minillm.native import native_kernels
    kernels = native_kernels()
    native_kernels()  # cached: no second warning
from minillm import ops
torch.manual_seed(0)
x = torch.randn(5, 256)
codes8 = torch.randint(-127, 128, (96, 256), dtype=torch.int8)
scales = torch.rand(96) / 100
int8 = ops.int8_linear(x, codes8, scales, codes8.sum(1, dtype=torch.int32))
codes4 = torch.randint(0, 256, (96, 8, 16), dtype=torch.uint8)
s4, z4 = (torch.rand(96, 8) / 10).half(), (torch.rand(96, 8) * 15).half()
int4 = ops.w4a8_linear(x, codes4, s4, z4)
print(json.dumps({
    "built": kernels is not None,
    "paths": kernels.vector_paths() if kernels is not None else None,
    "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning],
    "int8_exact": bool(torch.equal(int8, ops.int8_linear_reference(x, codes8, scales))),
    "int4_close": bool(torch.allclose(int4, ops.w4a8_linear_reference(x, codes4, s4, z4),
                                      rtol=1e-5, atol=1e-5)),
}))
"""

ENGINE = """
import warnings
warnings.simplefilter("ignore")
from minillm.config import ModelConfig
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.int8_activations import to_int8_activations
from minillm.serve import LLM
from minillm.engine.executors import auto_executor
from minillm.testing import TINY, varied_random_model
from minillm import SamplingParams, reference
model = to_int8_activations(quantize_model(varied_random_model(ModelConfig(**TINY)), "rtn",
                                           QuantScheme(8, symmetric=True, group_size=None)))
assert auto_executor(model) == "eager"
llm = LLM(model, block_size=4, num_blocks=16)
out = llm.generate([[5, 17, 99]], SamplingParams(max_tokens=6), progress=False)[0].tokens
assert out == reference.generate(model, [5, 17, 99], 6)[0], out
print("ENGINE OK")
"""


PRECEDENCE = """
import json, warnings
import torch
warnings.simplefilter("always")
x = torch.randn(2, 32, dtype=torch.float64)  # the reference takes float64, the C++ kernel not
codes = torch.randint(-127, 128, (8, 32), dtype=torch.int8)
weights = codes, torch.rand(8), codes.sum(1, dtype=torch.int32)

def runs_reference():
    try:
        return torch.ops.minillm.int8_linear(x, *weights).dtype == torch.float64
    except RuntimeError as error:
        assert "x must be float32" in str(error), error
        return False

with warnings.catch_warnings(record=True) as caught:
    {steps}
print(json.dumps({{"before": before, "after": runs_reference(),
                  "warnings": [str(w.message) for w in caught]}}))
"""
OPS_FIRST = """from minillm import ops
    before = runs_reference()
    from minillm.native import native_kernels
    assert native_kernels() is not None"""
LIBRARY_FIRST = """from minillm.native import native_kernels
    assert native_kernels() is not None
    from minillm import ops
    before = None"""

LAZY = """
import torch
from minillm.native import native_kernels
from minillm.quant.int8_activations import Int8ActivationLinear
codes = torch.randint(-127, 128, (8, 32), dtype=torch.int8)
layer = Int8ActivationLinear(codes, torch.rand(8))
assert native_kernels.cache_info().currsize == 0, "building a layer loaded the kernels"
layer(torch.randn(2, 32))
assert native_kernels.cache_info().currsize == 1, "running a layer did not load them"
print("LAZY OK")
"""


def run_probe(cache, script: str, **env) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh process with its own build cache (or, with ``cache`` None,
    the user's: a build the in-process tests made)."""
    own_cache = {} if cache is None else {"TORCH_EXTENSIONS_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **own_cache, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def probe(tmp_path, **env) -> dict:
    return json.loads(run_probe(tmp_path, PROBE, **env).stdout.strip().splitlines()[-1])


def test_the_build_is_named_after_the_cpu():
    flags = compiler_flags()
    assert build_name(["sse2", "avx2"], flags) != build_name(["sse2", "avx2", "avx512f"], flags)
    assert build_name(["avx2"], flags) != build_name(["avx2"], [*flags, "-mno-avx512f"])
    assert native_kernels().__name__ == build_name(cpu_flags(), flags, source_digest())


def test_the_build_is_named_after_the_sources_contents_not_their_place(tmp_path):
    checkouts = [tmp_path / "one" / "csrc", tmp_path / "two" / "csrc"]
    for checkout in checkouts:
        checkout.mkdir(parents=True)
        for source in source_files():
            (checkout / source.name).write_bytes(source.read_bytes())
    assert source_digest(checkouts[0]) == source_digest(checkouts[1]) == source_digest(SOURCES)
    name = build_name(cpu_flags(), compiler_flags(), source_digest(checkouts[0]))
    assert name == build_name(cpu_flags(), compiler_flags(), source_digest(checkouts[1]))
    edited = checkouts[1] / "int8_linear.cpp"
    edited.write_text(edited.read_text() + "\n// an edit\n")
    (checkouts[0] / "new_header.h").write_text("#pragma once\n")
    (checkouts[0] / "notes.txt").write_text("not a source")
    digests = {source_digest(SOURCES), *map(source_digest, checkouts)}
    assert len(digests) == 3  # an edited file, a new header: each a new build
    assert len({build_name(cpu_flags(), compiler_flags(), d) for d in digests}) == 3


@pytest.mark.parametrize("order", [OPS_FIRST, LIBRARY_FIRST], ids=["ops first", "library first"])
def test_the_cpu_kernel_takes_over_from_the_reference_without_a_warning(order):
    native_kernels()  # built once, in the user's cache
    done = run_probe(None, PRECEDENCE.format(steps=order))
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] is (True if order is OPS_FIRST else None) and not result["after"]
    assert not any("Overrid" in m for m in result["warnings"]) and "Overrid" not in done.stderr


def test_building_a_layer_loads_nothing_and_running_it_loads_the_kernels():
    native_kernels()
    assert "LAZY OK" in run_probe(None, LAZY).stdout


@pytest.mark.slow
def test_a_build_says_so_and_a_cached_one_says_nothing(tmp_path):
    quick = {"MINILLM_NATIVE_CFLAGS": "-O0"}  # the last -O wins: a quick build for this test
    first = run_probe(tmp_path, PROBE, **quick)
    assert first.stderr.startswith("minillm: building the C++ kernels for this CPU (once")
    assert str(tmp_path.name) in first.stderr.splitlines()[0]
    assert "minillm: compiling" in first.stderr and "minillm: built in" in first.stderr
    assert json.loads(first.stdout.splitlines()[-1])["int8_exact"]
    again = run_probe(tmp_path, PROBE, **quick)
    assert "minillm:" not in again.stderr and json.loads(again.stdout.splitlines()[-1])["built"]


@pytest.mark.slow
def test_without_a_compiler_every_op_runs_its_reference_after_one_warning(tmp_path):
    result = probe(tmp_path, CXX="/nonexistent/c++")
    assert not result["built"]
    assert len(result["warnings"]) == 1 and "Install a C++ compiler" in result["warnings"][0]
    assert result["int8_exact"] and result["int4_close"]
    assert "ENGINE OK" in run_probe(tmp_path, ENGINE, CXX="/nonexistent/c++").stdout


@pytest.mark.slow
def test_a_cpu_with_256_bit_vnni_only_takes_its_vector_path(tmp_path):
    result = probe(tmp_path, MINILLM_NATIVE_CFLAGS="-mno-avx512f")
    vnni = "avx_vnni" in cpu_flags()
    assert result["built"] and result["paths"]["int4"] == ("avx-vnni" if vnni else "scalar")
    assert result["paths"]["int8"] == ("avx-vnni" if vnni else "avx2-madd-tile2x4")
    assert result["paths"]["fp32"] == "avx2-tile3x4"
    assert result["int8_exact"] and result["int4_close"]


@pytest.mark.slow
def test_a_cpu_without_vnni_gets_the_plain_loop_and_says_so(tmp_path):
    result = probe(tmp_path, MINILLM_NATIVE_CFLAGS="-mno-avx512f -mno-avxvnni")
    assert result["built"] and result["paths"]["int4"] == "scalar"
    assert result["paths"]["int8"] == "avx2-madd-tile2x4"  # exact 16-bit multiply-adds
    assert any("no VNNI" in message for message in result["warnings"])
    assert result["int8_exact"] and result["int4_close"]
