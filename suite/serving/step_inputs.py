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

import itertools
from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpubench.serving.kv import DecodeBatch, KVBackend
from gpubench.serving.sequence import Sequence


class Staging:
    """One int64 buffer on the device, filled from one host copy per step (pinned on CUDA, so the
    copy does not wait). The host buffer is reused: an event recorded after each copy is waited on
    before the host buffer is written again, so a copy still in flight never reads the next
    step's values (the engine's read-back of sampled tokens usually means it has already passed)."""

    def __init__(self, device: torch.device, capacity: int = 1 << 14):
        self.device = device
        self.host: torch.Tensor | None = None
        self.dev: torch.Tensor | None = None
        self.copied: torch.cuda.Event | None = None  # CUDA: an event recorded after the last copy from the host buffer
        if device.type == "cuda":  # elsewhere the packed host tensor is used as it is
            self.copied = torch.cuda.Event()
            self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        self.host = torch.empty(capacity, dtype=torch.long, pin_memory=True)
        self.dev = torch.empty(capacity, dtype=torch.long, device=self.device)

    def put(self, values: list[int], into: torch.Tensor | None = None) -> torch.Tensor:
        """``values`` on the device (a view of ``into`` when given: a preallocated buffer)."""
        n = len(values)
        packed = torch.frombuffer(array("q", values), dtype=torch.long) if n else torch.empty(0, dtype=torch.long)
        if self.device.type != "cuda":
            return packed if into is None else into[:n].copy_(packed)
        assert self.copied is not None and self.host is not None and self.dev is not None  # made for CUDA
        self.copied.synchronize()  # the previous copy may still be reading the host buffer
        if n > self.host.numel():
            self._grow(max(n, 2 * self.host.numel()))
        self.host[:n] = packed
        target = self.dev if into is None else into
        out = target[:n].copy_(self.host[:n], non_blocking=True)
        self.copied.record()
        return out


class Pack:
    """A step's host lists, named, concatenated in the order they are added, staged in one copy."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.names: list[str] = []
        self.sizes: list[int] = []

    def add(self, name: str, values: list[int]) -> None:
        self.values += values
        self.names.append(name)
        self.sizes.append(len(values))

    def stage(self, staging: Staging) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, torch.split(staging.put(self.values), self.sizes)))


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


def pack_prefills(kv: KVBackend, prefills: list[Sequence], pack: Pack) -> tuple[int, int]:
    """The prefills' new tokens, their positions and slots; their query rows (indices into the
    packed tokens, padded to the longest with the row's last) and key rows (flat slots of each
    whole context, padded to the longest with its first); where each new token sits in the
    padded batch, and each one's cached prefix. Returns the padded widths (queries, keys)."""
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    q_rows: list[int] = []
    k_rows: list[int] = []
    out_index: list[int] = []
    width_q = max(len(s.tokens) - s.cached for s in prefills)
    width_k = max(len(s.tokens) for s in prefills)
    for r, s in enumerate(prefills):
        start, n, new = len(tokens), len(s.tokens), len(s.tokens) - s.cached
        context = kv.slot_list(s, 0, n)
        tokens += s.tokens[s.cached :]
        positions += range(s.cached, n)
        slots += context[s.cached :]
        q_rows += range(start, start + new)
        q_rows += [start + new - 1] * (width_q - new)
        k_rows += context
        k_rows += [context[0]] * (width_k - n)
        out_index += range(r * width_q, r * width_q + new)
    for name, values in (
        ("tokens", tokens),
        ("positions", positions),
        ("slots", slots),
        ("q_rows", q_rows),
        ("k_rows", k_rows),
        ("out_index", out_index),
        ("past", [s.cached for s in prefills]),
    ):
        pack.add(name, values)
    return width_q, width_k


def pack_decodes(kv: KVBackend, decodes: list[Sequence], pack: Pack) -> int:
    """One token per decode, its position and slot, each context length and addressing row.
    Returns the longest context."""
    rows = kv.decode_rows(decodes)
    pack.add("decode_tokens", [s.tokens[s.cached] for s in decodes])
    pack.add("decode_positions", [s.cached for s in decodes])
    pack.add("decode_slots", rows.slots)
    pack.add("lens", rows.lens)
    pack.add("rows", [x for row in rows.rows for x in row])
    return max(rows.lens)


def prefill_layout(t: dict[str, torch.Tensor], width_q: int, width_k: int, has_past: bool) -> PrefillLayout:
    """The padded batch's indices, and its mask when some prefill has a cached prefix: query i of
    row r (at position past_r + i) sees keys 0 .. past_r + i."""
    past = t["past"]
    rows = past.shape[0]
    mask = None
    if has_past:
        i = torch.arange(width_q, device=past.device)[None, :, None]
        j = torch.arange(width_k, device=past.device)[None, None, :]
        mask = (j <= past[:, None, None] + i)[:, None]
    return PrefillLayout(t["q_rows"].view(rows, width_q), t["k_rows"].view(rows, width_k), t["out_index"], mask)


def build_step(kv: KVBackend, staging: Staging, prefills: list[Sequence], decodes: list[Sequence]) -> StepInputs:
    """The step's inputs, staged to the device in one copy (see the module docstring): prefills
    first, then decodes, in the new tokens' order."""
    pack = Pack()
    widths = pack_prefills(kv, prefills, pack) if prefills else None
    longest = pack_decodes(kv, decodes, pack) if decodes else 0
    if prefills:  # logits wanted: each prefill's last new token, then every decode's one
        ends = list(itertools.accumulate(len(s.tokens) - s.cached for s in prefills))
        pack.add("logits_at", [end - 1 for end in ends] + list(range(ends[-1], ends[-1] + len(decodes))))
    t = pack.stage(staging)
    if prefills and decodes:
        tokens, positions, slots = (torch.cat([t[k], t["decode_" + k]]) for k in ("tokens", "positions", "slots"))
    else:
        prefix = "" if prefills else "decode_"
        tokens, positions, slots = (t[prefix + k] for k in ("tokens", "positions", "slots"))
    layout = prefill_layout(t, *widths, any(s.cached for s in prefills)) if widths is not None else None
    decode = kv.decode_batch(t["lens"], t["rows"].view(len(decodes), -1), longest) if decodes else None
    return StepInputs(tokens, positions, slots, t.get("logits_at"), layout, decode)


def prefill_attention(
    k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, layout: PrefillLayout
) -> torch.Tensor:
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
    out = F.scaled_dot_product_attention(
        qp.transpose(1, 2),
        kp.transpose(1, 2),
        vp.transpose(1, 2),
        attn_mask=layout.mask,
        is_causal=layout.mask is None,
        enable_gqa=heads != kv_heads,
    )
    return out.transpose(1, 2).reshape(rows * width_q, heads, head_dim).index_select(0, layout.out_index)
