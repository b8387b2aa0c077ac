"""The pipeline floor: one request, run on one loaded model.

Validation (`request`), captions and prompt text (`captions`, `prompts`), user media (`media`), the
transformer's two towers and attention (`transformer`, `attention`), the switchable fast path
(`fast_path`), the denoising loop (`run`) and saving (`outputs`). Imports the model floor, never
serving (except its event types). This `__init__` imports nothing, so the light modules (request,
captions, prompts) load without torch.
"""
