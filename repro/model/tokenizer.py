"""The tiny model's character-level tokenizer, built offline with HF ``tokenizers``.

Ids: ``<bos>`` 0, ``<eos>`` 1, ``<pad>`` 2, then one id per character of ``TINY_ALPHABET`` in order. A BPE model
with no merges splits any text into single characters; the post-processor prepends ``<bos>`` so that
``tokenizer("37+05=")`` is exactly the prompt the model sees (BOS + prompt text). Saved as ``tokenizer.json`` +
``tokenizer_config.json``, it loads with ``AutoTokenizer.from_pretrained(folder)`` like any Hub tokenizer.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, processors

from repro.data.tinymath import TINY_ALPHABET
from repro.errors import ReproError

# Token ids the tiny model is built with (repro/model/tiny.py): specials first, then TINY_ALPHABET in order.
BOS_TOKEN_ID = 0
EOS_TOKEN_ID = 1
PAD_TOKEN_ID = 2
TINY_VOCAB_SIZE = 25  # 3 specials + the 22 characters of TINY_ALPHABET

SPECIAL_TOKENS = {"<bos>": BOS_TOKEN_ID, "<eos>": EOS_TOKEN_ID, "<pad>": PAD_TOKEN_ID}


def tiny_vocab() -> dict[str, int]:
    """token -> id: the three specials, then TINY_ALPHABET's characters (which must be distinct)."""
    vocab = dict(SPECIAL_TOKENS)
    for char in TINY_ALPHABET:
        if char in vocab:
            raise ReproError(f"TINY_ALPHABET (repro/data/tinymath.py) repeats the character {char!r}")
        vocab[char] = len(vocab)
    if len(vocab) != TINY_VOCAB_SIZE:
        raise ReproError(f"tokenizer has {len(vocab)} tokens but TINY_CONFIG.vocab_size is {TINY_VOCAB_SIZE}")
    return vocab


def build_tiny_tokenizer():
    """A ``PreTrainedTokenizerFast``-compatible tokenizer (left padding, for batched generation)."""
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=tiny_vocab(), merges=[]))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.decoder = decoders.Fuse()  # characters join with nothing in between
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_TOKEN_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", padding_side="left"
    )


def encode_strict(tokenizer, text: str) -> list[int]:
    """BOS + one id per character; raises if a character is outside the vocabulary (BPE would drop it)."""
    ids = tokenizer(text).input_ids
    if len(ids) != len(text) + 1:
        unknown = sorted({c for c in text if c not in tokenizer.get_vocab()})
        raise ReproError(f"text {text!r} has characters outside the tiny vocabulary: {unknown}")
    return ids
