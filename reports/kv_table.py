"""Terminal rendering of a KV-cache plan (``gpubench kv-cache``)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpubench.kvmath import KVPlan

POLICY_TEXT = {
    "paged": "paged, window-aware",
    "paged_full": "paged, full length",
    "contiguous": "contiguous, max_len",
    "contiguous_ring": "contiguous, window ring",
}
POLICY_LEGEND = (
    "paged: blocks on demand (window-aware: sliding layers keep only blocks inside their window, as "
    "vLLM's hybrid allocator; full length: every layer keeps every token). contiguous: every layer "
    "reserves max_len slots per sequence up front (window ring: sliding layers reserve only a ring "
    "of window slots)."
)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.3g} {unit}" if unit != "B" else f"{sign}{n:.0f} B"
        n /= 1024
    return f"{sign}{n:.3g} TiB"


def memory_bar(plan: KVPlan, width: int = 60) -> Text:
    """One GPU's memory: weights, KV for the batch (or for as many sequences as fit), free."""
    total = plan.gpu_memory_bytes
    kv = plan.policies["paged"].batch_bytes
    if kv is None:
        kv = plan.policies["paged"].max_sequences * plan.policies["paged"].bytes_per_sequence
    weights = min(plan.weight_bytes_per_gpu, total)
    kv = max(0, min(kv, total - weights))
    reserved = int(total * (1 - plan.utilization_target))
    free = max(0, total - weights - kv)
    # Distinct characters as well as colours, so the bar reads in a plain log too.
    parts = [("weights", weights, "█", "bold blue"), ("KV (paged)", kv, "▓", "bold green"),
             ("free", max(0, free - reserved), "░", "white"), ("headroom", min(free, reserved), "·", "dim")]
    bar = Text("[")
    for _, size, char, style in parts:
        bar.append(char * round(width * size / total), style=style)
    bar.append("] ")
    bar.append("  ".join(f"{char} {name} {human_bytes(size)}" for name, size, char, _ in parts))
    return bar


def render(plan: KVPlan, console: Console) -> None:
    p = plan
    window_text = (f"; {p.sliding_layers} of {p.num_layers} layers slide (window "
                   f"{sorted({w for w in p.windows if w})})" if p.sliding_layers else "")
    per_token = (f"one latent of {p.head_dim} values ({p.head_dim_source}) per token per layer"
                 if p.attention == "MLA" else
                 f"{p.kv_heads_per_gpu} KV head(s) per GPU x head_dim {p.head_dim} ({p.head_dim_source})")
    console.print(Text.assemble((p.model, "bold"), f": {p.attention}, {p.num_layers} layers, {per_token}{window_text}"))
    console.print(f"KV dtype {p.kv_dtype} (scale overhead: {p.kv_overhead}); block size {p.block_size}; "
                  f"tensor parallel {p.tp}" + (f" ({p.tp_note})" if p.tp_note else ""))
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    table.add_row("per token per layer", human_bytes(p.bytes_per_token_per_layer), "one GPU")
    table.add_row("per token, all layers", human_bytes(p.bytes_per_token),
                  "one GPU, every layer holding the token")
    table.add_row("naive 2 x layers x hidden x bytes", human_bytes(p.naive_bytes_per_token),
                  f"{p.naive_vs_exact:.2f}x the exact {human_bytes(p.exact_bytes_per_token_tp1)} per token "
                  f"(whole model, one GPU)" + (" - naive is off" if abs(p.naive_vs_exact - 1) > 0.005 else ""))
    table.add_row("GPU memory x utilization", human_bytes(p.gpu_memory_bytes * p.utilization_target),
                  f"{human_bytes(p.gpu_memory_bytes)} x {p.utilization_target:g}")
    table.add_row("weights per GPU", human_bytes(p.weight_bytes_per_gpu), p.weight_note)
    if p.overhead_bytes:
        table.add_row("other overhead", human_bytes(p.overhead_bytes), "activations etc. (--overhead)")
    table.add_row("free for KV per GPU", human_bytes(p.free_bytes),
                  "the weights do not fit" if p.free_bytes < 0 else "")
    table.add_row("max tokens (paged)", f"{p.max_tokens:,}", "every layer holding every token")
    console.print(table)
    policies = Table(title=f"sequences of {p.seq_len:,} tokens (max_len {p.max_len:,})"
                     + (f", batch {p.batch}" if p.batch else ""), title_justify="left")
    for col, justify in (("allocator", "left"), ("per sequence", "right"), ("batch total", "right"),
                         ("max sequences", "right"), ("utilization", "right")):
        policies.add_column(col, justify=justify)
    for name, pp in p.policies.items():
        policies.add_row(POLICY_TEXT[name], human_bytes(pp.bytes_per_sequence), human_bytes(pp.batch_bytes),
                         f"{pp.max_sequences:,}", f"{100 * pp.utilization:.1f}%")
    console.print(policies)
    console.print(POLICY_LEGEND, style="dim")
    if p.batch and p.batch > p.policies["paged"].max_sequences:
        console.print(f"[bold red]the batch of {p.batch} does not fit[/]: at most "
                      f"{p.policies['paged'].max_sequences} sequences with paged allocation")
    console.print(memory_bar(p))
