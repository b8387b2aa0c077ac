"""The model floor: what a checkpoint is and what it allows.

Inspection of a checkpoint's own config files (`variants`), the one table of defaults and limits
(`defaults`), the action-domain tables (`action`), loading (`loader`) and the tiny random-weight
checkpoints (`tiny`). Imports nothing from `engine.pipeline` or `engine.serving`; only `loader` and
`tiny` need torch, and only when called.
"""
