"""The command line speaks its own language: bad input gets a message naming the option or
file and what to do, before anything is printed; ``python -m minillm`` is the same command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from minillm.checkpoint import resolve_checkpoint
from minillm.cli import main
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.testing import tiny_pair


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("argv, message", [
    (["generate", ""], "the prompt is empty"),
    (["generate", "   "], "the prompt is empty"),
    (["generate", "Hello", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["generate", "Hello", "--window", "0"], "--window must be at least 1"),
])
def test_bad_options_are_reported_before_any_output(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("minillm generate: error: ") and message in err


def test_a_checkpoint_without_a_tokenizer_says_so(capsys, tmp_path):
    tiny_pair(tmp_path)
    code, out, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path))
    assert code == 2 and out == "" and "has no tokenizer" in err


def test_too_many_new_tokens_names_the_limit(capsys, tmp_path, tokenizer):
    tiny_pair(tmp_path)  # context 128
    tokenizer.hf.save_pretrained(tmp_path)
    code, out, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path),
                             "--max-new-tokens", "500")
    assert code == 2 and out == ""
    assert "use --max-new-tokens" in err


@pytest.mark.parametrize("config_text, message", [
    ('{"vocab_size": ', "is not valid JSON"),
    ('{"model_type": "gpt2", "vocab_size": 5}', "is not a family minillm implements"),
    ('{"model_type": "llama", "vocab_size": 5}', "has no 'num_attention_heads' field"),
])
def test_a_bad_config_names_the_file(capsys, tmp_path, config_text, message):
    tiny_pair(tmp_path)
    (tmp_path / "config.json").write_text(config_text)
    code, out, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path))
    assert code == 2 and out == ""
    assert str(tmp_path / "config.json") in err and message in err


def test_truncated_weights_name_the_file(capsys, tmp_path):
    tiny_pair(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, out, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path))
    assert code == 2 and out == ""
    assert str(weights) in err and "Re-download" in err


def test_weights_of_the_wrong_shape_name_the_checkpoint(capsys, tmp_path):
    tiny_pair(tmp_path / "small")
    tiny_pair(tmp_path / "big", hidden_size=128)
    shutil.copy(tmp_path / "big" / "model.safetensors", tmp_path / "small")
    code, _, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path / "small"))
    assert code == 2 and "does not match its config" in err and str(tmp_path / "small") in err


def test_python_dash_m_is_the_minillm_command():
    done = subprocess.run([sys.executable, "-m", "minillm", "generate", ""],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "minillm generate: error: the prompt is empty" in done.stderr


def test_the_registry_and_the_cli_offer_the_same_methods():
    from minillm.cli import build_parser
    from minillm.quant import QUANTIZERS

    quantize = build_parser()._subparsers._group_actions[0].choices["quantize"]
    method = next(a for a in quantize._actions if a.dest == "method")
    assert list(method.choices) == list(QUANTIZERS)
    assert json.dumps(sorted(QUANTIZERS))  # names are plain strings


def int8_checkpoint(capsys, tmp_path, tokenizer):
    """``minillm quantize`` of a tiny model: per-channel int8 weights and embedding."""
    tiny_pair(tmp_path / "float", vocab_size=49152, tie_word_embeddings=True)
    tokenizer.hf.save_pretrained(tmp_path / "float")
    out = tmp_path / "int8"
    assert run_cli(capsys, "quantize", str(out), "--model", str(tmp_path / "float"),
                   "--bits", "8", "--symmetric", "--group-size", "0",
                   "--embedding", "int8")[0] == 0
    return out


@pytest.mark.slow
def test_generate_runs_a_quantized_checkpoint_through_the_compiled_fast_path(
        capsys, tmp_path, tokenizer):
    """``minillm quantize`` then ``minillm generate --model DIR``: weight-only layers, the
    decode step compiled (its time reported), the tokens of the slow path."""
    from minillm.checkpoint import load_model
    from minillm.reference import generate

    out = int8_checkpoint(capsys, tmp_path, tokenizer)
    code, text, err = run_cli(capsys, "generate", "Hello", "--model", str(out),
                              "--max-new-tokens", "6")
    assert code == 0 and "decode step compiled in" in err
    expected = generate(load_model(out), tokenizer.encode("Hello"), 6,
                        stop_tokens=tokenizer.stop_tokens)[0]
    expected = [t for t in expected if t not in tokenizer.stop_tokens]
    assert text == "Hello" + tokenizer.decode(expected) + "\n"


def test_int8_activations_need_int8_weights(capsys, tmp_path, tokenizer):
    tiny_pair(tmp_path)
    tokenizer.hf.save_pretrained(tmp_path)
    code, out, err = run_cli(capsys, "generate", "Hello", "--model", str(tmp_path),
                             "--int8-activations")
    assert code == 2 and out == ""
    assert "needs per-channel int8 weights" in err and "minillm quantize" in err


def test_serve_with_int8_activations_refuses_what_it_cannot_run(capsys, tmp_path, tokenizer):
    """``minillm serve --int8-activations``: one process only, and int8 weights needed; both
    refused before a port is opened."""
    tiny_pair(tmp_path)
    tokenizer.hf.save_pretrained(tmp_path)
    code, out, err = run_cli(capsys, "serve", "--model", str(tmp_path), "--int8-activations",
                             "--tensor-parallel", "2")
    assert code == 2 and "drop --tensor-parallel" in err
    code, out, err = run_cli(capsys, "serve", "--model", str(tmp_path), "--int8-activations")
    assert code == 2 and "needs per-channel int8 weights" in err and "minillm quantize" in err


@pytest.mark.slow
def test_generate_with_int8_activations_decodes_natively(capsys, tmp_path, tokenizer):
    """--int8-activations: W8A8 layers, decode steps in C++ (nothing compiled), the tokens
    of the Python model."""
    from minillm.checkpoint import load_model
    from minillm.quant.int8_activations import to_int8_activations
    from minillm.reference import generate

    out = int8_checkpoint(capsys, tmp_path, tokenizer)
    code, text, err = run_cli(capsys, "generate", "Hello", "--model", str(out),
                              "--max-new-tokens", "6", "--int8-activations")
    model = to_int8_activations(load_model(out))
    expected = generate(model, tokenizer.encode("Hello"), 6, stop_tokens=tokenizer.stop_tokens)[0]
    expected = [t for t in expected if t not in tokenizer.stop_tokens]
    assert code == 0 and text == "Hello" + tokenizer.decode(expected) + "\n"
    assert "compiled" not in err


def test_distill_saves_a_draft_that_loads_resumes_and_reports_agreement(capsys, tmp_path,
                                                                        tokenizer):
    """``minillm distill``: a layer-dropped student of a tiny teacher, trained on corpus
    windows, saved as a checkpoint ``load_model`` and ``Tokenizer`` accept; a second run
    finds its state and adds nothing; the report's agreements are measured numbers."""
    import json

    import torch

    from minillm.checkpoint import load_model
    from minillm.tokenizer import Tokenizer

    teacher_dir = tmp_path / "teacher"
    tiny_pair(teacher_dir, vocab_size=49152, num_layers=3, tie_word_embeddings=True)
    tokenizer.hf.save_pretrained(teacher_dir)
    out = tmp_path / "draft"
    argv = ["distill", str(out), "--teacher", str(teacher_dir), "--layers", "0,2",
            "--windows", "8", "--seq-len", "33", "--eval-windows", "2", "--top-k", "8",
            "--steps", "6", "--batch-size", "2", "--lr", "1e-3"]
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "held-out greedy agreement" in text
    draft = load_model(out)
    assert draft.config.num_layers == 2 and Tokenizer(out).encode("Hello")
    report = json.loads((out / "distill_report.json").read_text())
    assert report["layers"] == [0, 2] and report["train_tokens"] == 6 * 2 * 32
    assert 0 <= report["held_out_agreement_before"] <= 1
    weights = {k: v.clone() for k, v in draft.state_dict().items()}
    assert run_cli(capsys, *argv)[0] == 0  # resumes at step 6 of 6: the same weights
    again = load_model(out).state_dict()
    assert all(torch.equal(again[k], v) for k, v in weights.items())
    code, _, err = run_cli(capsys, "distill", str(tmp_path / "bad"), "--teacher",
                           str(teacher_dir), "--layers", "0,7")
    assert code == 2 and "keep must name layers in 0..2" in err


def test_perplexity_scores_a_checkpoint(capsys, tmp_path, tokenizer):
    tiny_pair(tmp_path, vocab_size=tokenizer.vocab_size)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), tmp_path)
    code, out, _ = run_cli(capsys, "perplexity", "--model", str(tmp_path), "--window", "32",
                           "--max-windows", "2")
    assert code == 0
    assert out.startswith("wikipedia/eval: perplexity ") and "in 2 windows of 32" in out


def test_serve_refuses_a_draft_head_or_kv_dtype_it_cannot_run(capsys, tmp_path, tokenizer):
    """``minillm serve --draft-head`` needs --speculative-tokens, and ``--kv-cache-dtype
    int4`` runs eager steps only: both refused before a port is opened, saying why."""
    tiny_pair(tmp_path)
    tokenizer.hf.save_pretrained(tmp_path)
    code, out, err = run_cli(capsys, "serve", "--model", str(tmp_path), "--draft-head",
                             str(tmp_path / "no-head"))
    assert code == 2 and "speculative_tokens" in err
    code, out, err = run_cli(capsys, "serve", "--model", str(tmp_path), "--kv-cache-dtype",
                             "int4", "--executor", "native")
    assert code == 2 and "int4" in err
