"""flash_attention: eager attention (N x N scores in memory) against tiled online softmax (the
Triton kernels on CUDA, ``torch_tiled`` standing in elsewhere), checked against float64 attention.
``mode: train`` times forward + backward of a random upstream gradient in one call and checks the
gradients of q, k and v as well; ``varlen`` packs documents of random lengths into one stream
(flash-attn's varlen layout, cu_seqlens) and checks each document against itself run alone.
Peers: torch SDPA (default dispatch, and pinned to each CUDA backend) and flash-attn if installed.
"""

from __future__ import annotations

from gpubench.contract import Bench, Claim, Param, Plot, Technique
from gpubench.lib.attention import CAUSAL_ALIGNS
from gpubench.lib.gqa import head_params
from gpubench.lib.triton_support import interpreter_note
from gpubench.optimizations.flash_attention import KERNEL
from gpubench.techniques.flash_attention import attend
from gpubench.techniques.flash_attention.correctness import attention_metrics, float64_reference, output_check
from gpubench.techniques.flash_attention.workload import HEAD_DIMS, MODES, block_problems, build_workload

TECHNIQUE = Technique(
    name="flash_attention",
    shape="kernel",
    summary="Exact attention by tiles with an online softmax, never storing the N x N scores; forward, "
    "or forward + backward (train); padded batches or packed variable-length documents; full, causal, "
    "sliding-window or chunked local masks.",
    anchor="FA2: 50-73% of peak on A100; FA3: 740 TFLOP/s fp16 on H100 (75% of peak)",
    claims=[
        Claim(
            "Dao, FlashAttention-2 (2023)",
            "https://arxiv.org/abs/2307.08691",
            text="50-73% of the A100's 312 TFLOP/s fp16/bf16 peak, forward (156-228 TFLOP/s)",
            figure=(156.0, 228.0),
            unit="tflops",
            reads="tflops",
            per_time=True,
            gpus=("A100",),
            measures="attention forward throughput of the fused kernel",
            conditions="A100 80GB, fp16/bf16, head_dim 64 or 128, seq_len 512-16k, batch x seq_len = 16k",
            when={
                "dtype": ("in", ("float16", "bfloat16")),
                "head_dim": ("in", (64, 128)),
                "seq_len": (">=", 512),
                "mode": ("==", "forward"),
                "varlen": ("==", False),
                # full or causal, as measured; None: results from before these params (issue 37)
                "window": ("in", (0, None), "measured full or causal, not a sliding window's band"),
                "chunk": ("in", (0, None), "measured full or causal, not chunked local attention"),
            },
            caveat="measured: the optimized variant (gpubench's Triton kernel, FA2's algorithm), "
            "not the FA2 CUDA kernel",
            device_reason="the win is HBM traffic of a fused GPU kernel",
        ),
        Claim(
            "Shah et al., FlashAttention-3 (2024)",
            "https://arxiv.org/abs/2407.08608",
            text="up to 740 TFLOP/s fp16 on H100 (75% of peak)",
            figure=(740.0, 740.0),
            unit="tflops",
            reads="tflops",
            per_time=True,
            gpus=("H100", "H200"),
            measures="attention forward throughput of the fused kernel",
            conditions="H100 SXM5, fp16, long sequences",
            when={
                "dtype": ("in", ("float16", "bfloat16")),
                "seq_len": (">=", 512),
                "mode": ("==", "forward"),
                "varlen": ("==", False),
                # full or causal, as measured; None: results from before these params (issue 37)
                "window": ("in", (0, None), "measured full or causal, not a sliding window's band"),
                "chunk": ("in", (0, None), "measured full or causal, not chunked local attention"),
            },
            caveat="measured: gpubench's Triton kernel (FA2's algorithm), not FA3's warp-specialized "
            "Hopper kernel; an H200 has the H100's compute with more HBM",
            device_reason="the win is HBM traffic of a fused GPU kernel",
        ),
    ],
    gpu_specific=(
        "The win is HBM traffic: on a GPU the fused kernels keep each score tile on chip instead "
        "of writing N x N scores to memory and reading them back (the backward recomputes them from "
        "the saved log-sum-exp instead of keeping them). On a CPU the optimized role is played by "
        "torch_tiled, the same forward algorithm as a PyTorch loop, which runs from caches and pays "
        "Python overhead per tile; in train mode autograd records every tile's intermediates for "
        "its backward, so neither its time nor its memory says anything about a GPU's. What a CPU "
        "run does show: the values, the gradients and the packing are right."
    ),
    params=[
        Param("batch", int, 2, "sequences per call; varlen: documents packed into one stream", min=1),
        *head_params(heads=4),
        Param(
            "seq_len",
            int,
            256,
            "keys per sequence (and queries, unless seq_len_q); varlen: the longest "
            "document, each document's length drawn uniformly from 1..seq_len",
            min=1,
        ),
        Param(
            "seq_len_q",
            int,
            0,
            "queries per sequence, 0: seq_len; fewer than the keys is a chunk of "
            "queries at the end of a KV cache (chunked prefill, several tokens decoded at once); varlen: "
            "each document's query length drawn from 1..seq_len_q",
            min=0,
        ),
        Param("head_dim", int, 64, "channels per head of q and k", choices=HEAD_DIMS),
        Param(
            "head_dim_v",
            int,
            0,
            "channels per head of v and the output; 0: head_dim (DeepSeek's MLA prefill: head_dim 192, head_dim_v 128)",
            choices=[0, *HEAD_DIMS],
        ),
        Param("dtype", str, "float32", "dtype of q, k, v and the output", choices=["float32", "float16", "bfloat16"]),
        Param("causal", bool, False, "each query sees only keys up to its own position"),
        Param(
            "window",
            int,
            0,
            "sliding-window attention (Mistral, Gemma 2/3, gpt-oss; as transformers and vLLM): query i "
            "sees key j iff 0 <= i' - j < window, i' its position aligned as causal_align says; 0: none; "
            "needs causal; the tiled variants never load the key tiles outside every row's window",
            min=0,
            omit_default_from_id=True,
        ),
        Param(
            "chunk",
            int,
            0,
            "Llama 4's chunked local attention: query i sees key j iff j <= i' and i' // chunk == "
            "j // chunk (i' as for window); 0: none; needs causal; not with window",
            min=0,
            omit_default_from_id=True,
        ),
        Param(
            "causal_align",
            str,
            "bottom_right",
            "where the causal diagonal sits when queries and keys "
            "differ in number: bottom_right (flash-attn >= 2.1 and serving engines: query i sees keys "
            "j <= i + seq_len - seq_len_q) or top_left (SDPA's is_causal: j <= i); the same for equal lengths",
            choices=list(CAUSAL_ALIGNS),
        ),
        Param(
            "mode",
            str,
            "forward",
            "forward, or train: forward and the backward of a random upstream "
            "gradient timed together as one call (peak memory of both), dq, dk, dv checked too",
            choices=list(MODES),
        ),
        Param(
            "varlen",
            bool,
            False,
            "documents of random lengths packed into one stream (flash-attn's "
            "varlen layout, cu_seqlens), never attending across documents; the eager baseline pads them "
            "to the longest with a mask",
        ),
        # Fixed tiles let a short sequence cross several query and key tiles (the rescaling, the
        # causal skip and the ragged edges), where the default tiles would hold it whole.
        Param(
            "block_m",
            int,
            0,
            "query rows per tile of the tiled forward variants, a power of two >= 16 "
            "(0: the kernel's autotuned tiles, the loop's 1024); train mode's Triton backward tunes its own",
            min=0,
        ),
        Param("block_n", int, 0, "keys per tile, as block_m (0: autotuned, the loop's 512)", min=0),
    ],
    plots=[
        Plot(
            "Attention throughput (TFLOP/s) against sequence length",
            y="tflops",
            x="seq_len",
            panels=("head_dim", "causal"),
            ylabel="TFLOP/s",
        ),
        Plot(
            "Peak memory of one call (MiB) against sequence length: the scores grow as N^2",
            y="peak_memory",
            x="seq_len",
            panels=("head_dim", "causal"),
            ylabel="peak MiB",
            scale=2**-20,
            log_y=True,
        ),
    ],
    benchmarks=[
        *(
            Bench(name, {"batch": 1, "heads": 4, "seq_len": 512, "causal": causal, "mode": mode})
            for name, causal, mode in (
                ("full", False, "forward"),
                ("causal", True, "forward"),
                ("causal-train", True, "train"),
            )
        ),
        # gpt-oss's sliding window at the same length: the tiled variants load a quarter of the tiles
        Bench("window-128", {"batch": 1, "heads": 4, "seq_len": 512, "causal": True, "window": 128}),
    ],
)


validate = TECHNIQUE.validate(block_problems)
build = TECHNIQUE.build(build_workload)

# -- the pair -----------------------------------------------------------------------------------

eager = TECHNIQUE.variant("eager", role="baseline")(attend.eager)
triton_kernel = TECHNIQUE.variant(
    "triton", role="optimized", unavailable=attend.triton_problem, checked_only=interpreter_note(KERNEL[0])
)(attend.triton_kernel)
torch_tiled = TECHNIQUE.variant("torch_tiled", role="optimized")(attend.torch_tiled)

# -- peers --------------------------------------------------------------------------------------

run_sdpa = TECHNIQUE.variant("sdpa", unavailable=attend.sdpa_unavailable)(attend.run_sdpa)
for _name, _backend in attend.PINNED_BACKENDS:
    TECHNIQUE.variant(
        _name,
        description=f"torch SDPA pinned to the {_backend.name} backend "
        "(repeats k/v heads when that backend has no GQA path); padded batches only",
        unavailable=attend.pinned_unavailable(_backend),
    )(attend.pinned_sdpa(_name, _backend))
run_flash_attn = TECHNIQUE.variant("flash_attn", unavailable=attend.flash_attn_unavailable)(attend.run_flash_attn)

# -- correctness and figures ----------------------------------------------------------------------

reference = TECHNIQUE.reference(float64_reference)
check = TECHNIQUE.check(output_check)
metrics = TECHNIQUE.metrics(attention_metrics)
