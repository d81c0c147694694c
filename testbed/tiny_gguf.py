"""A tiny random-weight llama GGUF for the testbed's llama-server.

``python -m testbed.tiny_gguf OUT.gguf [--seed N]`` writes it.

Two layers, hidden 64, a character vocabulary: a few hundred KB that load in well under a second,
seeded, so the same seed writes the same bytes. The output is gibberish by design; what matters is
that serving behaves like a real model's: every request runs to ``max_tokens`` (stable token counts
and timings) and its text is printable.

That takes *unsampleable* special and byte tokens. Sampling cannot be told so from the file (token
scores only guide the tokenizer's merges), so the weights do it:

- hidden dimension 0 is a constant ``ANCHOR`` in every token embedding, and no layer writes to it
  (row 0 of ``attn_output`` and ``ffn_down`` is zero), so it reaches the output norm unchanged and
  the normed value ``h[0]`` is positive for every input;
- the output rows of ``<unk>``, ``<s>``, ``</s>`` and the 256 byte tokens are ``-BAN`` in column 0
  and zero elsewhere, so their logit is ``-BAN * h[0]`` (about -400), while a character token's row
  is zero in column 0 and random elsewhere, so it scores within about +-15 of 0. By Cauchy-Schwarz
  (the normed state has norm 8) that order holds for every residual state whose other dimensions
  stay under about 0.6 (root mean square), ten times what the layers produce. No special or byte
  token survives top-k or is drawn at any ordinary temperature, so EOS never ends a reply early;
- the norms inside the layers give dimension 0 a gain of 0, so the anchor does not drown the
  tokens' own signal there.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

ARCH = "llama"
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_CTX_TRAIN = 4096
DEFAULT_SEED = 0
SPECIAL = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_BYTES = 256
#: SentencePiece writes a space as U+2581; then the printable ASCII characters but space.
CHARS = ("\u2581", *(chr(c) for c in range(0x21, 0x7F)))
#: ``N_SPECIAL_AND_BYTES`` ids from 0 are never sampled (see the module's docstring).
N_SPECIAL_AND_BYTES = len(SPECIAL) + N_BYTES
N_VOCAB = N_SPECIAL_AND_BYTES + len(CHARS)
ANCHOR = 1.0
BAN = 50.0
#: Norm gain inside the layers: brings the small non-anchor values back to about unit scale.
GAIN = 8.0
#: A plain template that jinja renders and no engine treats specially.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Shape:
    """The model's size. The default is the testbed's tiny model; the GPU tests serve a larger
    one (8 layers, hidden 2048, about 1.5 GB) so the GPU does real work per token."""

    layers: int = N_LAYER
    hidden: int = N_EMBD
    heads: int = N_HEAD
    ffn: int = N_FF


TINY = Shape()


def vocabulary() -> tuple[list[str], list[int]]:
    tokens = [*SPECIAL, *(f"<0x{b:02X}>" for b in range(N_BYTES)), *CHARS]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * N_BYTES + [gguf.TokenType.NORMAL] * len(CHARS)
    return tokens, [int(t) for t in types]


def tensors(seed: int, shape: Shape = TINY) -> dict[str, F32]:
    """Weights in numpy (out, in) order, which gguf stores as llama.cpp's {in, out}.

    The scales are the tiny model's, scaled by fan-in for a larger shape, so every residual
    write keeps the variance the module's docstring reasons about."""
    rng = np.random.default_rng(seed)
    n_embd, n_ff = shape.hidden, shape.ffn
    std_in = 1.0 / math.sqrt(n_embd)  # 0.125 for the tiny model
    std_out = 0.003 * math.sqrt(N_EMBD / n_embd)
    std_down = 0.003 * math.sqrt(N_FF / n_ff)

    def normal(shape: tuple[int, ...], std: float) -> F32:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    gains = np.full(n_embd, GAIN, dtype=np.float32)
    gains[0] = 0.0  # inside the layers the anchor dimension reads as 0
    out_gains = np.ones(n_embd, dtype=np.float32)  # at the output the anchor carries the ban

    embd = normal((N_VOCAB, n_embd), 0.02)
    embd[:, 0] = ANCHOR
    output = normal((N_VOCAB, n_embd), 1.0)
    output[:, 0] = 0.0
    output[:N_SPECIAL_AND_BYTES, :] = 0.0
    output[:N_SPECIAL_AND_BYTES, 0] = -BAN
    weights = {"token_embd.weight": embd, "output_norm.weight": out_gains, "output.weight": output}
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        attn_out = normal((n_embd, n_embd), std_out)
        ffn_down = normal((n_embd, n_ff), std_down)
        attn_out[0, :] = 0.0  # nothing writes to the anchor dimension
        ffn_down[0, :] = 0.0
        weights |= {
            f"{blk}.attn_norm.weight": gains.copy(),
            f"{blk}.attn_q.weight": normal((n_embd, n_embd), std_in),
            f"{blk}.attn_k.weight": normal((n_embd, n_embd), std_in),
            f"{blk}.attn_v.weight": normal((n_embd, n_embd), std_in),
            f"{blk}.attn_output.weight": attn_out,
            f"{blk}.ffn_norm.weight": gains.copy(),
            f"{blk}.ffn_gate.weight": normal((n_ff, n_embd), std_in),
            f"{blk}.ffn_up.weight": normal((n_ff, n_embd), std_in),
            f"{blk}.ffn_down.weight": ffn_down,
        }
    return weights


def write(
    path: Path, seed: int = DEFAULT_SEED, name: str = "ct200-testbed-tiny", shape: Shape = TINY
) -> Path:
    """Write the model to ``path`` atomically (temp file, fsync, rename); returns ``path``."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(name)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_context_length(N_CTX_TRAIN)
        writer.add_embedding_length(shape.hidden)
        writer.add_block_count(shape.layers)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.heads)
        writer.add_rope_dimension_count(shape.hidden // shape.heads)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(N_VOCAB)
        tokens, types = vocabulary()
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * N_VOCAB)
        writer.add_token_types(types)
        writer.add_unk_token_id(UNK_ID)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)
        for tensor_name, data in tensors(seed, shape).items():
            writer.add_tensor(tensor_name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.chmod(0o644)  # read by the server's own user; nothing secret in it
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.tiny_gguf",
        description="Write the testbed's tiny random-weight llama GGUF (a few hundred KB).",
    )
    parser.add_argument("out", type=Path, help="the .gguf file to write (replaced atomically)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="weights' RNG seed")
    parser.add_argument("--layers", type=int, default=N_LAYER, help="blocks (default: tiny)")
    parser.add_argument("--hidden", type=int, default=N_EMBD, help="embedding width")
    parser.add_argument("--heads", type=int, default=N_HEAD, help="attention heads")
    parser.add_argument("--ffn", type=int, default=N_FF, help="feed-forward width")
    args = parser.parse_args(argv)
    shape = Shape(args.layers, args.hidden, args.heads, args.ffn)
    if min(shape.layers, shape.hidden, shape.heads, shape.ffn) < 1 or shape.hidden % shape.heads:
        print(
            "tiny_gguf: error: sizes must be positive and --hidden a multiple of --heads",
            file=sys.stderr,
        )
        return 2
    out: Path = args.out
    if not out.parent.is_dir():
        print(f"tiny_gguf: error: {out.parent}: no such directory; create it", file=sys.stderr)
        return 2
    try:
        write(out, seed=args.seed, shape=shape)
    except OSError as exc:
        print(f"tiny_gguf: error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{out} ({out.stat().st_size // 1024} KiB, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
