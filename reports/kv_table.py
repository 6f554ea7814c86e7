"""Terminal rendering of a KV-cache plan (``gpubench kv-cache``)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from gpubench.lib.kvmath import KVPlan, human_bytes
from gpubench.reports.terminal import fit_fields, print_rows

__all__ = ["human_bytes", "memory_bar", "render"]

POLICY_TEXT = {
    "paged": "paged, window-aware",
    "paged_full": "paged, full length",
    "contiguous": "contiguous, max_len",
    "contiguous_ring": "contiguous, window ring",
}
POLICY_LEGEND = (
    "paged: vLLM's block pool, blocks on demand, one null block kept back (window-aware: as vLLM's hybrid "
    "KV-cache manager, sliding and chunked layers keep only the blocks they still read, in KV-cache groups of "
    "equal size, padding included; full length: every layer keeps every token, as "
    "--disable-hybrid-kv-cache-manager). contiguous: every layer reserves max_len slots per sequence up front "
    "(window ring: sliding and chunked layers reserve only a ring of window or chunk slots)."
)


def _bar_parts(plan: KVPlan, width: int) -> tuple[Text, list[str], str]:
    """The memory bar's cells, its labels (``█ weights 15 GiB``) and a warning ("" for none)."""
    total = plan.gpu_memory_bytes
    paged = plan.policies["paged"]
    kv = paged.batch_bytes if paged.batch_bytes is not None else paged.max_sequences * paged.bytes_per_sequence
    weights = plan.weight_bytes_per_gpu + plan.kv_scale_bytes
    limit = int(total * plan.utilization_target)
    used = weights + plan.overhead_bytes + kv
    parts = [("weights", weights, "█", "bold blue")]
    if plan.overhead_bytes:
        parts.append(("other", plan.overhead_bytes, "▒", "magenta"))
    # Distinct characters as well as colours, so the bar reads in a plain log too.
    parts += [
        ("KV (paged)", kv, "▓", "bold green"),
        ("free", max(0, limit - used), "░", "white"),
        ("headroom", max(0, total - max(used, limit)), "·", "dim"),
    ]
    bar, drawn = Text("["), 0
    for _, size, char, style in parts:
        cells = min(width - drawn, round(width * size / total)) if total else 0
        bar.append(char * cells, style=style)
        drawn += cells
    bar.append("]")
    warning = ""
    if used > total:
        warning = (
            f"(over the {human_bytes(total)} GPU by {human_bytes(used - total)}: the bar is clipped at the GPU's size)"
        )
    elif used > limit:
        warning = f"(over GPU memory x utilization by {human_bytes(used - limit)})"
    return bar, [f"{char} {name} {human_bytes(size)}" for name, size, char, _ in parts], warning


def memory_bar(plan: KVPlan, width: int = 60) -> Text:
    """One GPU's memory: weights (K/V scales included), other overhead, KV for the batch (or for as
    many sequences as fit), free, and the headroom above the utilization target. The labels are
    always the plan's true sizes; where they add up to more than the GPU, the bar is clipped at
    the GPU's size and says so."""
    bar, labels, warning = _bar_parts(plan, width)
    bar.append(" " + "  ".join(labels))
    if warning:
        bar.append("  " + warning, style="bold red")
    return bar


def print_memory_bar(plan: KVPlan, console: Console) -> None:
    """The bar on one line where it fits (always in a log), else the bar, then its labels and
    warning as whole fields (a label never split between lines)."""
    whole = memory_bar(plan)
    if not console.is_terminal or len(whole.plain) <= console.width:
        console.print(whole, highlight=False, soft_wrap=not console.is_terminal)
        return
    bar, labels, warning = _bar_parts(plan, min(60, max(10, console.width - 2)))
    console.print(bar, highlight=False)
    for line in fit_fields(labels, console.width, indent=""):
        console.print(line, markup=False, highlight=False)
    if warning:
        console.print(warning, style="bold red", markup=False, highlight=False)


def render(plan: KVPlan, console: Console) -> None:
    p = plan
    window_text = (
        f"; {p.sliding_layers} of {p.num_layers} layers slide (window {sorted({w for w in p.windows if w})})"
        if p.sliding_layers
        else ""
    )
    window_text += (
        f"; {p.chunked_layers} of {p.num_layers} layers use chunked local attention (chunk "
        f"{sorted({c for c in p.chunks if c})})"
        if p.chunked_layers
        else ""
    )
    per_token = (
        f"one latent of {p.head_dim} values ({p.head_dim_source}) per token per layer"
        if p.attention == "MLA"
        else f"{p.kv_heads_per_gpu} KV head(s) per GPU x head_dim {p.head_dim} ({p.head_dim_source})"
    )
    log = not console.is_terminal  # a log: each line whole, never wrapped at a width
    console.print(
        Text.assemble((p.model, "bold"), f": {p.attention}, {p.num_layers} layers, {per_token}{window_text}"),
        soft_wrap=log,
    )
    console.print(
        f"KV dtype {p.kv_dtype} (scale overhead: {p.kv_overhead}); tensor parallel {p.tp}"
        + (f" ({p.tp_note})" if p.tp_note else ""),
        markup=False,
        soft_wrap=log,
    )
    console.print(f"block size {p.block_size} tokens: {p.block_size_note}", markup=False, soft_wrap=log)
    if p.long_note:
        console.print(Text(p.long_note, style="yellow"), soft_wrap=log)
    rows = [
        ("per token per layer", human_bytes(p.bytes_per_token_per_layer), "one GPU"),
        ("per token, all layers", human_bytes(p.bytes_per_token), "one GPU, every layer holding the token"),
        (
            "naive 2 x layers x hidden x bytes",
            human_bytes(p.naive_bytes_per_token),
            f"{p.naive_vs_exact:.2f}x the exact {human_bytes(p.exact_bytes_per_token_tp1)} per token "
            f"(whole model, one GPU)" + (" - naive is off" if abs(p.naive_vs_exact - 1) > 0.005 else ""),
        ),
        (
            "GPU memory x utilization",
            human_bytes(p.gpu_memory_bytes * p.utilization_target),
            f"{human_bytes(p.gpu_memory_bytes)} x {p.utilization_target:g}",
        ),
        ("weights per GPU", human_bytes(p.weight_bytes_per_gpu), p.weight_note),
    ]
    if p.kv_scale_bytes:
        rows.append(
            (
                "K/V scales per GPU",
                human_bytes(p.kv_scale_bytes),
                "per-tensor fp32 scales of each layer: model buffers, counted with the weights as vLLM "
                "does (not taken from the KV block pool): "
                + (
                    "inside the given weight memory"
                    if p.kv_scales_in_weights
                    else "added to the weights counted from the config"
                ),
            )
        )
    if p.overhead_bytes:
        rows.append(("other overhead", human_bytes(p.overhead_bytes), "activations etc. (--overhead)"))
    rows.append(
        ("free for KV per GPU", human_bytes(p.free_bytes), "the model does not fit" if p.free_bytes < 0 else "")
    )
    groups = (
        f"{p.vllm_num_blocks:,} blocks // {p.kv_cache_groups} KV-cache groups x {p.block_size}"
        if p.kv_cache_groups > 1
        else f"{p.vllm_num_blocks:,} blocks x {p.block_size}"
    )
    rows.append(
        (
            "vLLM's GPU KV cache size",
            f"{p.max_tokens:,} tokens",
            f"{groups}, as its start-up log (blocks: free // (block of one layer x {p.kv_group_size} layers))",
        )
    )
    if p.padding_layers:
        rows.append(
            (
                "padding layers",
                str(p.padding_layers),
                f"vLLM groups the layers {p.kv_group_size} to a group and pads the last group of a kind: the "
                f"memory of {p.num_layers + p.padding_layers} layers for {p.num_layers}",
            )
        )
    print_rows(console, None, rows, right=(1,))
    print_rows(
        console,
        ("allocator", "per sequence", "batch total", "max sequences", "utilization"),
        [
            (
                POLICY_TEXT[name],
                human_bytes(pp.bytes_per_sequence),
                human_bytes(pp.batch_bytes),
                f"{pp.max_sequences:,}",
                f"{100 * pp.utilization:.1f}%",
            )
            for name, pp in p.policies.items()
        ],
        right=(1, 2, 3, 4),
        title=f"sequences of {p.seq_len:,} tokens (max_len {p.max_len:,})"
        + (f", batch {p.batch:,}" if p.batch else ""),
    )
    console.print(POLICY_LEGEND, style="dim", soft_wrap=not console.is_terminal)
    render_concurrency(p, console)
    print_memory_bar(p, console)
    if not p.fits:
        console.print(Text(p.fit_problem, style="bold red"), soft_wrap=not console.is_terminal)


def render_concurrency(p: KVPlan, console: Console) -> None:
    """Two named figures for 'how many sequences': what a decoding batch holds, and what vLLM's
    start-up log reports (a worst case per request)."""
    sliding = (
        f"; sliding layers ceil(min(window - 1 + {p.max_num_batched_tokens:,}, max_len) / B) + 1"
        if p.sliding_layers and p.hybrid
        else ""
    )
    sliding += (
        f"; chunked layers ceil(min(chunk + {p.max_num_batched_tokens:,}, max_len) / B)"
        if p.chunked_layers and p.hybrid
        else ""
    )
    rows = [
        (
            "steady-state decode",
            f"{p.policies['paged'].max_sequences:,}",
            f"sequences of {p.seq_len:,} tokens, all decoding"
            + ("; a sliding layer holds only its window's blocks" if p.sliding_layers and p.hybrid else "")
            + ("; a chunked layer only its chunk's" if p.chunked_layers and p.hybrid else "")
            + "; one pool block is vLLM's null block",
        ),
        (
            "vLLM start-up log's max concurrency",
            f"{p.vllm_max_concurrency:,.2f}x",
            f"for {p.max_len:,} tokens per request (--max-len, vLLM's --max-model-len): "
            f"{p.vllm_blocks_per_request:,} blocks of one layer, {human_bytes(p.vllm_bytes_per_request)} "
            f"per request (full layers ceil(max_len / B){sliding})",
        ),
    ]
    print_rows(console, None, rows, right=(1,), title="max concurrency, two definitions (paged)")
    notes = []
    if not p.hybrid:
        notes.append(
            "Hybrid KV-cache manager disabled (--disable-hybrid-kv-cache-manager): every layer keeps every "
            "token, as vLLM then does."
        )
    elif p.sliding_layers or p.chunked_layers:
        notes.append(
            f"During a long prefill a sliding (or chunked) layer holds the whole prefill chunk besides its "
            f"window (or chunk): vLLM "
            f"charges each request that worst case, with the chunk max_num_batched_tokens = "
            f"{p.max_num_batched_tokens:,} ({p.batched_tokens_note}; --max-num-batched-tokens), so its "
            "log shows fewer sequences than a decoding batch holds."
        )
    if p.free_bytes >= 0 and p.vllm_max_concurrency < 1:
        notes.append(
            f"vLLM would refuse to start: one request of max_len {p.max_len:,} tokens needs "
            f"{human_bytes(p.vllm_bytes_per_request)} of KV; lower --max-len (vLLM's --max-model-len)."
        )
    notes.append(
        "To compare with a vLLM log, pass --max-len, --max-num-batched-tokens, --block-size and "
        "--gpu-memory / --utilization as the server ran."
    )
    console.print(" ".join(notes), style="dim", soft_wrap=not console.is_terminal)
