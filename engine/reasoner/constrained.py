"""Decoding under a JSON Schema: a Transformers logits processor over llguidance (Microsoft's Guidance
team), so that Enhance and Describe write a valid caption, and Critique valid scores, on the first
attempt and on any weights.

Why llguidance (docs/perf-log/2026-12-04-reasoner-constrained.md has the numbers): on a 151k-token
byte-level vocabulary it compiles the caption schema in milliseconds and masks a token in ~0.3 ms on
the CPU; xgrammar took 34-61 s to compile the same schema (and drops `maxLength` where a `pattern` is
given), and outlines-core 23 minutes to build its index. llguidance's wheel needs no other
package.

Every answer is plain printable ASCII without backslashes: the processor allows only tokens whose
bytes are all such characters (or an end-of-text token). The schema (engine.reasoner.schema) bounds
every text in characters, and with one byte per character and at least one byte per token, its
longest answer in bytes bounds the answer in tokens. Filtering tokens here rather than writing a
character class into each string's `pattern` is the same language, at an eighth of llguidance's
per-token cost (a pattern defeats its precomputed JSON-string token sets).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

LIBRARY = "llguidance"
# llguidance's JSON compile options: no whitespace between tokens (so the longest answer is known),
# no escapes (a backslash is not printable-ASCII text here anyway).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":", "json_allowed_escapes": ""}


def library_available() -> bool:
    """Whether llguidance is installed (it is in requirements.txt; an install without it repairs answers)."""
    return importlib.util.find_spec(LIBRARY) is not None


def decoding_name() -> str:
    """What `ReasonResult.decoding` says for a reasoner on this install."""
    return f"constrained:{LIBRARY}" if library_available() else "repair"


def _allowed_byte(value: int) -> bool:
    return 0x20 <= value <= 0x7E and value != 0x5C


@dataclass
class GrammarTokenizer:
    """llguidance's view of one reasoner's tokenizer, built once per reasoner (about a second for a
    150k vocabulary), and the tokens an answer may use."""

    tokenizer: Any  # llguidance.LLTokenizer
    ascii_words: np.ndarray  # int32 bitmask: bit t set when token t is printable ASCII, no backslash, or EOS
    vocab_size: int


def grammar_tokenizer(hf_tokenizer, eos_ids: list[int]) -> GrammarTokenizer:
    import llguidance.hf

    vocab = len(hf_tokenizer)
    tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab, eos_token=eos_ids[0])
    bits = np.zeros(((vocab + 31) // 32) * 32, dtype=bool)
    for token in range(vocab):
        if tokenizer.is_special_token(token):
            continue
        raw = tokenizer.decode_bytes([token])
        # An empty token would break "at least one byte per token", so it is never allowed.
        bits[token] = bool(raw) and all(_allowed_byte(b) for b in raw)
    bits[[e for e in eos_ids if e < vocab]] = True
    return GrammarTokenizer(tokenizer, np.packbits(bits, bitorder="little").view(np.int32).copy(), vocab)


class SchemaConstraint:
    """A Transformers logits processor: each step, only tokens the schema's grammar allows next (and
    the ASCII rule above) keep their logits. One per `generate` call (it follows that call's tokens)."""

    def __init__(self, grammar: GrammarTokenizer, schema: dict):
        import llguidance

        self.grammar = grammar
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        self.matcher = llguidance.LLMatcher(grammar.tokenizer, text)
        if self.matcher.is_error():
            raise ValueError(f"llguidance refused the decoding schema: {self.matcher.get_error()}")
        self.words = np.zeros_like(grammar.ascii_words)
        self.prompt_len: int | None = None
        self.allowed = None  # the last step's mask, kept for tests

    def __call__(self, input_ids, scores):
        import torch

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif not self.matcher.consume_token(int(input_ids[0, -1])):
            raise RuntimeError(f"the decoded token broke the schema: {self.matcher.get_error()}")
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        np.bitwise_and(self.words, self.grammar.ascii_words, out=self.words)
        bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")[: self.grammar.vocab_size]
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
        allowed[: bits.size] = torch.from_numpy(bits.astype(bool))
        self.allowed = allowed
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))
