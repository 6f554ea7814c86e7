"""combined_training: the three training optimizations together. One training step (forward,
backward, AdamW) of a small gpt-oss-style MoE decoder (:mod:`gpubench.models.moe_decoder`) on
packed rows, checkpointed with each layer's input offloaded to host memory. Baseline: all three
off (packed metadata rebuilt in every layer, the per-expert ``torch.where`` loop, reloads through
one staging buffer); optimized: all three on (metadata cached once per step, sort-and-group,
two staging buffers); peers: each one alone on top of the baseline, so the report shows how the
total splits.

Nothing here re-implements the single pairs: the builder, cache and attention are
:mod:`gpubench.lib.packing` and packed_metadata's :class:`PackedMetadataCache`, the MoE paths are
moe_grouping's, the offload schedules are activation_offload's (:mod:`gpubench.lib.offload` with this
model's layer). Every variant's loss and gradients are checked against the plain step (ordinary
autograd: no checkpointing, no offload, the metadata built once) of the same MoE path, and in
float32 against the other path's plain step too.
"""

from __future__ import annotations

from gpubench.contract import Bench, Headline, Param, Plot, Recorder, Technique
from gpubench.techniques.combined_training.claims import CLAIMS
from gpubench.techniques.combined_training.correctness import reference_steps, step_check
from gpubench.techniques.combined_training.figures import SPLIT, step_metrics
from gpubench.techniques.combined_training.step import Step, run_variant
from gpubench.techniques.combined_training.workload import (
    DTYPES,
    VARIANTS,
    CombinedWorkload,
    build_workload,
    workload_problems,
)

TECHNIQUE = Technique(
    name="combined_training",
    shape="training_step",
    summary="A training step of a small gpt-oss-style MoE decoder on packed sequences with offloaded "
    "checkpointing: packed-metadata caching, sort-and-group MoE and double-buffered offload all "
    "off against all on, each one alone as a peer.",
    anchor="Unsloth + NVIDIA: ~25% faster training with the three together (notably on consumer RTX GPUs)",
    claims=CLAIMS,
    gpu_specific=(
        "Two of the three wins are GPU effects that a CPU cannot show: the host syncs the baseline makes "
        "(a max_seqlen .item() per layer and per recompute, a torch.where per expert per MoE call) stall a "
        "GPU's queue but cost nothing on a CPU, and the second staging buffer hides PCIe reloads behind "
        "recompute on a copy stream, where a CPU has a memcpy on a worker thread. What a CPU ratio shows is "
        "the metadata's mask construction, the loop's per-expert op overhead and gradient assembly, and what "
        "a thread overlaps on these cores; the sync counts are the same on every device."
    ),
    headline_figures=(
        Headline("host_syncs_per_step", "host syncs per step", higher_is_better=False, replaces_time=False),
    ),
    benchmarks=[
        Bench(
            f"{n}-layers",
            {
                "layers": n,
                "hidden": 64,
                "experts": 8,
                "top_k": 2,
                "expert_dim": 64,
                "rows": 1,
                "seq_len": 256,
                "mean_doc_len": 48,
            },
        )
        for n in (2, 4)
    ],
    params=[
        Param("layers", int, 2, "decoder layers (each checkpointed, its input offloaded)", min=1),
        Param("hidden", int, 64, "model width (gpt-oss: 2880)", min=8),
        Param("heads", int, 4, "query heads", min=1),
        Param("kv_heads", int, 2, "key/value heads", min=1),
        Param(
            "head_dim",
            int,
            0,
            "channels per head, even; 0 = hidden / heads (gpt-oss: 64 of hidden 2880)",
            min=0,
            omit_default_from_id=True,
        ),
        Param("vocab", int, 256, "vocabulary size", min=2),
        Param("experts", int, 8, "experts per MoE layer (gpt-oss-20b: 32)", min=1),
        Param("top_k", int, 2, "experts per token (gpt-oss: 4)", min=1),
        Param("expert_dim", int, 64, "expert intermediate width (gpt-oss: 2880)", min=1),
        Param("rows", int, 1, "packed rows per batch", min=1),
        Param("seq_len", int, 256, "tokens per row (documents packed without padding)", min=2),
        Param(
            "mean_doc_len",
            int,
            48,
            "mean document length; lengths uniform in [1, min(2 * mean - 1, "
            "seq_len - 1)], the last one cut to fill the row",
            min=1,
        ),
        Param("dtype", str, "float32", "weights and activations", choices=list(DTYPES)),
    ],
    plots=[
        Plot(
            "Step time split (metadata builds, MoE forward and recompute, reload waits, optimizer, the rest)",
            y=SPLIT,
            x="layers",
            kind="stacked",
            ylabel="ms per step",
        ),
        Plot(
            "Host syncs per step (metadata .item() and MoE host reads) against layers",
            y="host_syncs_per_step",
            x="layers",
            ylabel="syncs per step",
        ),
    ],
)


validate = TECHNIQUE.validate(workload_problems)
build = TECHNIQUE.build(build_workload)


def _declare(name: str) -> None:
    role, _, description = VARIANTS[name]

    def fn(w: CombinedWorkload, rec: Recorder) -> Step:
        return run_variant(w, rec, name)

    fn.__name__ = fn.__qualname__ = name
    TECHNIQUE.variant(name, role=role, description=description)(fn)


for _name in VARIANTS:
    _declare(_name)

reference = TECHNIQUE.reference(reference_steps)
check = TECHNIQUE.check(step_check)
metrics = TECHNIQUE.metrics(step_metrics)
