"""A tiny llama-architecture model written as GGUF, so the real-engine test and the
demo need no download: about 0.5 MiB of float32, loaded by llama.cpp in milliseconds.
Needs the ``gguf`` package (the ``test`` and ``demo`` extras), imported only when called.

Why it looks the way it does:

- **Architecture ``llama``**: the one every llama.cpp version supports; 2 layers,
  embedding 64, 4 heads (head size 16), feed-forward 128, context 256.
- **Vocabulary**: a SentencePiece-style (``tokenizer.ggml.model = "llama"``) vocabulary
  of ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>`` .. ``<0xFF>`` (so any
  prompt tokenizes, by byte fallback; llama.cpp also looks up ``<0x0A>`` as its line
  feed token and fails to load without it), then ``▁`` (SentencePiece's space) and the
  letters ``a`` .. ``z``.
- **Weights**: fixed (seeded) random, except that the output can only be letters and
  spaces: every embedding has a constant component 0, no layer writes to component 0
  (row 0 of ``attn_output`` and ``ffn_down`` is zero), so after the final norm that
  component is large and positive, and the output rows of every other token (control,
  unknown, byte) weigh it strongly negative. The text is gibberish, but always
  printable ASCII (no lone UTF-8 bytes for the server to swallow) and never an early
  end-of-stream: ``max_tokens`` tokens always come out.

Metadata keys, each because llama.cpp (or llama-cpp-python) reads it:

- ``general.architecture`` (written by `GGUFWriter`): selects the llama graph.
- ``general.name``: shown in llama.cpp's load log; harmless, helps debugging.
- ``llama.context_length``: required (``n_ctx_train``).
- ``llama.embedding_length``, ``llama.block_count``, ``llama.feed_forward_length``,
  ``llama.attention.head_count``: required hyper-parameters.
- ``llama.attention.head_count_kv``: optional (defaults to head_count); explicit.
- ``llama.attention.layer_norm_rms_epsilon``: required for the llama architecture.
- ``llama.rope.dimension_count``, ``llama.rope.freq_base``: explicit rather than derived.
- ``llama.vocab_size``: checked against the token list.
- ``general.file_type``: all float32 (informative; llama.cpp reports it).
- ``tokenizer.ggml.model``: ``llama`` selects the SentencePiece tokenizer.
- ``tokenizer.ggml.tokens``, ``.scores``, ``.token_type``: the vocabulary; the types
  mark byte tokens (decoded to raw bytes), control tokens and ``<unk>``.
- ``tokenizer.ggml.bos_token_id``, ``.eos_token_id``, ``.unknown_token_id``: the
  special tokens (llama-cpp-python also reads bos/eos to fill the chat template).
- ``tokenizer.ggml.add_bos_token``, ``.add_eos_token``, ``.add_space_prefix``: how a
  prompt is framed, explicit so no version's default matters.
- ``tokenizer.chat_template``: a plain Jinja template, so llama-cpp-python's server
  formats chat messages with it instead of guessing a chat format.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MODEL_ALIAS", "N_CTX", "write_tiny_llama"]

#: The model id the test and the demo serve it as (``--model_alias``).
MODEL_ALIAS = "tiny-llama"
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_FF = 128
N_CTX = 256
LETTERS = ["\u2581", *"abcdefghijklmnopqrstuvwxyz"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}assistant:"
)


def vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, token types): specials, the 256 bytes, then space and letters."""
    import gguf

    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [int(tt.UNKNOWN), int(tt.CONTROL), int(tt.CONTROL)]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [int(tt.BYTE)] * 256
    tokens += LETTERS
    types += [int(tt.NORMAL)] * len(LETTERS)
    return tokens, types


def write_tiny_llama(path: Path, seed: int = 11) -> Path:
    """Write the model to `path` (deterministic for a given `seed`); returns `path`."""
    import gguf

    tokens, types = vocabulary()
    n_vocab = len(tokens)
    allowed = np.array([t == int(gguf.TokenType.NORMAL) for t in types])
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("populi tiny test llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shape is (out, in): ggml's ne is the reverse, as llama.cpp expects.
    embd = normal(n_vocab, N_EMBD, scale=1.0)
    embd[:, 0] = 8.0  # the constant component (see the module docstring)
    writer.add_tensor("token_embd.weight", embd)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    out = normal(n_vocab, N_EMBD, scale=1.0)
    out[:, 0] = np.where(allowed, 0.0, -8.0)
    writer.add_tensor("output.weight", out)
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"{blk}.{name}.weight", normal(N_EMBD, N_EMBD, scale=0.1))
        attn_out = normal(N_EMBD, N_EMBD, scale=0.1)
        attn_out[0, :] = 0.0
        writer.add_tensor(f"{blk}.attn_output.weight", attn_out)
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", normal(N_FF, N_EMBD, scale=0.1))
        writer.add_tensor(f"{blk}.ffn_up.weight", normal(N_FF, N_EMBD, scale=0.1))
        down = normal(N_EMBD, N_FF, scale=0.1)
        down[0, :] = 0.0
        writer.add_tensor(f"{blk}.ffn_down.weight", down)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":  # python -m populi_p2p.testing.tiny_gguf OUT.gguf
    import sys

    print(write_tiny_llama(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf")))
