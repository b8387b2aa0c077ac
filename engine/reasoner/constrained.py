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
    the ASCII rule above) keep their logits. One per `generate` call (it follows that call's tokens).

    Fed (`feed`, which the reasoner's streamer calls with each new token, already on the host), it never
    reads the GPU: the host computes the mask while the GPU runs the forward it has just queued, and the mask
    goes to the GPU packed (32 tokens a word) and is unpacked there. Not fed (Transformers' own `generate`
    with only this processor, as the tests run it), it reads the last token from `input_ids`, which waits
    for the forward to finish before the mask is computed: the same masks, later.

    Measured on the H200 (docs/perf-log/2026-12-04-reasoner-constrained.md): the mask itself is ~0.3 ms;
    reading the token back made it serial with the forward. Computing it on a worker thread instead was
    slower still (Edge 31.6 against 22.5 ms a step): the thread waits for the GIL while the host launches
    kernels."""

    def __init__(self, grammar: GrammarTokenizer, schema: dict):
        import llguidance

        self.grammar = grammar
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        self.matcher = llguidance.LLMatcher(grammar.tokenizer, text)
        if self.matcher.is_error():
            raise ValueError(f"llguidance refused the decoding schema: {self.matcher.get_error()}")
        self.prompt_len: int | None = None
        self.fed = False  # whether a streamer feeds the tokens (then `input_ids` is never read)
        self._token: int | None = None  # the token fed since the last step
        self._unpack = None  # per device: the shifts that unpack a word into its 32 bits
        self.words = np.empty_like(grammar.ascii_words)  # this step's mask, packed

    def feed(self, token_ids) -> None:
        """The tokens just decoded (the streamer's `put`, after the prompt)."""
        if self.prompt_len is None:
            return  # the prompt: the first mask depends on no token
        *earlier, last = [int(t) for t in token_ids]
        if earlier:
            raise ValueError(f"one token a step is decoded under a schema; the streamer sent {len(earlier) + 1}")
        self.fed, self._token = True, last

    def _next_token(self, input_ids) -> int:
        if not self.fed:
            return int(input_ids[0, -1])
        if self._token is None:
            raise RuntimeError("the streamer fed no token since the last step")
        token, self._token = self._token, None
        return token

    def __call__(self, input_ids, scores):
        import torch

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif not self.matcher.consume_token(self._next_token(input_ids)):
            raise RuntimeError(f"the decoded token broke the schema: {self.matcher.get_error()}")
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        np.bitwise_and(self.words, self.grammar.ascii_words, out=self.words)
        allowed = self._on_device(self.words, scores.device)
        if allowed.numel() < scores.shape[-1]:  # the model's head may be wider than the tokenizer
            allowed = torch.nn.functional.pad(allowed, (0, scores.shape[-1] - allowed.numel()))
        return scores.masked_fill(~allowed[: scores.shape[-1]], float("-inf"))

    def _on_device(self, words: np.ndarray, device):
        """The packed words copied to `device` without waiting for it, unpacked there to one bool a token."""
        import torch

        host = torch.from_numpy(words)
        if device.type == "cuda":
            host = host.pin_memory()  # a pinned copy may go while the GPU is busy; a pageable one would wait
        packed = host.to(device, non_blocking=True)
        if self._unpack is None or self._unpack.device != packed.device:
            self._unpack = torch.arange(32, dtype=torch.int32, device=packed.device)
        bits = (packed[:, None] >> self._unpack) & 1  # bit t of the vocabulary: word t // 32, bit t % 32
        return bits.reshape(-1)[: self.grammar.vocab_size].bool()

