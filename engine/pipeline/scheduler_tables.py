"""The schedulers' per-step arithmetic as tables of device tensors, so a step's update needs no host.

diffusers' `UniPCMultistepScheduler.step` (and the distilled `FlowMatchEulerDiscreteScheduler` with
`stochastic_sampling`) compute each step's scalars (sigma ratios, `expm1` of log-SNR gaps, the UniC
weights from a small linear solve) when the step runs, branch on the step's solver order in Python,
and keep their history in Python lists. That cannot sit inside a CUDA graph, and it is host work
between two tower replays.

Here the scalars are computed once per request, **with the same operations on the same device** as
the reference computes them (so each one is bit for bit the reference's value), and stored as rows of
one table. `SamplerState.step` then applies them with the reference's elementwise operations in the
reference's order; a step whose solver order is lower selects the reference's lower-order result with
`torch.where` (exact, no arithmetic blend). The update is therefore bit for bit the reference's
(tests/unit/pipeline/test_scheduler_tables.py checks every step of whole schedules on the CPU; the GPU test checks
the same on the H200), and it launches the same kernels at every step, so one capture serves all
steps. The distilled sampler draws its per-step noise from the request's CPU generator: the draws
are made before the loop, in the reference's order, so the generator yields the same numbers.

Supported: UniPC with `solver_order <= 2`, `bh2`, x0-prediction of flow velocity (what Cosmos3
checkpoints ship), and FlowMatchEuler with stochastic sampling. Anything else returns None from
`sampler_for`, and the engine keeps calling the diffusers scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.utils.torch_utils import randn_tensor

from ..model.runtime import TableCache

# Columns of a UniPC table row (one row per step, float32 on the sample's device).
_UNIPC_COLUMNS = (
    "sigma",                       # x0 = sample - sigma * v
    "use_c", "c2",                 # corrector on; corrector of order 2
    "c_x", "c_m", "c_rk", "c_rho", "c_rho_t", "c_k",
    "p2",                          # predictor of order 2
    "p_x", "p_m", "p_rk", "p_rho", "p_k",
)
UNIPC = {name: index for index, name in enumerate(_UNIPC_COLUMNS)}
_DISTILLED_COLUMNS = ("sigma", "keep", "next_sigma")
DISTILLED = {name: index for index, name in enumerate(_DISTILLED_COLUMNS)}


def _alpha_sigma(scheduler, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if scheduler.config.use_flow_sigmas:
        return 1 - sigma, sigma
    alpha = 1 / ((sigma**2 + 1) ** 0.5)
    return alpha, sigma * alpha


def _lambda(scheduler, sigma: torch.Tensor) -> torch.Tensor:
    alpha, sig = _alpha_sigma(scheduler, sigma)
    return torch.log(alpha) - torch.log(sig)


def _bh_terms(scheduler, sigma_t, sigma_s0, device):
    """Scalars shared by UniP and UniC: (sigma_t / sigma_s0, alpha_t * h_phi_1, alpha_t * B_h, h, hh, B_h, h_phi_1)."""
    alpha_t, sig_t = _alpha_sigma(scheduler, sigma_t.to(device))
    alpha_s0, sig_s0 = _alpha_sigma(scheduler, sigma_s0.to(device))
    lambda_t = torch.log(alpha_t) - torch.log(sig_t)
    lambda_s0 = torch.log(alpha_s0) - torch.log(sig_s0)
    h = lambda_t - lambda_s0
    hh = -h
    h_phi_1 = torch.expm1(hh)
    b_h = torch.expm1(hh)  # bh2, the only solver type supported here
    return sig_t / sig_s0, alpha_t * h_phi_1, alpha_t * b_h, h, hh, b_h, h_phi_1, lambda_s0


def _rhs(order: int, h_phi_1, hh, b_h) -> list[torch.Tensor]:
    """The b vector of the UniPC linear system, built term by term as the reference builds it."""
    h_phi_k = h_phi_1 / hh - 1
    factorial = 1
    out = []
    for i in range(1, order + 1):
        out.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    return out


def unipc_orders(scheduler) -> list[int]:
    """The solver order UniPC uses at each step (warm-up, then `lower_order_final`)."""
    config, steps = scheduler.config, len(scheduler.timesteps)
    orders = []
    for index in range(steps):
        order = min(config.solver_order, steps - index) if config.lower_order_final else config.solver_order
        orders.append(min(order, min(index, config.solver_order) + 1))
    return orders


def unipc_table(scheduler, device, dtype=torch.float32) -> torch.Tensor:
    """[steps, len(UNIPC)] coefficients for `UniPCMultistepScheduler` after `set_timesteps`."""
    sigmas = scheduler.sigmas
    orders = unipc_orders(scheduler)
    one = torch.ones((), device=device)
    zero = torch.zeros((), device=device)
    rows = []
    for i in range(len(scheduler.timesteps)):
        row = dict.fromkeys(_UNIPC_COLUMNS, one)
        row["sigma"] = sigmas[i].to(device)
        row["use_c"], row["c2"], row["p2"] = zero, zero, zero
        if i > 0 and (i - 1) not in scheduler.disable_corrector:
            order = orders[i - 1]
            c_x, c_m, c_k, h, hh, b_h, h_phi_1, lambda_s0 = _bh_terms(scheduler, sigmas[i], sigmas[i - 1], device)
            rks = []
            if order == 2:
                rks.append((_lambda(scheduler, sigmas[i - 2].to(device)) - lambda_s0) / h)
            rks.append(torch.ones((), device=device))
            rks = torch.stack(rks)
            b = torch.stack(_rhs(order, h_phi_1, hh, b_h))
            if order == 1:
                rhos = torch.ones(1, dtype=dtype, device=device) * 0.5
            else:
                matrix = torch.stack([torch.pow(rks, k) for k in range(order)])
                rhos = torch.linalg.solve(matrix, b).to(device).to(dtype)
            row.update(use_c=one, c2=one if order == 2 else zero, c_x=c_x, c_m=c_m, c_k=c_k, c_rho_t=rhos[-1])
            if order == 2:
                row.update(c_rk=rks[0], c_rho=rhos[0])
        order = orders[i]
        p_x, p_m, p_k, h, *_rest, lambda_s0 = _bh_terms(scheduler, sigmas[i + 1], sigmas[i], device)
        row.update(p_x=p_x, p_m=p_m, p_k=p_k)
        if order == 2:
            rk = (_lambda(scheduler, sigmas[i - 1].to(device)) - lambda_s0) / h
            row.update(p2=one, p_rk=rk, p_rho=(torch.ones(1, dtype=dtype, device=device) * 0.5)[0])
        rows.append(torch.stack([row[name].to(device=device, dtype=dtype).reshape(()) for name in _UNIPC_COLUMNS]))
    return torch.stack(rows)


def _unipc_key(scheduler, device) -> tuple:
    """Everything `unipc_table` reads from the scheduler, as a value."""
    sigmas = scheduler.sigmas
    return (str(torch.device(device)), str(sigmas.dtype), tuple(sigmas.tolist()), len(scheduler.timesteps),
            tuple(unipc_orders(scheduler)), tuple(sorted(scheduler.disable_corrector)),
            bool(scheduler.config.use_flow_sigmas))


def shared_unipc_table(scheduler, device, tables: TableCache | None = None) -> torch.Tensor:
    """`unipc_table(scheduler, device)`, computed once per schedule and kept in `tables` (the model's,
    `engine.model.runtime.ModelRuntime.unipc_tables`; None: not kept); each call gets its own copy (one device
    copy), so nothing a request does to its table reaches another. Why: building it is ~50 small device ops and a
    linear solve per step, about 0.05 s of host time, on every request (measured on the H200,
    docs/perf-log/2026-12-02.md)."""
    if tables is None:
        return unipc_table(scheduler, device)
    return tables.get_or_build(_unipc_key(scheduler, device), lambda: unipc_table(scheduler, device)).clone()


def distilled_table(scheduler, device, dtype=torch.float32) -> torch.Tensor:
    """[steps, len(DISTILLED)]: sigma, 1 - next sigma, next sigma (computed where the reference does)."""
    sigmas = scheduler.sigmas
    rows = [torch.stack([sigmas[i], 1.0 - sigmas[i + 1], sigmas[i + 1]]) for i in range(len(scheduler.timesteps))]
    return torch.stack(rows).to(device=device, dtype=dtype)


def supports_unipc(scheduler) -> bool:
    config = scheduler.config
    return (type(scheduler).__name__ == "UniPCMultistepScheduler" and config.solver_order <= 2
            and config.solver_type == "bh2" and scheduler.predict_x0
            and config.prediction_type == "flow_prediction" and not config.thresholding
            and getattr(scheduler, "solver_p", None) is None and scheduler.step_index is None)


def supports_distilled(scheduler) -> bool:
    return (type(scheduler).__name__ == "FlowMatchEulerDiscreteScheduler" and scheduler.config.stochastic_sampling
            and scheduler.step_index is None)


@dataclass
class SamplerState:
    """One request's sampler: the table, the history buffers, and the step's row (a device copy).

    `load_row(i)` copies row i into `row` (device to device, no host sync); `step` reads only `row`,
    so a CUDA graph that contains `step` is valid for every step.
    """

    kind: str  # "unipc" | "distilled"
    table: torch.Tensor
    row: torch.Tensor
    m_prev: torch.Tensor | None = None   # x0 of the previous step (UniPC history)
    m_prev2: torch.Tensor | None = None  # x0 two steps back
    last: torch.Tensor | None = None     # the sample the previous predictor started from
    noises: torch.Tensor | None = None   # distilled: [steps, *shape] pre-drawn noise
    noise: torch.Tensor | None = None    # distilled: this step's noise (a device copy)

    @property
    def steps(self) -> int:
        return int(self.table.shape[0])

    def load_row(self, index: int) -> None:
        self.row.copy_(self.table[index])
        if self.noises is not None:
            self.noise.copy_(self.noises[index])

    def _c(self, name: str) -> torch.Tensor:
        return self.row[(UNIPC if self.kind == "unipc" else DISTILLED)[name]]

    def step(self, velocity: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """The next sample from this step's velocity (the reference's `scheduler.step(...)[0]`)."""
        if self.kind == "distilled":
            x0 = sample.float() - self._c("sigma") * velocity
            return (self._c("keep") * x0 + self._c("next_sigma") * self.noise).to(velocity.dtype)
        c = self._c
        x0 = sample - c("sigma") * velocity
        # UniC: correct the sample the last predictor produced, now that its x0 is known.
        corr_res = (self.m_prev2 - self.m_prev) / c("c_rk") * c("c_rho")
        corr_res = torch.where(c("c2") != 0, corr_res, torch.zeros((), device=sample.device, dtype=sample.dtype))
        corrected = c("c_x") * self.last - c("c_m") * self.m_prev
        corrected = corrected - c("c_k") * (corr_res + c("c_rho_t") * (x0 - self.m_prev))
        sample = torch.where(c("use_c") != 0, corrected.to(sample.dtype), sample)
        # History roll, then UniP from the (corrected) sample.
        self.m_prev2.copy_(self.m_prev)
        self.m_prev.copy_(x0)
        self.last.copy_(sample)
        pred = c("p_x") * sample - c("p_m") * x0
        pred_res = (self.m_prev2 - x0) / c("p_rk") * c("p_rho")
        pred_res = torch.where(c("p2") != 0, pred_res, torch.zeros((), device=sample.device, dtype=sample.dtype))
        return (pred - c("p_k") * pred_res).to(sample.dtype)


def sampler_supported(scheduler) -> bool:
    """Whether `sampler_for` has a table-driven sampler for `scheduler` (else it returns None)."""
    return supports_unipc(scheduler) or supports_distilled(scheduler)


def sampler_for(scheduler, sample: torch.Tensor, generator: torch.Generator | None = None,
                tables: TableCache | None = None) -> SamplerState | None:
    """A table-driven sampler equal to `scheduler` for a whole request, or None where unsupported. `tables`: where
    UniPC tables are kept across requests (`shared_unipc_table`)."""
    device = sample.device
    if supports_unipc(scheduler):
        table = shared_unipc_table(scheduler, device, tables)
        zeros = lambda: torch.zeros_like(sample)  # noqa: E731 - finite history before the first step
        return SamplerState("unipc", table, table[0].clone(), zeros(), zeros(), zeros())
    if supports_distilled(scheduler):
        table = distilled_table(scheduler, device)
        draws = [randn_tensor(tuple(sample.shape), generator=generator, device=device, dtype=torch.float32)
                 for _ in range(table.shape[0])]
        noises = torch.stack(draws)
        return SamplerState("distilled", table, table[0].clone(), noises=noises, noise=noises[0].clone())
    return None
