"""The pipeline floor: one request, run on one loaded model.

Validation (`request`), captions (`captions`), user media (`media`), the transformer's two towers and
attention (`transformer`, `attention`), the switchable fast path (`fast_path`, `whole_step`, `fp8`),
and `generate` (`run`), which runs the stages over one run state (`state`), each stage in the module
of its name: conditioning and noise (`conditioning`), prompt (`prompts`), layout, schedule and the
loop (`denoise`), prefill, decode, outputs. Imports the model floor, never serving (except its event
types). This `__init__` imports nothing, so the light modules (request, captions, prompts) load
without torch.
"""
