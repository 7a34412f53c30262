"""The C++ kernels cannot crash a process: the build cache is named after the CPU's
instruction sets; without a compiler every op runs its Python reference after one warning
that says what to install (and the engine runs eagerly); a build for a CPU with only
256-bit AVX-VNNI takes its vector path, and one without VNNI the plain loop, with a
warning. Each fallback is forced in a fresh process with its own build cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minillm.native import build_name, compiler_flags, cpu_flags, native_kernels

PROBE = """
import json, warnings
import torch
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from minillm.native import native_kernels
    kernels = native_kernels()
    native_kernels()  # cached: no second warning
from minillm.quant.int8_activations import int8_linear_reference
from minillm.quant.w4a8 import w4a8_linear_reference
torch.manual_seed(0)
x = torch.randn(5, 256)
codes8 = torch.randint(-127, 128, (96, 256), dtype=torch.int8)
scales = torch.rand(96) / 100
int8 = torch.ops.minillm.int8_linear(x, codes8, scales, codes8.sum(1, dtype=torch.int32))
codes4 = torch.randint(0, 256, (96, 8, 16), dtype=torch.uint8)
s4, z4 = (torch.rand(96, 8) / 10).half(), (torch.rand(96, 8) * 15).half()
int4 = torch.ops.minillm.w4a8_linear(x, codes4, s4, z4)
print(json.dumps({
    "built": kernels is not None,
    "paths": kernels.vector_paths() if kernels is not None else None,
    "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning],
    "int8_exact": bool(torch.equal(int8, int8_linear_reference(x, codes8, scales))),
    "int4_close": bool(torch.allclose(int4, w4a8_linear_reference(x, codes4, s4, z4),
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
from minillm.serve.executors import auto_executor
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


def run_probe(tmp_path, script: str, **env) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path),
                                            **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def probe(tmp_path, **env) -> dict:
    return json.loads(run_probe(tmp_path, PROBE, **env).strip().splitlines()[-1])


def test_the_build_is_named_after_the_cpu():
    flags = compiler_flags()
    assert build_name(["sse2", "avx2"], flags) != build_name(["sse2", "avx2", "avx512f"], flags)
    assert build_name(["avx2"], flags) != build_name(["avx2"], [*flags, "-mno-avx512f"])
    assert native_kernels().__name__ == build_name(cpu_flags(), flags)


@pytest.mark.slow
def test_without_a_compiler_every_op_runs_its_reference_after_one_warning(tmp_path):
    result = probe(tmp_path, CXX="/nonexistent/c++")
    assert not result["built"]
    assert len(result["warnings"]) == 1 and "Install a C++ compiler" in result["warnings"][0]
    assert result["int8_exact"] and result["int4_close"]
    assert "ENGINE OK" in run_probe(tmp_path, ENGINE, CXX="/nonexistent/c++")


@pytest.mark.slow
def test_a_cpu_with_256_bit_vnni_only_takes_its_vector_path(tmp_path):
    result = probe(tmp_path, MINILLM_NATIVE_CFLAGS="-mno-avx512f")
    expected = "avx-vnni" if "avx_vnni" in cpu_flags() else "scalar"
    assert result["built"] and result["paths"]["int8"] == result["paths"]["int4"] == expected
    assert result["paths"]["fp32"] == "avx2"
    assert result["int8_exact"] and result["int4_close"]


@pytest.mark.slow
def test_a_cpu_without_vnni_gets_the_plain_loop_and_says_so(tmp_path):
    result = probe(tmp_path, MINILLM_NATIVE_CFLAGS="-mno-avx512f -mno-avxvnni")
    assert result["built"] and result["paths"]["int8"] == result["paths"]["int4"] == "scalar"
    assert any("no VNNI" in message for message in result["warnings"])
    assert result["int8_exact"] and result["int4_close"]
