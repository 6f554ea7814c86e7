"""paged_attention: one decode step over a paged KV cache, gathering each sequence's blocks into a
contiguous copy first (``gather``) against reading K/V through the block table in place (the
Triton kernel on CUDA, ``torch_blocks`` standing in elsewhere), checked against float64 attention.
Peers: SDPA over a contiguous cache (``sdpa_contiguous``, no paging at all) and FlashInfer's paged
decode (``flashinfer``, where it is installed and the device is CUDA).

A case's sequences have mixed context lengths (drawn in [1, context_len], the longest set to
context_len, or ``edges``: at and around block edges), their blocks shuffled through a pool with
spare ones, and every slot of the pool holds random data: a read through a wrong block or past a
context's end changes the result. The check takes the worst sequence, so a fault in one long
context is not diluted by the others.
"""

from __future__ import annotations

from gpubench.contract import Bench, Claim, Param, Plot, Technique
from gpubench.lib.gqa import head_params, head_problems
from gpubench.lib.paged_decode import KERNEL
from gpubench.lib.triton_support import interpreter_note
from gpubench.records.claims import VLLM
from gpubench.techniques.paged_attention import decode
from gpubench.techniques.paged_attention.correctness import decode_metrics, float64_reference, per_sequence_check
from gpubench.techniques.paged_attention.workload import build_workload

TECHNIQUE = Technique(
    name="paged_attention",
    shape="kernel",
    summary="Decode attention reading K/V through the block table in place, instead of gathering "
    "each sequence's blocks into a contiguous copy first.",
    anchor="vLLM: KV memory waste under 4% (vs 60-80% for contiguous reservation); 2-4x throughput",
    claims=[
        Claim(
            *VLLM,
            text="2-4x serving throughput with PagedAttention",
            figure=(2.0, 4.0),
            measures="serving throughput, paged KV vs contiguous reservation",
            conditions="OPT-13B to 175B and LLaMA-13B on A100s, ShareGPT and Alpaca traces",
            not_measured="this pair times decode attention alone; vLLM's 2-4x comes from the larger "
            "batches paging allows (paged_kv_serving measures that)",
        )
    ],
    gpu_specific=(
        "The win is HBM traffic: decode is memory-bound, and the gather writes every KV byte into a "
        "copy and reads it back, where the Triton kernel reads each byte once (once per KV head's "
        "whole query group, long contexts split across SMs). On a CPU the optimized role is played "
        "by torch_blocks, the kernel's logic as vectorized PyTorch; both sides run largely from "
        "caches, so the CPU ratio says little about a GPU's."
    ),
    params=[
        Param("batch", int, 4, "sequences decoding one token each (lengths: random or full)", min=1),
        *head_params(heads=8),
        Param("head_dim", int, 64, "channels per head", choices=[64, 128]),
        Param("context_len", int, 512, "longest context (tokens); the others are drawn in [1, this]", min=1),
        Param("block_size", int, 16, "tokens per KV block", choices=[8, 16, 32]),
        Param(
            "lengths",
            str,
            "random",
            "random: `batch` contexts in [1, context_len]; full: all `batch` at "
            "context_len (a bandwidth test: every split busy); edges: one sequence per length at and around "
            "block edges (1, B-1, B, B+1, 2B-1, .., context_len)",
            choices=["random", "full", "edges"],
        ),
        Param(
            "dtype",
            str,
            "float32",
            "dtype of q, the KV cache and the output",
            choices=["float32", "float16", "bfloat16"],
        ),
    ],
    plots=[
        Plot(
            "Decode bandwidth (GB/s, each KV byte counted once) against the longest context",
            y="gbps",
            x="context_len",
            ylabel="GB/s",
        ),
        Plot("Time per decode step (ms) against batch", y="time", x="batch", scale=1e3, ylabel="ms per step"),
    ],
    benchmarks=[Bench("4-seqs-512", {"batch": 4, "heads": 8, "kv_heads": 2, "context_len": 512})],
)


validate = TECHNIQUE.validate(head_problems)
build = TECHNIQUE.build(build_workload)

# -- variants ---------------------------------------------------------------------------------

gather = TECHNIQUE.variant("gather", role="baseline")(decode.gather)
triton_kernel = TECHNIQUE.variant(
    "triton", role="optimized", unavailable=decode.triton_problem, checked_only=interpreter_note(KERNEL[0])
)(decode.triton_kernel)
torch_blocks = TECHNIQUE.variant("torch_blocks", role="optimized")(decode.torch_blocks)
sdpa_contiguous = TECHNIQUE.variant("sdpa_contiguous")(decode.sdpa_contiguous)
flashinfer_decode = TECHNIQUE.variant("flashinfer", unavailable=decode.flashinfer_unavailable)(decode.flashinfer_decode)

# -- correctness and figures ------------------------------------------------------------------

reference = TECHNIQUE.reference(float64_reference)
check = TECHNIQUE.check(per_sequence_check)
metrics = TECHNIQUE.metrics(decode_metrics)
