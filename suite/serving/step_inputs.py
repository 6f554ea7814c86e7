"""What one engine step feeds the model, built once per step and read by every layer: the new
tokens, their positions and KV slots, which logits to keep, how the prefills lie in a padded
batch, and the decodes' addressing. The host builds them as Python lists, packs them into one
int64 buffer (pinned on CUDA) and copies that to the device once; everything else is views of it
or derived from it on the device, so a step costs no host sync before its sampled tokens.

Prefills of a step run as one padded batch (``prefill_attention``): query ``i`` of prefill ``r``
sits at ``(r, i)``, its keys are gathered from the cache (the step's new K/V are written there
first, so a cached prefix and the new tokens are read alike), and one SDPA call attends over all
of them, causal when no prefill has a cached prefix, else with the mask ``key j <= past_r + i``.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpubench.serving.kv import DecodeBatch, KVBackend
from gpubench.serving.sequence import Sequence


class Staging:
    """One int64 buffer on the device, filled from one host copy per step (pinned on CUDA, so the
    copy does not wait). The host buffer is reused: the step's sampled tokens, read back before
    the next step packs, are the sync that says the previous copy is done."""

    def __init__(self, device: torch.device, capacity: int = 1 << 14):
        self.device = device
        self.host = self.dev = None
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        cuda = self.device.type == "cuda"
        self.host = torch.empty(capacity, dtype=torch.long, pin_memory=cuda)
        self.dev = torch.empty(capacity, dtype=torch.long, device=self.device) if cuda else self.host

    def put(self, values: list[int], into: torch.Tensor | None = None) -> torch.Tensor:
        """``values`` on the device (a view of ``into`` when given: a preallocated buffer)."""
        n = len(values)
        packed = torch.frombuffer(array("q", values), dtype=torch.long) if n else torch.empty(0, dtype=torch.long)
        if self.device.type != "cuda":
            return packed if into is None else into[:n].copy_(packed)
        if n > self.host.numel():
            self._grow(max(n, 2 * self.host.numel()))
        self.host[:n] = packed
        target = self.dev if into is None else into
        return target[:n].copy_(self.host[:n], non_blocking=True)


def split(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(flat, sizes)) if len(sizes) > 1 else [flat]


@dataclass(frozen=True)
class PrefillLayout:
    """The step's prefills as a padded ``(P, Q)`` batch of queries over ``(P, K)`` cached keys."""

    query_index: torch.Tensor  # (P, Q) into the step's packed tokens; padding repeats the last query
    key_slots: torch.Tensor  # (P, K) flat cache slots; padding repeats the first (written, finite)
    out_index: torch.Tensor  # (prefill tokens,) each new token's place in the flattened (P * Q)
    mask: torch.Tensor | None  # (P, 1, Q, K) key j visible to query i; None: no cached prefix, causal

    @property
    def tokens(self) -> int:
        return self.out_index.shape[0]


@dataclass(frozen=True)
class StepInputs:
    tokens: torch.Tensor  # (n,) the new tokens: each prefill's uncached ones, then one per decode
    positions: torch.Tensor  # (n,)
    slots: torch.Tensor  # (n,) where each new token's K/V go
    logits_at: torch.Tensor | None  # (sequences,) each one's last token; None when that is every token
    prefill: PrefillLayout | None
    decode: DecodeBatch | None


def prefill_lists(kv: KVBackend, prefills: list[Sequence]) -> tuple[list[int], list[int], list[int], list[int],
                                                                      list[list[int]]]:
    """Host lists of the prefills: tokens, positions, new slots, query rows (packed indices, padded
    to the longest) and key rows (flat slots of the whole context, padded to the longest)."""
    tokens, positions, slots, q_rows, k_rows = [], [], [], [], []
    longest_new = max(len(s.tokens) - s.cached for s in prefills)
    longest = max(len(s.tokens) for s in prefills)
    for s in prefills:
        start, n = len(tokens), len(s.tokens)
        context = kv.slot_list(s, 0, n)
        tokens += s.tokens[s.cached:]
        positions += range(s.cached, n)
        slots += context[s.cached:]
        new = n - s.cached
        q_rows += range(start, start + new)
        q_rows += [start + new - 1] * (longest_new - new)
        k_rows.append(context + [context[0]] * (longest - n))
    return tokens, positions, slots, q_rows, k_rows


def build_step(kv: KVBackend, staging: Staging, prefills: list[Sequence], decodes: list[Sequence]) -> StepInputs:
    """The step's inputs, staged to the device in one copy (see the module docstring)."""
    tokens, positions, slots, q_rows, k_rows = prefill_lists(kv, prefills) if prefills else ([], [], [], [], [])
    n_prefill = len(tokens)
    if decodes:
        rows = kv.decode_rows(decodes)
        tokens += [s.tokens[s.cached] for s in decodes]
        positions += [s.cached for s in decodes]
        slots += rows.slots
    last: list[int] = []
    if prefills:
        at = 0
        for s in prefills:
            at += len(s.tokens) - s.cached
            last.append(at - 1)
        last += range(n_prefill, len(tokens))
    n, p = len(tokens), len(prefills)
    width_q = len(q_rows) // p if p else 0
    width_k = len(k_rows[0]) if p else 0
    past = [s.cached for s in prefills]
    out_index = [r * width_q + i for r, s in enumerate(prefills) for i in range(len(s.tokens) - s.cached)]
    values = tokens + positions + slots + last + q_rows + [x for row in k_rows for x in row] + out_index + past
    sizes = [n, n, n, len(last), len(q_rows), p * width_k, len(out_index), p]
    if decodes:
        values += rows.lens + [x for row in rows.rows for x in row]
        sizes += [len(decodes), len(decodes) * len(rows.rows[0])]
    parts = split(staging.put(values), sizes)
    tok, pos, slot, at_last, q_idx, k_slots, out_idx, past_t = parts[:8]
    layout = None
    if prefills:
        mask = None
        if any(past):  # query i of row r (at position past_r + i) sees keys 0 .. past_r + i
            i = torch.arange(width_q, device=tok.device)[None, :, None]
            j = torch.arange(width_k, device=tok.device)[None, None, :]
            mask = (j <= past_t[:, None, None] + i)[:, None]
        layout = PrefillLayout(q_idx.view(p, width_q), k_slots.view(p, width_k), out_idx, mask)
    decode = None
    if decodes:
        lens, table = parts[8], parts[9].view(len(decodes), -1)
        decode = kv.decode_batch(lens, table, max(rows.lens))
    return StepInputs(tok, pos, slot, at_last if prefills else None, layout, decode)


def prefill_attention(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor,
                      layout: PrefillLayout) -> torch.Tensor:
    """Attention of the step's prefill tokens q ``(tokens, heads, d)`` over their contexts in the
    cache (``(units, unit_tokens, kv_heads, d)``, the new K/V already written): one SDPA call over
    the padded batch, GQA by head grouping; returns ``(tokens, heads, d)`` in q's order."""
    rows, width_q = layout.query_index.shape
    width_k = layout.key_slots.shape[1]
    heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[-2]
    qp = q.index_select(0, layout.query_index.reshape(-1)).view(rows, width_q, heads, head_dim)
    keys = layout.key_slots.reshape(-1)
    kp = k_cache.reshape(-1, kv_heads, head_dim).index_select(0, keys).view(rows, width_k, kv_heads, head_dim)
    vp = v_cache.reshape(-1, kv_heads, head_dim).index_select(0, keys).view(rows, width_k, kv_heads, head_dim)
    # Without a cached prefix Q == K and plain causality is exact for every real query: a padded
    # key j >= n is only visible to padded queries i >= j, whose outputs are dropped.
    out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                         attn_mask=layout.mask, is_causal=layout.mask is None,
                                         enable_gqa=heads != kv_heads)
    return out.transpose(1, 2).reshape(rows * width_q, heads, head_dim).index_select(0, layout.out_index)
