"""The tiny GGUF: what llama.cpp reads from it, read back with the gguf package's own reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from testbed import tiny_gguf

pytestmark = pytest.mark.llama
REPO = Path(__file__).resolve().parents[2]


def _field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = tiny_gguf.write(tmp_path / "a.gguf", seed=3)
    b = tiny_gguf.write(tmp_path / "b.gguf", seed=3)
    c = tiny_gguf.write(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert 100_000 < a.stat().st_size < 1_000_000  # a few hundred KB
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_llama_architecture_and_sizes(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tiny_gguf.write(tmp_path / "m.gguf"))
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == 2
    assert _field(reader, "llama.embedding_length") == 64
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    # GGUF shapes are llama.cpp's {in, out}: the embedding is {n_embd, n_vocab}.
    assert shapes["token_embd.weight"] == (64, tiny_gguf.N_VOCAB)
    assert shapes["output.weight"] == (64, tiny_gguf.N_VOCAB)
    assert shapes["blk.1.ffn_down.weight"] == (tiny_gguf.N_FF, 64)
    assert sum(name.startswith("blk.") for name in shapes) == 2 * 9


def test_tokenizer_layout(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tiny_gguf.write(tmp_path / "m.gguf"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(types, list)
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:259]) == {int(gguf.TokenType.BYTE)}
    assert types[:3] == [int(gguf.TokenType.UNKNOWN), *[int(gguf.TokenType.CONTROL)] * 2]
    assert tokens[259] == "\u2581" and "".join(tokens[260:]) == "".join(map(chr, range(33, 127)))
    ids = ("unknown", "bos", "eos")
    assert [_field(reader, f"tokenizer.ggml.{name}_token_id") for name in ids] == [0, 1, 2]
    assert "add_generation_prompt" in str(_field(reader, "tokenizer.chat_template"))


def test_special_and_byte_tokens_lose_to_every_character_token() -> None:
    """The ban in the weights, checked on the output head for any normed state the model can
    reach: h[0] = ANCHOR / rms > 0 and the other dimensions bounded by the norm."""
    weights = tiny_gguf.tensors(tiny_gguf.DEFAULT_SEED)
    output = weights["output.weight"].astype(np.float64)
    for layer in range(tiny_gguf.N_LAYER):  # nothing writes to the anchor dimension
        assert not weights[f"blk.{layer}.attn_output.weight"][0].any()
        assert not weights[f"blk.{layer}.ffn_down.weight"][0].any()
    assert (weights["token_embd.weight"][:, 0] == tiny_gguf.ANCHOR).all()
    rng = np.random.default_rng(1)
    # From the embedding's 0.02 and the ~0.07 the layers produce up to far beyond it.
    for scale in (0.01, 0.07, 0.5):
        x = rng.normal(0.0, scale, size=(1000, tiny_gguf.N_EMBD))
        x[:, 0] = tiny_gguf.ANCHOR
        h = x / np.sqrt((x**2).mean(axis=1, keepdims=True)) * weights["output_norm.weight"]
        logits = h @ output.T
        banned = logits[:, : tiny_gguf.N_SPECIAL_AND_BYTES].max(axis=1)
        allowed = logits[:, tiny_gguf.N_SPECIAL_AND_BYTES :].min(axis=1)
        assert (allowed - banned > 20).all()  # e^-20: never drawn, never in a top-k
    # The worst case, by Cauchy-Schwarz: |h| = 8 after the norm, so a character token's logit is
    # at least -|row| * |h[1:]|, for any residual whose other dimensions have an rms up to 0.5.
    n = tiny_gguf.N_EMBD
    h0 = np.sqrt(n) * tiny_gguf.ANCHOR / np.sqrt(tiny_gguf.ANCHOR**2 + (n - 1) * 0.5**2)
    row = np.linalg.norm(output[tiny_gguf.N_SPECIAL_AND_BYTES :], axis=1).max()
    assert tiny_gguf.BAN * h0 - row * np.sqrt(n - h0**2) > 20


def test_cli_writes_and_rejects_a_missing_directory(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "testbed.tiny_gguf", str(tmp_path / "t.gguf"), "--seed", "5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    again = tiny_gguf.write(tmp_path / "u.gguf", seed=5)
    assert (tmp_path / "t.gguf").read_bytes() == again.read_bytes()
    bad = subprocess.run(
        [sys.executable, "-m", "testbed.tiny_gguf", str(tmp_path / "no" / "t.gguf")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "no" in bad.stderr and "Traceback" not in bad.stderr
