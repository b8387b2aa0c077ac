"""The checkpoint's reasoner tower, run through Transformers, loaded on first use.

`Reasoner.chat(messages, ...)` decodes with Transformers' own `generate` and streams each new token
to a callback; setting the cancel flag stops it before the next token (the streamer raises
`JobCancelled` from inside `generate`, which Transformers calls once per token).

Memory policy (docs/perf-log/2026-12-02.md, "Reasoner", has the measurements behind it):
- `resident`: the reasoner stays on the GPU beside the generator (when both fit with room for the
  generator's activations);
- `offloaded`: it lives in host memory and moves to the GPU for each reasoner job, back after;
- `on_demand`: it is read from disk for each job and dropped after (host memory too small as well).
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..events import JobCancelled
from .inputs import Preprocessor, VideoClip, build_inputs, load_preprocessor, messages_for

POLICIES = ("resident", "offloaded", "on_demand")
REASONER_MODEL_TYPES = {"cosmos3_edge": "edge", "cosmos3_omni": "omni"}
# Room the generator needs beyond its weights (activations, VAE decode, K/V caches); the long-video
# peaks in docs/perf-log/2026-12-02.md reach ~13 GiB for the VAE alone.
GENERATOR_WORKSPACE_BYTES = 24 * 2**30


class ReasonerUnavailable(ValueError):
    """This checkpoint carries no reasoner tower; the message says what is missing."""


def reasoner_status(root: str | Path) -> tuple[bool, str]:
    """Whether the checkpoint at `root` holds a reasoner, and if not, why (for the UI)."""
    config_path = Path(root) / "config.json"
    if not config_path.is_file():
        return False, ("This checkpoint has no reasoner: its folder has no root config.json (released Cosmos3 "
                       "folders carry the reasoner there, beside model_index.json).")
    try:
        model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, json.JSONDecodeError) as exc:
        return False, f"This checkpoint's reasoner config {str(config_path)!r} is unreadable: {exc}."
    if model_type not in REASONER_MODEL_TYPES:
        return False, (f"This checkpoint's root config.json has model_type {model_type!r}; a reasoner is one of "
                       f"{sorted(REASONER_MODEL_TYPES)}.")
    if not any(Path(root).glob("*.safetensors")):
        return False, "This checkpoint's reasoner config is present but its root holds no .safetensors weights."
    return True, f"{model_type} reasoner"


def choose_policy(device_total: int | None, generator_bytes: int, reasoner_bytes: int, host_free: int) -> str:
    """Where the reasoner lives between jobs. No GPU: nothing to share, keep it loaded."""
    if device_total is None:
        return "resident"
    if generator_bytes + reasoner_bytes + GENERATOR_WORKSPACE_BYTES <= device_total:
        return "resident"
    if reasoner_bytes * 1.2 <= host_free:
        return "offloaded"
    return "on_demand"


class _TokenStream:
    """A Transformers streamer: the first `put` is the prompt, each later one a new token, which goes
    first to `on_token` (a schema constraint starts its next mask) and then out as text."""

    def __init__(self, tokenizer, on_text: Callable[[str, int], None] | None, cancel: threading.Event | None,
                 on_token: Callable[[list[int]], None] | None = None):
        self.tokenizer = tokenizer
        self.on_token = on_token
        self.on_text = on_text
        self.cancel = cancel
        self.ids: list[int] = []
        self.text = ""
        self.first_token_at: float | None = None
        self._prompt_seen = False

    def put(self, value) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise JobCancelled()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        new = [int(v) for v in value.reshape(-1).tolist()]
        if self.on_token is not None:
            self.on_token(new)
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        # A partial multi-byte character decodes as U+FFFD: hold its text back until the rest arrives.
        delta = ""
        if not text.endswith("\ufffd"):
            delta, self.text = text[len(self.text):], text
        if self.on_text is not None:
            self.on_text(delta, len(self.ids))
        if self.cancel is not None and self.cancel.is_set():
            raise JobCancelled()

    def end(self) -> None:
        # Generation is over: what was held back as a partial character is all that will come, so it goes out as
        # the full decode writes it (the streamed text then always equals the result's).
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if len(text) > len(self.text):
            delta, self.text = text[len(self.text):], text
            if self.on_text is not None:
                self.on_text(delta, len(self.ids))


@dataclass
class ChatOutput:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    first_token_s: float | None
    decode_s: float


@dataclass
class Reasoner:
    """One checkpoint's reasoner: model, preprocessor and where it lives."""

    root: Path
    kind: str  # "edge" | "omni"
    device: Any
    dtype: Any
    policy: str
    model: Any = None
    pre: Preprocessor | None = None
    grammar: Any = None  # constrained.GrammarTokenizer, built on the first constrained chat
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _load(self) -> None:
        from transformers import AutoModelForImageTextToText

        if self.pre is None:
            self.pre = load_preprocessor(self.root, self.kind)
        if self.model is None:
            self.model = AutoModelForImageTextToText.from_pretrained(self.root, dtype=self.dtype).eval()
        self.model.to(self.device)

    def _release(self) -> None:
        if self.policy == "offloaded":
            self.model.to("cpu")
        elif self.policy == "on_demand":
            self.model = None
        if self.policy != "resident":
            import gc

            import torch

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def video_config(self) -> dict:
        if self.pre is None:
            self.pre = load_preprocessor(self.root, self.kind)
        return self.pre.video_config

    def decoding(self) -> str:
        """How this reasoner decodes answers that have a schema (`ReasonResult.decoding`)."""
        from .constrained import decoding_name

        return decoding_name()

    def _constraint(self, schema: dict):
        """A fresh logits processor for `schema` (the tokenizer's grammar view is built once)."""
        from .constrained import SchemaConstraint, grammar_tokenizer

        if self.grammar is None:
            eos = self.model.generation_config.eos_token_id
            self.grammar = grammar_tokenizer(self.pre.tokenizer, list(eos) if isinstance(eos, (list, tuple)) else [eos])
        return SchemaConstraint(self.grammar, schema)

    def chat(self, system: str | None, text: str, *, image=None, video: VideoClip | None = None,
             max_new_tokens: int, temperature: float, seed: int,
             on_text: Callable[[str, int], None] | None = None, cancel: threading.Event | None = None,
             schema: dict | None = None) -> ChatOutput:
        """One decoded answer; with `schema`, decoded under it (see `constrained`)."""
        import torch

        with self._lock:
            self._load()
            try:
                inputs = build_inputs(self.pre, messages_for(system, text, image, video), image, video)
                inputs = {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in inputs.items()}
                sampling = {"do_sample": False} if temperature == 0.0 else {"do_sample": True,
                                                                            "temperature": temperature}
                constraint = None if schema is None else self._constraint(schema)
                if constraint is not None:
                    from transformers import LogitsProcessorList

                    sampling["logits_processor"] = LogitsProcessorList([constraint])
                stream = _TokenStream(self.pre.tokenizer, on_text, cancel,
                                      on_token=None if constraint is None else constraint.feed)
                started = time.perf_counter()
                devices = [self.device] if getattr(self.device, "type", str(self.device)) == "cuda" else []
                with torch.inference_mode(), torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    output = self.model.generate(**inputs, max_new_tokens=max_new_tokens, streamer=stream,
                                                 **sampling)
                ended = time.perf_counter()
            finally:
                self._release()
        prompt_len = inputs["input_ids"].shape[1]
        new_ids = output[0, prompt_len:].tolist()
        first = None if stream.first_token_at is None else stream.first_token_at - started
        return ChatOutput(text=self.pre.tokenizer.decode(new_ids, skip_special_tokens=True), token_ids=new_ids,
                          prompt_tokens=prompt_len, first_token_s=first, decode_s=ended - started)


# One reasoner per loaded generator; it goes when the generator goes (the queue's eviction).
_REASONERS: dict[int, Reasoner] = {}
_REASONERS_LOCK = threading.Lock()


def _bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) if module is not None else 0


def _reasoner_bytes(root: Path, kind: str, dtype) -> int:
    """Bytes of what Transformers keeps from the root weights: its own drop list (the generator's tower
    and heads) decides, so the count follows the library."""
    import re

    import torch
    import transformers
    from safetensors import safe_open

    cls = transformers.Cosmos3EdgeForConditionalGeneration if kind == "edge" else \
        transformers.Cosmos3OmniForConditionalGeneration
    dropped = [re.compile(p) for p in (cls._keys_to_ignore_on_load_unexpected or [])]
    total = 0
    for file in root.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if any(p.search(key) for p in dropped):
                    continue
                count = 1
                for dim in handle.get_slice(key).get_shape():
                    count *= int(dim)
                total += count
    return total * torch.empty((), dtype=dtype).element_size()


def _host_free() -> int:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reasoner_for(model, policy: str | None = None) -> Reasoner:
    """The reasoner of a loaded generator (`engine.load_model`), created on first use."""
    import torch

    with _REASONERS_LOCK:
        found = _REASONERS.get(id(model))
        if found is not None and (policy is None or found.policy == policy):
            return found  # its checkpoint was checked when it was made: no config read per job
        ok, why = reasoner_status(model.root)
        if not ok:
            raise ReasonerUnavailable(why)
        root = Path(model.root)
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
        kind = REASONER_MODEL_TYPES[config["model_type"]]
        device = model.device if model.device is not None else torch.device("cpu")
        dtype = model.dtype if model.dtype is not None else torch.float32
        if policy is None:
            total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
            generator = _bytes(model.transformer) + _bytes(model.vae)
            policy = choose_policy(total, generator, _reasoner_bytes(root, kind, dtype), _host_free())
        if policy not in POLICIES:
            raise ValueError(f"Unknown reasoner memory policy {policy!r}; allowed: {list(POLICIES)}.")
        reasoner = Reasoner(root, kind, device, dtype, policy)
        _REASONERS[id(model)] = reasoner
        weakref.finalize(model, _REASONERS.pop, id(model), None)
        return reasoner
