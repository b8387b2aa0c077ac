"""What the stages of one request pass along: the run state, and the values each stage makes.

`generate` (engine.pipeline.run) makes one `RunState` per request and hands it to each stage in turn;
a stage reads the fields it needs and sets the ones it makes, so no stage takes a long argument list
and the order of `generate` is the order of the work:

    conditioning -> prompt -> noise -> layout -> schedule -> memory -> prefill -> tower -> denoise -> decode

Everything that is fixed for the whole request is decided once here and read by the loop: the fast-path
switches (`options`, from the configuration once per request, not every step), which rows are noisy and
whether any are (`GenLayout`, so the loop never asks the device), the padded clean latents.

Every field is declared here with its type; a stage sets only these (each stage's docstring says which it
reads and writes). What the run did goes to `trace` (`engine.pipeline.trace.RunTrace`), the result's public
record. The gen tower's interface (`GenTower`) and a GPU group's hooks (`TowerGroup`) are declared here too,
so the stages and the parallel floor share them without importing each other.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch
from diffusers import SchedulerMixin

from ..model.loader import LoadedModel
from .fast_path import FastPathOptions
from .preview import Previewer
from .prompts import PromptTexts
from .request import Request
from .trace import RunTrace
from .transformer import GenRotary, KVCache


@dataclass
class Conditioning:
    """Clean latents for the conditioned frames, and what is fixed by them."""

    vision_shape: tuple[int, ...]  # [1, 48, T, h, w]
    clean: torch.Tensor | None  # [1, 48, T_c, h, w] clean latents of the first T_c latent frames
    condition_frames: list[int]
    width: int
    height: int
    action_latents: torch.Tensor | None = None  # forward dynamics: padded [chunk, width]
    action_condition_frames: list[int] = field(default_factory=list)
    raw_action_dim: int | None = None
    domain_id: int | None = None


@dataclass
class Latents:
    vision: torch.Tensor  # float32 [1, 48, T, h, w]
    vision_mask: torch.Tensor  # [T, 1, 1], 1 on conditioned frames
    sound: torch.Tensor | None = None  # [sound_dim, T_s]
    sound_mask: torch.Tensor | None = None
    action: torch.Tensor | None = None  # [chunk, action_dim]
    action_mask: torch.Tensor | None = None
    clean: torch.Tensor | None = None  # the conditioning's clean latents padded to the vision shape


@dataclass
class GenLayout:
    """Where each modality sits in the gen part of one branch's sequence (gen-local indexes), and which
    rows are noisy: decided here once, from the request, so the loop never reads a mask back."""

    vision_shape: tuple[int, int, int]  # patch grid (T, h/2, w/2)
    num_vision: int
    noisy_frames: torch.Tensor
    vision_noisy_local: torch.Tensor
    vision_keep: torch.Tensor | None = None  # [T, 1, 1] float32, 1 on noisy latent frames
    any_noisy_vision: bool = True
    sound_len: int = 0
    sound_noisy: torch.Tensor | None = None  # every sound row (sound is never conditioned)
    sound_keep: torch.Tensor | None = None  # [1, T_s]
    action_len: int = 0
    action_noisy: torch.Tensor | None = None
    action_keep: torch.Tensor | None = None  # [chunk, 1]
    any_noisy_action: bool = False
    action_domain: int | None = None  # the action head's domain id (engine.model.action)
    raw_action_dim: int | None = None  # columns past it are padding, kept at zero

    @property
    def gen_len(self) -> int:
        return self.num_vision + self.sound_len + self.action_len


@dataclass
class Branch:
    """One CFG branch: its text, its positions, and (after prefill) its gen rotary tables."""

    index: int  # row block in the KV cache: 0 = cond, 1 = uncond
    token_ids: list[int]
    position_ids: torch.Tensor
    rotary: GenRotary | None = None


@dataclass
class Schedulers:
    """The request's samplers: diffusers scheduler objects (the checkpoint's class, `LoadedModel.make_scheduler`)."""

    vision: SchedulerMixin
    sound: SchedulerMixin | None = None
    action: SchedulerMixin | None = None
    distilled: bool = False


@runtime_checkable
class GenTower(Protocol):
    """What the denoising loop calls once a step: the eager tower, the fast one, a GPU group's
    (`engine.pipeline.tower`). `kind`, `passes` and `ops` (how often each optional op ran) are for the run's trace."""

    kind: str
    passes: tuple[str, ...]
    ops: Counter

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        """`tokens` [gen_len, hidden], the same for every branch; the first `count` branches' outputs."""
        ...


class TowerGroup(Protocol):
    """What a GPU group puts on `LoadedModel.parallel` for the pipeline (`engine.parallel.group.GroupContext`): its
    prefill of every branch (an object only its tower reads), and its gen tower over that prefill."""

    is_leader: bool

    def prefill(self, model: LoadedModel, branches: list[Branch], gen_len: int) -> object:
        ...

    def gen_tower(self, model: LoadedModel, prefix: object, options: FastPathOptions, *, round_qk_norm: bool,
                  fuse_mlp_activation: bool, fuse_residual_add: bool) -> GenTower:
        ...


@dataclass
class RunState:
    """One request on one loaded model, as the stages fill it in (see the module docstring)."""

    model: LoadedModel
    request: Request
    seed: int
    generator: torch.Generator
    options: FastPathOptions  # resolved once per request
    cancel: threading.Event | None = None
    report: Callable[[int, int], None] = lambda step, total: None  # denoising progress
    preview: Previewer | None = None  # when previews are asked for
    cond: Conditioning | None = None
    texts: PromptTexts | None = None
    token_ids: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # cond, uncond
    latents: Latents | None = None
    layout: GenLayout | None = None
    schedulers: Schedulers | None = None
    plan: list[bool] = field(default_factory=list)  # per step: does it run the unconditional branch?
    branches: list[Branch] = field(default_factory=list)
    cache: KVCache | object | None = None  # a KVCache, or a GPU group's prefill (`TowerGroup.prefill`)
    tower: GenTower | None = None
    text_tower_leaves: bool = False  # the text tower's GPU copy is dropped after the prefill (engine.pipeline.memory)
    frames: np.ndarray | None = None
    audio: np.ndarray | None = None
    actions: np.ndarray | None = None
    trace: RunTrace = field(default_factory=RunTrace)

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()
