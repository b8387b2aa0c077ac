"""Multi-GPU inference on torch.distributed: one process per GPU, CFG-parallel and Ulysses sequence
parallel, replicated or FSDP2-sharded weights.

- `plan`: how a request is laid out over N ranks (pure arithmetic, no torch);
- `ulysses`: the all-to-alls around attention;
- `group`: one rank's context and the stage hooks (prefill, gen tower) that spread a request;
- `runtime`: the app-side group (`GroupModel`): starts and supervises the worker processes, hands
  them requests, relays progress, cancel and results, and restarts a group whose worker died.
"""
