"""The kernel tests' independent fp32 attention: what the prefix attention and the shared first-layer attention are
both checked against."""
import torch
import torch.nn.functional as F


def sdpa_per_branch_fp32(q, buf, layout):
    """One SDPA per branch over its own [prefix | gen] rows in fp32, K/V expanded for GQA (no enable_gqa)."""
    outs = []
    group = q.shape[2] // buf.shape[2]
    for b in range(layout.num_branches):
        k_b, v_b = layout.branch_kv(buf, b)
        k_b = k_b.float().repeat_interleave(group, dim=1).transpose(0, 1)
        v_b = v_b.float().repeat_interleave(group, dim=1).transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(q[b].float().transpose(0, 1), k_b, v_b).transpose(0, 1))
    return torch.stack(outs)
