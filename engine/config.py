"""The one configuration of a Cosmos3 Studio process: every environment variable it reads, parsed once.

    config = build_config()                 # os.environ; or build_config({"COSMOS3_FAST": "0"})
    apply_process_environment(config)       # once at start-up, before torchao or flash-attn-4 is imported
    python3 docs/render_configuration.py    # docs/CONFIGURATION.md, from `render_markdown` (`--check`)

`build_config` is the only reader of the environment; it runs at the entry points (`app.py` after its flags,
`python -m engine`, `engine.load_model` and `JobQueue` when their caller passes none) and the result is passed
down: a loaded model carries it (`LoadedModel.config`), `FastPathOptions.from_config` derives the fast path's
switches from it, the kernels get their part as `cosmos3_kernels.settings.KernelSettings`. A value that cannot
be read raises `ConfigError` naming the variable, what it holds and what is allowed.

Each field's metadata (`setting`) is the single source of the variable's name, its meaning and its default as
written in docs/CONFIGURATION.md. This module imports nothing of the engine's floors at import time, so the UI
process can build it without torch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")
KERNEL_MODES = ("auto", "triton", "torch")  # cosmos3_kernels.dispatch.MODES
DISPATCH_TIMINGS = ("graph", "eager")  # cosmos3_kernels.dispatch.TIMINGS
FA3_PACK_GQA_SPELLINGS = ("", "1", "0", "auto")
WARMABLE_MODES = ("t2i", "t2v")  # each needs only a prompt and a size (i2v, v2v and action need inputs)
WARMUP_OFF_VALUES = ("off", "none", "0", "")
STUDIO_CACHE_DEFAULT = "~/.cache/cosmos3-studio"
HF_HOME_DEFAULT = "~/.cache/huggingface"
KERNEL_CACHE_OFF_VALUES = ("off", "none", "0")


class ConfigError(ValueError):
    """An environment variable holds a value it cannot: the message names it, its value and what is allowed."""


Parser = Callable[[str, str], Any]  # (variable, text) -> value


def setting(env: str, default: Any, meaning: str, parse: Parser | None = None, *, shown: str | None = None,
            secret: bool = False):
    """A field read from `env` (`parse(env, text)` where set; `default` where not), with the one-line `meaning`
    docs/CONFIGURATION.md gives it; `shown`: the default as the doc writes it (where `default` alone does not say
    it); `secret`: kept out of the repr (a log line or a traceback never shows it). A variable set but empty is
    parsed too: for most it means the default, for COSMOS3_WARMUP it means off."""
    metadata = {"env": env, "meaning": meaning, "parse": parse or raw_value, "shown": shown, "secret": secret}
    return field(default=default, repr=not secret, metadata=metadata)


def text_value(env: str, text: str) -> str:
    return text.strip()


def raw_value(env: str, text: str) -> str:
    """As given (the default): a path, a password or a key keeps every character, as the code read it before."""
    return text


def switch(env: str, text: str, default: bool) -> bool:
    word = text.strip().lower()
    if word == "":
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(f"{env}={text!r}: allowed one of {', '.join(TRUE_WORDS)} (on) or "
                      f"{', '.join(FALSE_WORDS)} (off), or unset ({'on' if default else 'off'})")


def switch_on(env: str, text: str) -> bool:
    return switch(env, text, True)


def switch_off(env: str, text: str) -> bool:
    return switch(env, text, False)


def one_of(*allowed: str, default: str) -> Parser:
    def parse(env: str, text: str) -> str:
        word = text.strip().lower()
        if word == "":
            return default
        if word not in allowed:
            raise ConfigError(f"{env}={text!r}: allowed one of {', '.join(repr(a) for a in allowed)}, "
                              f"or unset ({default!r})")
        return word
    return parse


def fp8_policy(env: str, text: str) -> str:
    """A spelling `engine.pipeline.fp8.FP8Policy.parse` accepts, or "" (each family's measured default)."""
    spelling = text.strip()
    if spelling:
        from engine.pipeline.fp8 import FP8Policy  # torch; only where the variable is set

        try:
            FP8Policy.parse(spelling)
        except ValueError as error:
            raise ConfigError(f"{env}={text!r}: {error}; or unset (each family's measured default)") from None
    return spelling


def fp8_attention_backend(env: str, text: str) -> str:
    name = text.strip().lower()
    if name:
        from engine.pipeline.fp8 import FP8_ATTENTION_BACKENDS

        if name not in FP8_ATTENTION_BACKENDS:
            raise ConfigError(f"{env}={text!r}: allowed one of {list(FP8_ATTENTION_BACKENDS)}, or unset "
                              "(the fastest this host can run)")
    return name


def fa3_pack_gqa(env: str, text: str) -> str:
    word = text.strip().lower()
    if word not in FA3_PACK_GQA_SPELLINGS:
        raise ConfigError(f"{env}={text!r}: allowed '1', '0', 'auto' (FA3's own heuristic), or unset "
                          "(the measured default, cosmos3_kernels.attention_fp8_fa3.PACK_GQA)")
    return word


def warmup_modes(env: str, text: str) -> tuple[str, ...]:
    """() when off ("off", "none", "0" or empty), else the modes named, in order, each once."""
    if text.strip().lower() in WARMUP_OFF_VALUES:
        return ()
    modes = []
    for item in text.split(","):
        mode = item.strip().lower()
        if mode and mode not in WARMABLE_MODES:
            raise ConfigError(
                f"{env}={text!r} names the mode {item.strip()!r}, which cannot be warmed up; allowed: a comma-"
                f"separated list of {', '.join(WARMABLE_MODES)}, or one of "
                f"{', '.join(repr(v) for v in WARMUP_OFF_VALUES)} to turn warm-up off, or unset for each family's "
                "default.")
        if mode and mode not in modes:
            modes.append(mode)
    return tuple(modes)


def exactly_one(env: str, text: str) -> bool:
    """Triton's own reading of TRITON_INTERPRET: the interpreter runs where it is "1"."""
    return text == "1"


def port(env: str, text: str) -> int | None:
    if not text.strip():
        return None
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(f"{env} must be a number, got {text!r}") from None
    return number


@dataclass(frozen=True)
class FastPathConfig:
    """The gen tower's fast-path passes (engine.pipeline.fast_path); each on unless turned off."""

    fast: bool = setting("COSMOS3_FAST", True, "the whole fast path on a CUDA GPU; 0 runs the exact eager tower",
                         switch_on)
    batched_cfg: bool = setting("COSMOS3_BATCHED_CFG", True, "both CFG branches through every GEMM as one batch",
                                switch_on)
    cuda_graphs: bool = setting("COSMOS3_CUDA_GRAPHS", True, "capture the tower's step as a CUDA graph (CUDA only)",
                                switch_on)
    fused_projections: bool = setting("COSMOS3_FUSED_PROJECTIONS", True,
                                      "one GEMM for q|k|v and one for gate|up per layer", switch_on)
    video_qk_fp32: bool = setting("COSMOS3_VIDEO_QK_FP32", True,
                                  "a video's fused QK-norm + RoPE in fp32, rounded once", switch_on)
    vae_channels_last: bool = setting("COSMOS3_VAE_CHANNELS_LAST", True,
                                      "the VAE decoder's 3-D convolutions in channels-last-3d", switch_on)
    whole_step: bool = setting("COSMOS3_WHOLE_STEP", True,
                               "tokens, tower, CFG and sampler update from static buffers, one graph", switch_on)
    uint8_frames: bool = setting("COSMOS3_UINT8_FRAMES", True,
                                 "the decode's postprocess and 8-bit rounding on the GPU (0 also turns off the "
                                 "fast decode)", switch_on)
    vae_fast_decode: bool = setting("COSMOS3_VAE_FAST_DECODE", True,
                                    "a video's decoder walked by the engine with norm + SiLU fused", switch_on)
    vae_subpixel: bool = setting("COSMOS3_VAE_SUBPIXEL", True,
                                 "the fast decode's upsamplers as sub-pixel phase convolutions", switch_on)
    vae_norm_fp32: bool = setting("COSMOS3_VAE_NORM_FP32", True, "the fast decode's norm + SiLU in fp32, rounded once",
                                  switch_on)
    lengths_on_device: bool = setting("COSMOS3_LENGTHS_ON_DEVICE", True,
                                      "whole-step graphs kept for any prompt length that fits", switch_on)
    share_first_attention: bool = setting("COSMOS3_SHARE_FIRST_ATTENTION", True,
                                          "the first layer's gen-to-gen attention once for all branches", switch_on)
    mlp_epilogue: bool = setting("COSMOS3_MLP_EPILOGUE", True, "a video's MLP activation in its input GEMM's epilogue",
                                 switch_on)
    residual_epilogue: bool = setting("COSMOS3_RESIDUAL_EPILOGUE", True,
                                      "a video's residual add in its output GEMMs' epilogue", switch_on)


@dataclass(frozen=True)
class FP8Config:
    """The FP8 mode (engine.pipeline.fp8): approximate, so off unless asked for."""

    enabled: bool = setting("COSMOS3_FP8", False, "FP8 GEMMs (and FP8 attention where the policy names attn); "
                            "a model whose bf16 weights do not fit one GPU is built FP8-only", switch_off)
    policy: str = setting("COSMOS3_FP8_POLICY", "", "which GEMMs run in FP8 and how, e.g. row:in+attn",
                          fp8_policy, shown="each family's measured default")
    attention: str = setting("COSMOS3_FP8_ATTENTION", "", "the FP8 attention kernel: fa3 or cudnn",
                             fp8_attention_backend, shown="the fastest this host can run")
    fa3_pack_gqa: str = setting("COSMOS3_FA3_PACK_GQA", "", "FA3's packing of query heads per K/V head: 1, 0 or "
                                "auto (for benchmarks)", fa3_pack_gqa, shown="the measured default")


@dataclass(frozen=True)
class KernelConfig:
    """The kernels and how dispatch picks them (cosmos3_kernels)."""

    mode: str = setting("COSMOS3_KERNELS", "auto", "auto (measured per shape), triton or torch (forced)",
                        one_of(*KERNEL_MODES, default="auto"))
    dispatch_timing: str = setting("COSMOS3_DISPATCH_TIMING", "graph", "how dispatch times candidates: graph or eager",
                                   one_of(*DISPATCH_TIMINGS, default="graph"))
    quack: bool = setting("COSMOS3_QUACK", True, "QuACK's GEMMs among dispatch's candidates", switch_on)
    flash4: bool = setting("COSMOS3_FLASH4", True, "flash-attn-4 among dispatch's candidates", switch_on)
    cache: str = setting("COSMOS3_KERNEL_CACHE", "", "folder for compiled kernels and dispatch decisions; off keeps "
                         "nothing", parse=text_value,
                         shown="kernels/ under COSMOS3_STUDIO_CACHE, or under HF_HOME on a Space")


@dataclass(frozen=True)
class WarmupConfig:
    """Warm-up at model load (engine.serving.warmup)."""

    modes: tuple[str, ...] | None = setting(
        "COSMOS3_WARMUP", None, "modes to warm in the background on a GPU, e.g. t2i,t2v, or off", warmup_modes,
        shown="each family's default")


@dataclass(frozen=True)
class ServingConfig:
    """What app.py serves; each has a command-line flag, which wins over its variable."""

    models: str = setting("COSMOS3_MODELS", "", "models to serve, name=source,... (--model)",
                          parse=text_value, shown="six tiny random-weight models")
    model_roots: str = setting("COSMOS3_MODEL_ROOTS", "", "folders models may load from, separated by ':' "
                               "(--model-root)", parse=text_value, shown="any folder")
    outputs: str = setting("COSMOS3_OUTPUTS", "", "the outputs folder (--outputs)", shown="outputs")
    max_upload: str = setting("COSMOS3_MAX_UPLOAD", "", "the largest upload, e.g. 200mb (--max-upload)",
                              parse=text_value, shown="200mb")
    gpus: str = setting("COSMOS3_GPUS", "", "GPUs each model runs on, a count or auto (--gpus)", parse=text_value,
                        shown="1")
    review: bool = setting("COSMOS3_REVIEW", False, "review mode, login required (--review)", switch_off)
    review_db: str = setting("COSMOS3_REVIEW_DB", "", "the review database (--review-db)",
                             shown="CACHE_DIR/reviews.sqlite3")
    criteria: str = setting("COSMOS3_CRITERIA", "", "review criteria, comma-separated (--criteria)",
                            shown="the built-in criteria")
    safety: bool = setting("COSMOS3_SAFETY", False, "the Cosmos guardrail on every prompt and result (--safety)",
                           switch_off)


@dataclass(frozen=True)
class AuthConfig:
    """Logins and keys; never shown in a repr."""

    auth: str = setting("COSMOS3_AUTH", "", "logins user:pass,... (--auth)", raw_value, shown="none", secret=True)
    auth_file: str = setting("COSMOS3_AUTH_FILE", "", "a file of user:pass lines (--auth-file)", shown="none")
    api_keys: str = setting("COSMOS3_API_KEYS", "", "keys for the /v1 HTTP API, comma-separated (--api-keys FILE "
                            "wins)", parse=text_value, shown="none: /v1 is open", secret=True)
    remote_key: str = setting("COSMOS3_REMOTE_KEY", "", "the key of the server --remote fronts", raw_value,
                              shown="none", secret=True)


@dataclass(frozen=True)
class PathsConfig:
    """Where the studio keeps what outlives a process."""

    studio_cache: str = setting("COSMOS3_STUDIO_CACHE", "", "the studio's cache folder (--cache-dir wins)",
                                shown=STUDIO_CACHE_DEFAULT)

    def studio_cache_dir(self) -> Path:
        return Path(self.studio_cache or STUDIO_CACHE_DEFAULT).expanduser()


@dataclass(frozen=True)
class HostConfig:
    """What the host says about itself (set by Hugging Face Spaces, Gradio or Triton, not by the studio)."""

    system: str = setting("SYSTEM", "", "spaces on a Hugging Face Space: app.py listens on 0.0.0.0", shown="unset")
    space_id: str = setting("SPACE_ID", "", "set on a Space: the kernel cache goes under HF_HOME", shown="unset")
    hf_home: str = setting("HF_HOME", "", "the Hugging Face cache (a Space's persistent storage)",
                           shown=HF_HOME_DEFAULT)
    server_name: str = setting("GRADIO_SERVER_NAME", "", "the address app.py listens on (--host wins)",
                               shown="127.0.0.1, 0.0.0.0 on a Space")
    server_port: int | None = setting("GRADIO_SERVER_PORT", None, "the port app.py listens on (--port wins)", port,
                                      shown="7860")
    temp_dir: str = setting("GRADIO_TEMP_DIR", "", "Gradio's temporary folder, which no API answer may name",
                            shown="the system's")
    triton_interpret: bool = setting("TRITON_INTERPRET", False, "Triton's interpreter (1): kernels on a CPU, for "
                                     "tests", exactly_one)
    zero_gpu: str = setting("SPACES_ZERO_GPU", "", "true on a ZeroGPU Space (app.py wraps jobs for it)",
                            shown="unset")


@dataclass(frozen=True)
class Config:
    fast_path: FastPathConfig = field(default_factory=FastPathConfig)
    fp8: FP8Config = field(default_factory=FP8Config)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    host: HostConfig = field(default_factory=HostConfig)

    def kernel_cache_dir(self) -> Path | None:
        """The folder for compiled kernels and dispatch decisions: COSMOS3_KERNEL_CACHE where set ("off" keeps
        nothing), else kernels/ under the studio's cache folder, or on a Space (SPACE_ID) under HF_HOME, the
        folder a Space's persistent storage holds."""
        named = self.kernels.cache
        if named.lower() in KERNEL_CACHE_OFF_VALUES:
            return None
        if named:
            return Path(named).expanduser()
        if self.host.space_id:
            return Path(self.host.hf_home or HF_HOME_DEFAULT).expanduser() / "cosmos3-studio" / "kernels"
        return self.paths.studio_cache_dir() / "kernels"

    def kernel_settings(self):
        """The kernels' part, as the kernel package takes it (it never imports the engine)."""
        from cosmos3_kernels.settings import KernelSettings

        return KernelSettings(quack=self.kernels.quack, flash4=self.kernels.flash4,
                              interpret=self.host.triton_interpret)


SECTIONS = [(f.name, f.default_factory) for f in fields(Config)]
TITLES = {"fast_path": "Fast path", "fp8": "FP8", "kernels": "Kernels", "warmup": "Warm-up", "serving": "Serving",
          "auth": "Logins and keys", "paths": "Paths", "host": "Host"}


def _section(cls, environ: Mapping[str, str]):
    values = {}
    for item in fields(cls):
        env = item.metadata["env"]
        if env in environ:
            values[item.name] = item.metadata["parse"](env, environ[env])
    return cls(**values)


def build_config(environ: Mapping[str, str] | None = None) -> Config:
    """The configuration `environ` (default: this process's environment) asks for; `ConfigError` for a value
    that cannot be read. The one place a variable is read."""
    environ = os.environ if environ is None else environ
    return Config(**{name: _section(cls, environ) for name, cls in SECTIONS})


def config_of(model) -> Config:
    """The configuration `model` was loaded under (`LoadedModel.config`); a model built by hand without one (a
    benchmark's, a test's) runs under the environment's."""
    config = getattr(model, "config", None)
    return config if isinstance(config, Config) else build_config()


def variables() -> list[tuple[str, str, Any]]:
    """(section, variable, the field) for every variable, in the order of the doc."""
    return [(name, item.metadata["env"], item) for name, cls in SECTIONS for item in fields(cls)]


# Written where the library they steer is first imported by the engine, so they must be set before that:
# - MSLK_PYTHON_ONLY: MSLK (optional, the FP8 mode's activation quantiser) is used for its Triton kernel only. Its
#   native library, which `import mslk` loads and torchao imports whenever MSLK is installed, is built for one torch
#   release; where it does not match (torch 2.11 on the H200 host with mslk-cuda 1.1.0) that import fails and takes
#   torchao's float8 with it. Python-only mode skips it (set before anything imports torchao).
# - FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED: flash-attn-4's on-disk kernel cache, read when the library is imported,
#   so a restarted server loads a compiled config in ~0.01 s instead of compiling it again in ~2 s
#   (bench/bench_flash4_cache.py). An explicit setting, 0 included, is kept.
MSLK_PYTHON_ONLY = "MSLK_PYTHON_ONLY"
FLASH4_CACHE_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def apply_process_environment(config: Config, environ: MutableMapping[str, str] | None = None) -> dict:
    """What a process sets once at start-up, before the libraries it steers are imported (app.py, `python -m
    engine` and `engine.load_model` call it): the variables above (a value already set is kept), the compilers'
    disk caches pointed into `config.kernel_cache_dir()`, and the kernel package's settings. Returns what it set
    in `environ` (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    done = {}
    for variable, wanted in ((MSLK_PYTHON_ONLY, True), (FLASH4_CACHE_ENABLED, config.kernels.flash4)):
        if wanted and variable not in environ:
            environ[variable] = done[variable] = "1"
    from cosmos3_kernels import settings
    from cosmos3_kernels.persist import configure_compiler_caches

    done.update(configure_compiler_caches(config.kernel_cache_dir(), environ))
    settings.use(config.kernel_settings())
    return done


def configured(config: Config | None = None) -> Config:
    """`config`, or where None the environment's (`build_config`), with `apply_process_environment` done (it is
    idempotent): what an entry point that may be called first (`engine.load_model`) starts with."""
    config = build_config() if config is None else config
    apply_process_environment(config)
    return config


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """docs/CONFIGURATION.md: every variable, its default and meaning, by section (from the fields' metadata)."""
    lines = ["# Configuration", "",
             "<!-- rendered by docs/render_configuration.py from engine/config.py; edit the fields there -->",
             "",
             "Every environment variable Cosmos3 Studio reads, read once at start-up by `engine.config.build_config` "
             "(app.py, `python -m engine`, `engine.load_model`). A command-line flag, where one exists, wins over its "
             "variable. Switches take 1, true, on or yes and 0, false, off or no; any other value stops the start "
             "with an error naming the variable, its value and what is allowed.", ""]
    for name, cls in SECTIONS:
        lines += [f"## {TITLES[name]}", "", (cls.__doc__ or "").strip(), "",
                  "| Variable | Default | Meaning |", "|---|---|---|"]
        for item in fields(cls):
            meta = item.metadata
            default = meta["shown"] if meta["shown"] is not None else item.default
            if isinstance(default, bool):
                default = "on" if default else "off"
            lines.append(f"| `{meta['env']}` | {_cell(str(default))} | {_cell(meta['meaning'])} |")
        lines.append("")
    return "\n".join(lines)
