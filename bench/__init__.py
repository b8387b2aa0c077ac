"""GPU benchmarks. Each script is an entry point, like app.py: importing this package applies the engine's
start-up settings once (`engine.config.apply_process_environment`, from the environment), before a script
imports diffusers or torchao, whose import they steer (MSLK's Python-only mode, the compiler caches)."""
from engine.config import apply_process_environment, build_config

apply_process_environment(build_config())
