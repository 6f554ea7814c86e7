"""One engine step: its prefills batched into one padded attention call, its decodes in one
vectorized paged (or slab) attention call, its index tensors built once, one host sync, and
decode-only steps at bucketed batch sizes over static buffers (what CUDA graphs replay; on a CPU
the same buckets run uncaptured). Each is checked against the straightforward path: every
sequence alone through a plain growing cache, in float64."""

from __future__ import annotations

import pytest
import torch

from gpubench.measure import profiling
from gpubench.models.llama import LlamaConfig, causal_attention, forward, random_weights
from gpubench.serving.config import EngineConfig
from gpubench.serving.engine import Engine
from gpubench.serving.graphs import DecodeGraphs, batch_buckets, bucket_for
from gpubench.serving.kv import make_kv
from gpubench.serving.model_runner import ModelRunner
from gpubench.serving.reference import reference_generate
from gpubench.serving.sequence import Sequence
from gpubench.serving.step_inputs import Staging, build_step
from gpubench.serving.traces import Request, TraceSpec, generate

# GQA (4 query heads over 2 KV heads), blocks of 8 so contexts end inside a block.
TINY = LlamaConfig(
    vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128
)


@pytest.fixture(scope="module")
def weights64():
    return random_weights(TINY, seed=3, dtype=torch.float64)


def lone_logits(weights, tokens: list[int]) -> torch.Tensor:
    """The straightforward path: the whole sequence alone, causal SDPA, logits after its last token."""
    with torch.inference_mode():
        return forward(
            weights,
            torch.tensor(tokens),
            torch.arange(len(tokens)),
            lambda i, q, k, v: causal_attention(q, k, v),
            logits_at=torch.tensor([len(tokens) - 1]),
        )[0]


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY.vocab_size, (n,), generator=g).tolist() for n in lengths]


def backend(weights, kv: str, spare_unit: bool = False):
    cfg = EngineConfig(kv=kv, kv_budget_bytes=64 * 8 * TINY.kv_bytes_per_token(8), block_size=8, max_len=64)
    return make_kv(weights, cfg, spare_unit=spare_unit)


def admitted(kv, tokens_list: list[list[int]]) -> list[Sequence]:
    seqs = [Sequence.of(Request(i, 0.0, list(t), 1), 0.0) for i, t in enumerate(tokens_list)]
    for s in seqs:
        kv.admit(s)
    return seqs


def step_logits(runner: ModelRunner, prefills, decodes) -> torch.Tensor:
    with torch.inference_mode():
        logits = runner.forward(build_step(runner.kv, runner.staging, prefills, decodes))
    for s in prefills:
        s.cached = len(s.tokens)
    for s in decodes:
        s.cached += 1
    return logits


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_prefills_of_different_lengths_batched_in_one_step_give_each_ones_lone_logits(weights64, kv):
    """Five prompts of 1 to 21 tokens (contexts ending inside a block and on its edge) prefilled
    in one step: every sequence's logits equal its lone forward pass (float64, 1e-10)."""
    backend_ = backend(weights64, kv)
    tokens = prompts([5, 21, 1, 8, 13])
    seqs = admitted(backend_, tokens)
    logits = step_logits(ModelRunner(weights64, backend_, 0.0), seqs, [])
    for row, t in zip(logits, tokens):
        assert torch.allclose(row, lone_logits(weights64, t), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_one_step_mixing_prefills_with_cached_prefixes_and_decodes(weights64, kv):
    """One step holding a fresh prefill, two prefills over cached prefixes (a resumed request:
    7 then 10 more tokens; 8 then 1 more) and three decodes: each sequence's logits equal its
    lone forward pass over all its tokens."""
    backend_ = backend(weights64, kv)
    runner = ModelRunner(weights64, backend_, 0.0)
    full = prompts([17, 9, 12, 6, 19, 11], seed=1)
    first = [full[0][:7], full[1][:8], full[2], full[3], full[4], full[5]]
    seqs = admitted(backend_, first)
    step_logits(runner, seqs[:5], [])  # everything but the fresh one is cached up to here
    for s, t in zip(seqs[:2], full[:2]):
        s.tokens = list(t)
        assert backend_.allocator.ensure(s.id, len(t))
    decodes = seqs[2:5]
    for s in decodes:
        s.tokens.append(int(torch.randint(0, TINY.vocab_size, (1,))))
        assert backend_.reserve_next(s)
    logits = step_logits(runner, [seqs[5], seqs[0], seqs[1]], decodes)
    for row, s in zip(logits, [seqs[5], seqs[0], seqs[1]] + decodes):
        assert torch.allclose(row, lone_logits(weights64, s.tokens), rtol=0, atol=1e-10), s.id
        assert s.cached == len(s.tokens)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_a_step_writes_every_new_tokens_kv_to_its_own_slot_and_nothing_else(weights64, kv):
    """After a step the cache holds, at each sequence's slots, the K/V its lone pass computes,
    and every slot the step did not own is untouched (poisoned with NaN beforehand)."""
    backend_ = backend(weights64, kv)
    for cache in backend_.k + backend_.v:
        cache.fill_(float("nan"))
    tokens = prompts([9, 3, 16])
    seqs = admitted(backend_, tokens)
    step_logits(ModelRunner(weights64, backend_, 0.0), seqs, [])
    owned = [slot for s in seqs for slot in backend_.slot_list(s, 0, len(s.tokens))]
    for layer in range(TINY.num_layers):
        flat = backend_.k[layer].flatten(0, 1)
        assert not flat[owned].isnan().any()
        rest = torch.ones(flat.shape[0], dtype=torch.bool)
        rest[owned] = False
        assert flat[rest].isnan().all()
    # layer 0's keys: rotary-embedded projections of the embeddings, as the lone pass makes them
    c, w0 = TINY, weights64.layers[0]
    from gpubench.models.llama import apply_rope, rms_norm, rope_cos_sin

    for s, t in zip(seqs, tokens):
        x = rms_norm(weights64.embed[torch.tensor(t)], w0.attn_norm, c.rms_eps)
        cos, sin = rope_cos_sin(weights64, torch.arange(len(t)))
        k = apply_rope((x @ w0.wk.T).view(len(t), c.num_kv_heads, c.head_dim), cos, sin)
        got = backend_.k[0].flatten(0, 1)[backend_.slot_list(s, 0, len(t))]
        assert torch.allclose(got, k, rtol=0, atol=1e-12)


def test_a_decode_step_reads_the_device_once_and_builds_its_indices_once(weights64):
    """torch.profiler over full decode steps: one host read per step (the sampled tokens; no
    .item(), no max() of the context lengths), and the KV write is one index_copy_ per K and V
    per layer whatever the batch."""
    from torch.profiler import ProfilerActivity, profile, record_function

    backend_ = backend(weights64, "paged")
    runner = ModelRunner(weights64, backend_, 0.0)
    seqs = admitted(backend_, prompts([5, 9, 14, 3, 8, 11]))
    runner.run(seqs, [])
    for s in seqs:
        s.tokens.append(3)
        assert backend_.reserve_next(s)
    steps = 3
    with profiling._HostReads(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with record_function(f"{profiling.CALL_RANGE}{i}"):
                out = runner.run([], seqs)
            for s, token in zip(seqs, out):
                s.tokens.append(token)
                assert backend_.reserve_next(s)
    summary = profiling.summarize(prof.events(), steps, cuda=False)
    assert summary["syncs_per_call"] == 1 and summary["sync_ops"] == {"Tensor.tolist": 1}, summary["sync_ops"]
    counts = {t["name"]: t["count_per_call"] for t in summary["top_ops"]}
    writes = sum(e.name == "aten::index_copy_" for e in prof.events()) / steps
    assert writes == 2 * TINY.num_layers, counts


# -- bucketed decode (CUDA graphs' bookkeeping, run uncaptured on the CPU) -------------------


def test_buckets_are_powers_of_two_up_to_max_batch_and_a_batch_takes_the_smallest_that_holds_it():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets(1) == [1]
    buckets = batch_buckets(48)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [1, 2, 4, 8, 16, 32, 48, 48]
    for bad in (0, 49):
        with pytest.raises(ValueError):
            bucket_for(bad, buckets)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_bucketed_decode_pads_with_rows_that_write_only_the_spare_unit(weights64, kv):
    """Five decodes run in the bucket of 8: their logits equal the eager step's, the padding
    rows' K/V land in the spare unit only (every slot a sequence owns holds what the eager path
    wrote there), and the static buffer's rows past the batch are padding."""
    tokens = prompts([6, 15, 9, 2, 8], seed=4)
    results = {}
    for bucketed in (False, True):
        backend_ = backend(weights64, kv, spare_unit=True)
        runner = ModelRunner(weights64, backend_, 0.0, decode_graphs=bucketed, max_batch=8)
        seqs = admitted(backend_, tokens)
        runner.run(seqs, [])
        for s in seqs:
            s.tokens.append(7)
            assert backend_.reserve_next(s)
        with torch.inference_mode():
            if bucketed:
                logits = runner.graphs.run(seqs)
            else:
                logits = runner.forward(build_step(backend_, runner.staging, [], seqs))
        owned = [slot for s in seqs for slot in backend_.slot_list(s, 0, len(s.tokens))]
        results[bucketed] = (logits, [c.flatten(0, 1)[owned] for c in backend_.k + backend_.v], runner, backend_)
    (eager, eager_kv, _, _), (padded, padded_kv, runner, backend_) = results[False], results[True]
    assert padded.shape == eager.shape and torch.allclose(padded, eager, rtol=0, atol=1e-12)
    # (a batch of 8 rounds its matmuls unlike a batch of 5: equal to float64 rounding, not bitwise)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(eager_kv, padded_kv))
    graphs = runner.graphs
    assert graphs.replays[8] == 1 and sum(graphs.replays.values()) == 1
    b = graphs.views(8)
    assert b.slots[5:].tolist() == [graphs.pad_slot] * 3 and b.lens[5:].tolist() == [1] * 3
    unit = backend_.spare_unit
    assert graphs.pad_slot // backend_.unit_tokens == unit and not backend_.k[0][unit, 0].isnan().any()


def test_cuda_graph_capture_is_refused_without_cuda_and_needs_the_spare_unit(weights64):
    backend_ = backend(weights64, "paged", spare_unit=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(backend_, Staging(torch.device("cpu")), 4, lambda inputs: None, capture=True)
    with pytest.raises(ValueError, match="spare unit"):
        DecodeGraphs(backend(weights64, "paged"), Staging(torch.device("cpu")), 4, lambda inputs: None, capture=False)


def test_graphs_default_on_for_cuda_only():
    assert EngineConfig().graphs_on(torch.device("cuda")) and not EngineConfig().graphs_on(torch.device("cpu"))
    assert not EngineConfig(cuda_graphs=False).graphs_on(torch.device("cuda"))


@pytest.mark.parametrize(
    "scheduler,kv", [("continuous", "paged"), ("static", "contiguous"), ("continuous", "contiguous")]
)
def test_engine_with_bucketed_decode_generates_each_requests_lone_tokens(weights64, scheduler, kv):
    """The whole engine with decode-only steps through the buckets (preemption included for paged):
    every greedy request equals its lone generation, and the spare unit is never handed out."""
    requests = generate(TraceSpec(12, "all", "uniform:3:20", "uniform:1:24", TINY.vocab_size), 1)
    cfg = EngineConfig(
        scheduler=scheduler,
        kv=kv,
        kv_budget_bytes=16 * 8 * TINY.kv_bytes_per_token(8),
        block_size=8,
        max_len=48,
        max_batch=8,
        wait=False,
        cuda_graphs=True,
    )
    run = Engine(weights64, cfg).run(requests)
    assert run.accounting_problems == []
    for r in requests:
        assert run.tokens[r.id] == reference_generate(weights64, r)[0], f"request {r.id}"
    if kv == "paged":
        assert run.preemptions > 0


def test_fused_forward_equals_the_models_forward_and_follows_weight_changes(weights64):
    """The serving forward (q, k, v from one stacked matmul, one rotary call) computes the model's
    logits (float64, 1e-12), and its stacked copy is remade when a projection changes in place."""
    from gpubench.models.llama import fused_forward, fused_qkv

    weights = random_weights(TINY, seed=5, dtype=torch.float64)
    tokens, positions = torch.randint(0, TINY.vocab_size, (2, 9)), torch.arange(9).expand(2, 9)

    def attend(i, q, k, v):
        return torch.stack([causal_attention(q[b], k[b], v[b]) for b in range(2)])

    with torch.inference_mode():
        assert torch.allclose(
            fused_forward(weights, tokens, positions, attend),
            forward(weights, tokens, positions, attend),
            rtol=0,
            atol=1e-12,
        )
    stacked = fused_qkv(weights)[1]
    with torch.no_grad():
        weights.layers[1].wv.mul_(-1.0)
    assert fused_qkv(weights)[1] is not stacked
    assert torch.equal(fused_qkv(weights)[1][-weights.layers[1].wv.shape[0] :], weights.layers[1].wv)
