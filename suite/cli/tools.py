"""The tools beside the benchmark: ``gpubench kv-cache`` (KV-cache memory and capacity, as vLLM
plans it), ``gpubench serve`` (a request trace through the serving engines, vLLM-style metrics) and
``gpubench prepare`` (what a run's first cases would otherwise build inside them)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpubench.cli.console import make_console
from gpubench.errors import BadInput

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str, option: str, default_unit: str = "b") -> int:
    """'80' (in ``default_unit``), '80GiB', '141GB', '13.5G' -> bytes; BadInput otherwise."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = (m.group(2) or default_unit).lower() if m else None
    if not m or unit not in _UNITS:
        raise BadInput(
            f"{option}: {text!r} is not a size; allowed: a number with an optional unit "
            f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 80GiB."
        )
    return int(float(m.group(1)) * _UNITS[unit])


IGNORE_FIELD_HELP = (
    "A config.json field to accept unread (repeatable). The reader refuses fields it does not know "
    "for the model's family; name one here only when it changes nothing measured."
)


def ignore_field_option(f: Any) -> Any:
    """The ``--ignore-field NAME`` option (repeatable; a tuple of names as ``ignore_fields``) of
    every command that reads a model config: pass the tuple to
    :func:`gpubench.models.config.load_model`'s ``ignore_fields``."""
    return click.option("--ignore-field", "ignore_fields", multiple=True, metavar="NAME", help=IGNORE_FIELD_HELP)(f)


@click.command(name="kv-cache")
@click.option("--model", "-m", metavar="PRESET", help="A built-in preset (see --list).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="A Hugging Face config.json.")
@ignore_field_option
@click.option("--list", "list_presets", is_flag=True, help="List the presets and exit.")
@click.option("--seq-len", default=4096, show_default=True, type=int, help="Tokens per sequence.")
@click.option(
    "--batch", default="fit", show_default=True, metavar="N|fit", help="Sequences, or 'fit' for as many as fit."
)
@click.option(
    "--kv-dtype",
    default="bf16",
    show_default=True,
    metavar="DTYPE",
    help="fp32, bf16, fp16, fp8, int8, int4, mxfp4, nvfp4 (scale overheads are shown).",
)
@click.option(
    "--block-size",
    default=None,
    type=int,
    help="Tokens per paged block. Default: vLLM's on CUDA, 16; 64 for MLA models (DeepSeek-V2/V3), "
    "which vLLM's FlashMLA backend forces (its CUTLASS MLA backend, on Blackwell: 128).",
)
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel GPUs.")
@click.option(
    "--gpu-memory", metavar="SIZE", help="Per GPU, e.g. 80GiB (a bare number is GiB). Default: this GPU's, else 80GiB."
)
@click.option(
    "--utilization", default=0.9, show_default=True, type=float, help="Fraction of GPU memory the engine may use."
)
@click.option(
    "--weight-bytes", metavar="SIZE", help="Whole-model weight storage; default: from the config's parameter count."
)
@click.option(
    "--weight-dtype",
    metavar="DTYPE",
    help="Weight dtype for that count (default: the checkpoint's, quantization included).",
)
@click.option(
    "--max-len",
    type=int,
    help="The longest a sequence may be, as vLLM's --max-model-len: what contiguous "
    "allocation reserves and what vLLM's start-up concurrency is for (default: the model's max positions).",
)
@click.option(
    "--allow-long",
    is_flag=True,
    help="Allow --seq-len / --max-len beyond the model's "
    "max_position_embeddings (as vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).",
)
@click.option(
    "--max-num-batched-tokens",
    type=int,
    default=None,
    help="vLLM's prefill chunk, for its start-up max concurrency with sliding-window layers. Default: "
    "vllm serve's, 8192 on a GPU of >= 70 GiB other than an A100, else 2048.",
)
@click.option(
    "--overhead", metavar="SIZE", default="0", help="Other memory per GPU (activations, CUDA graphs), e.g. 4GiB."
)
@click.option(
    "--disable-hybrid-kv-cache-manager",
    "no_hybrid",
    is_flag=True,
    help="As vLLM's flag: every layer keeps every token (sliding and chunked layers included).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def kv_cache(
    model,
    config_path,
    ignore_fields,
    list_presets,
    seq_len,
    batch,
    kv_dtype,
    block_size,
    tp,
    gpu_memory,
    utilization,
    weight_bytes,
    weight_dtype,
    max_len,
    allow_long,
    max_num_batched_tokens,
    overhead,
    no_hybrid,
    as_json,
) -> None:
    """KV-cache memory per token, per sequence and per GPU; how many sequences fit.

    Exit codes: 0 it fits; 1 it does not fit (the weights on one GPU, a single sequence, the
    requested --batch, or one request of --max-len, which vLLM refuses to start with: a result,
    stated with what to try); 2 bad input (an invalid option or config,
    a length beyond the model's positions without --allow-long)."""
    import torch  # here, not at the top: gpubench --help and the reading commands import no torch

    from gpubench.lib import kvmath
    from gpubench.models import config as model_config
    from gpubench.models import params as model_params
    from gpubench.reports import kv_table

    if list_presets:
        _list_presets(as_json)
        return
    if (model is None) == (config_path is None):
        raise BadInput(
            "kv-cache: give exactly one of --model PRESET or --config path/to/config.json "
            f"(presets: {', '.join(model_config.preset_names())})."
        )
    if model:
        cfg = model_config.load_preset(model, ignore_fields)
    else:
        cfg = model_config.load_config_file(config_path, ignore_fields)
    kv_fmt = kvmath.kv_format(kv_dtype)
    if batch == "fit":
        n_batch = None
    else:
        try:
            n_batch = int(batch)
        except ValueError:
            raise BadInput(f"--batch: {batch!r} is not valid; allowed: a positive integer or 'fit'.") from None
    device_name = ""
    if gpu_memory is not None:
        gpu_bytes = parse_size(gpu_memory, "--gpu-memory", default_unit="gib")
        memory_note = ""
    elif torch.cuda.is_available():
        gpu_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        device_name = torch.cuda.get_device_name()
        memory_note = f" ({device_name})"
    else:
        gpu_bytes, memory_note = 80 * 2**30, " (assumed: no GPU here; pass --gpu-memory)"
    if weight_dtype is not None and model_params.normalize_dtype(weight_dtype) not in model_config.DTYPE_BYTES:
        raise BadInput(
            f"--weight-dtype: {weight_dtype!r} is not supported; allowed: "
            f"{', '.join(model_config.DTYPE_BYTES)} (and aliases fp32, fp16, bf16)."
        )
    if weight_bytes is not None:
        wb, wnote = parse_size(weight_bytes, "--weight-bytes"), "given (--weight-bytes)"
    else:
        computed = model_params.weight_bytes(cfg, weight_dtype)
        wb, wnote = computed.bytes, computed.note
    plan = kvmath.plan(
        cfg,
        seq_len=seq_len,
        batch=n_batch,
        kv_dtype=kv_fmt.name,
        block_size=block_size,
        tp=tp,
        gpu_memory_bytes=gpu_bytes,
        utilization=utilization,
        weight_bytes=wb,
        weight_note=wnote,
        max_len=max_len,
        allow_long=allow_long,
        max_num_batched_tokens=max_num_batched_tokens,
        device_name=device_name,
        overhead_bytes=parse_size(overhead, "--overhead", default_unit="gib"),
        kv_scales_in_weights=weight_bytes is not None,
        hybrid=not no_hybrid,
    )
    read_note = {"config_defaults_used": list(cfg.defaults_used), "ignored_fields": list(cfg.ignored_fields)}
    if as_json:
        click.echo(json.dumps({**plan.to_dict(), "gpu_memory_note": memory_note.strip(" ()"), **read_note}, indent=2))
    else:
        out = make_console()
        if memory_note:
            out.print(f"GPU memory {gpu_bytes / 2**30:.0f} GiB{memory_note}")
        if cfg.defaults_used:  # never a silent default: each one the config left to transformers
            out.print(
                f"{cfg.family} config: absent fields read at defaults (transformers' unless said): "
                + ", ".join(cfg.defaults_used),
                markup=False,
                soft_wrap=not out.is_terminal,
            )
        if cfg.ignored_fields:
            out.print(f"fields accepted unread (--ignore-field): {', '.join(cfg.ignored_fields)}", markup=False)
        kv_table.render(plan, out)
    refused = _vllm_refuses(plan)
    if not plan.fits or refused:  # a result, not bad input: exit 1 (see the docstring)
        if as_json:
            click.echo(plan.fit_problem or refused, err=True)
        elif refused:
            make_console().print(refused, style="bold red", markup=False, soft_wrap=True)
        sys.exit(1)


def _vllm_refuses(plan: Any) -> str:
    """Why vLLM would not start with this plan although the batch fits (one request of --max-len
    needs more KV than there is: its start-up check), or ''."""
    if not plan.fits or plan.free_bytes < 0 or plan.vllm_max_concurrency >= 1:
        return ""
    from gpubench.lib.kvmath import human_bytes

    return (
        f"vLLM would refuse to start: one request of --max-len {plan.max_len:,} tokens needs "
        f"{human_bytes(plan.vllm_bytes_per_request)} of KV, and {human_bytes(max(0, plan.free_bytes))} is free for "
        f"KV per GPU; lower --max-len (vLLM's --max-model-len) or add GPUs (--tp)."
    )


def _list_presets(as_json: bool) -> None:
    from gpubench.models import config as model_config
    from gpubench.models import params as model_params

    rows: list[dict[str, Any]] = []  # (printed as JSON, or as the table's strings below)
    for name in model_config.preset_names():
        raw = model_config.preset_raw(name)
        cfg = model_config.from_dict(raw, name, f"preset {name}")
        rows.append(
            {
                "preset": name,
                "family": cfg.family,
                "model_type": cfg.model_type,
                "attention": cfg.attention,
                "layers": cfg.num_layers,
                "kv_heads": cfg.num_kv_heads if not cfg.mla else None,
                "head_dim": cfg.head_dim if not cfg.mla else cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim,
                "sliding_layers": cfg.sliding_layers,
                "params": model_params.count_parameters(cfg).total,
                "published_params": raw.get("_published_params"),
                "source": raw.get("_source"),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from gpubench.reports.terminal import print_rows

    print_rows(
        make_console(),
        (
            "preset",
            "family",
            "attention",
            "layers",
            "KV heads",
            "KV vector",
            "sliding layers",
            "params (counted)",
            "published",
        ),
        [
            (
                r["preset"],
                r["family"],
                r["attention"],
                str(r["layers"]),
                str(r["kv_heads"] or "-"),
                str(r["head_dim"]),
                str(r["sliding_layers"]),
                f"{r['params'] / 1e9:.2f}B",
                f"{r['published_params'] / 1e9:.2f}B" if r["published_params"] else "-",
            )
            for r in rows
        ],
        right=(3, 4, 5, 6, 7, 8),
        title="presets (published configs)",
    )


@click.command(name="serve")
@click.option(
    "--model",
    "-m",
    default="tiny",
    show_default=True,
    metavar="SIZE|PRESET|CONFIG|DIR",
    help="A built-in size (tiny, small, 100m, 1b; seeded random weights), a preset or a config.json "
    "(seeded random weights at that model's shapes: a Llama-style stand-in), or a local Hugging Face "
    "Llama-style checkpoint directory (needs transformers: pip install 'gpubench[hf]').",
)
@click.option(
    "--layers",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Decoder layers run: 0 keeps the model's own; a built-in size gets that many, a preset, "
    "config or checkpoint its first N (a large model's shapes on a small device).",
)
@click.option(
    "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16", "float64"])
)
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False),
    help="JSONL trace: {arrival_s, prompt_len | prompt, output_len} per line (else a synthetic one).",
)
@click.option("--requests", default=50, show_default=True, type=int, help="Synthetic trace: requests.")
@click.option(
    "--arrival",
    default="poisson:40",
    show_default=True,
    metavar="PROCESS",
    help="Synthetic trace: poisson:RATE, gamma:RATE:BURSTINESS or all.",
)
@click.option(
    "--prompt-len",
    default="uniform:16:64",
    show_default=True,
    metavar="DIST",
    help="Synthetic trace: fixed:N, uniform:LO:HI, exp:MEAN:CAP, lognormal:MEAN:SIGMA:CAP.",
)
@click.option(
    "--output-len", default="exp:48:160", show_default=True, metavar="DIST", help="Synthetic trace: as --prompt-len."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the weights and the synthetic trace.")
@click.option(
    "--engine",
    "engines",
    multiple=True,
    default=["static+contiguous", "continuous+paged"],
    show_default=True,
    metavar="SCHEDULER+KV",
    help="SCHEDULER+KV, repeatable: static|continuous + contiguous|paged.",
)
@click.option("--kv-budget", default="2MiB", show_default=True, metavar="SIZE", help="KV-cache memory of every engine.")
@click.option("--max-len", default=256, show_default=True, type=int, help="Longest request (prompt + output).")
@click.option("--max-batch", default=16, show_default=True, type=int, help="Most requests decoding at once.")
@click.option("--block-size", default=16, show_default=True, type=click.Choice(["8", "16", "32"]))
@click.option(
    "--batch-timeout-ms", default=50.0, show_default=True, type=float, help="Static batching's wait for a full batch."
)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0: greedy; > 0: sampled.")
@click.option(
    "--no-wait", is_flag=True, help="Every request at time 0 (offline throughput) instead of at its arrival time."
)
@click.option("--slo-ttft-ms", default=1000.0, show_default=True, type=float, help="Goodput: TTFT target.")
@click.option("--slo-tpot-ms", default=100.0, show_default=True, type=float, help="Goodput: TPOT target.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def serve(
    model,
    layers,
    dtype,
    device,
    trace_file,
    requests,
    arrival,
    prompt_len,
    output_len,
    seed,
    engines,
    kv_budget,
    max_len,
    max_batch,
    block_size,
    batch_timeout_ms,
    temperature,
    no_wait,
    slo_ttft_ms,
    slo_tpot_ms,
    as_json,
):
    """Serve a request trace through one or more engines and print vLLM-style serving metrics
    (throughput, TTFT / TPOT / ITL / end-to-end percentiles, goodput, KV utilization, concurrency)."""
    from gpubench.measure import env as envmod
    from gpubench.models import stand_in
    from gpubench.models.llama import model_from
    from gpubench.serving.bench import DTYPES
    from gpubench.serving.config import KV_LAYOUTS, SCHEDULERS, EngineConfig
    from gpubench.serving.engine import Engine
    from gpubench.serving.metrics import serving_metrics
    from gpubench.serving.traces import TraceSpec, generate, parse_arrival, parse_length

    pairs = []
    for text in engines:
        scheduler, _, kv = text.partition("+")
        if scheduler not in SCHEDULERS or kv not in KV_LAYOUTS:
            raise BadInput(
                f"--engine: {text!r} is not valid; allowed: SCHEDULER+KV with SCHEDULER one of "
                f"{list(SCHEDULERS)} and KV one of {list(KV_LAYOUTS)}, e.g. continuous+paged."
            )
        pairs.append((scheduler, kv))
    for option, value, parse in (
        ("--arrival", arrival, parse_arrival),
        ("--prompt-len", prompt_len, parse_length),
        ("--output-len", output_len, parse_length),
    ):
        try:
            parse(value)
        except ValueError as exc:
            raise BadInput(f"{option}: {exc}.") from None
    for option, value in (("--requests", requests), ("--max-len", max_len), ("--max-batch", max_batch)):
        if value < 1:
            raise BadInput(f"{option}: {value} is not valid; allowed: an integer >= 1.")
    dev = envmod.resolve_device(device)
    weights = model_from(model, seed, DTYPES[dtype], dev, layers=layers)
    stand_in_note = stand_in.case_note(model, layers)
    reqs = generate(
        TraceSpec(requests, arrival, prompt_len, output_len, weights.config.vocab_size, trace_file), seed + 1
    )
    longest = max(r.prompt_len + r.output_len for r in reqs)
    if longest > max_len:
        raise BadInput(
            f"--max-len: {max_len} is below the trace's longest request ({longest} tokens, prompt + "
            f"output); allowed: a value >= {longest}."
        )
    budget = parse_size(kv_budget, "--kv-budget", default_unit="mib")
    results_by_engine = {}
    for scheduler, kv in pairs:
        cfg = EngineConfig(
            scheduler=scheduler,
            kv=kv,
            kv_budget_bytes=budget,
            block_size=int(block_size),
            max_len=max_len,
            max_batch=max_batch,
            batch_timeout_s=batch_timeout_ms / 1e3,
            temperature=temperature,
            wait=not no_wait,
        )
        try:
            run = Engine(weights, cfg).run(reqs)
        except ValueError as exc:  # a budget that holds no slab / block
            raise BadInput(f"--kv-budget: {exc}; allowed: a larger size.") from None
        m = serving_metrics(run, slo_ttft_ms, slo_tpot_ms)
        m["accounting_problems"] = run.accounting_problems
        results_by_engine[f"{scheduler}+{kv}"] = m
    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": model,
                    "layers": weights.config.num_layers,
                    "params": weights.config.num_params(),
                    **({"model_note": stand_in_note} if stand_in_note else {}),
                    "device": str(dev),
                    "engines": results_by_engine,
                },
                indent=2,
            )
        )
        return
    from gpubench.reports.terminal import print_rows

    out = make_console()
    rows = [
        ("output tokens/s", "output_tokens_per_s", "{:.0f}"),
        ("requests/s", "request_throughput", "{:.2f}"),
        ("goodput requests/s", "goodput_requests_per_s", "{:.2f}"),
    ]
    rows += [
        (f"{stat} {name.upper()} ms", f"{stat}_{name}_ms", "{:.1f}")
        for name in ("ttft", "tpot", "itl", "e2e")
        for stat in ("median", "p99")
    ]
    rows += [
        ("KV utilization (live/reserved)", "kv_utilization", "{:.1%}"),
        ("max concurrency", "max_concurrency", "{}"),
        ("preemptions", "preemptions", "{}"),
        ("duration s", "duration_s", "{:.2f}"),
    ]
    print_rows(
        out,
        ("metric", *results_by_engine),
        [
            (label, *[("-" if m.get(key) is None else fmt.format(m[key])) for m in results_by_engine.values()])
            for label, key, fmt in rows
        ],
        right=range(1, len(results_by_engine) + 1),
        title=f"{len(reqs)} requests, model {model} ({weights.config.num_params() / 1e6:.1f}M params, "
        f"{dtype}) on {envmod.device_label(dev)}, KV budget {budget / 2**20:.1f} MiB"
        + (", all at once" if no_wait else ""),
    )
    if stand_in_note:
        out.print(stand_in_note, markup=False, soft_wrap=not out.is_terminal)
    for name, m in results_by_engine.items():
        if m["accounting_problems"]:
            out.print(
                f"{name}: KV accounting problems: {'; '.join(m['accounting_problems'][:3])}",
                style="bold red",
                markup=False,
                soft_wrap=not out.is_terminal,
            )


@click.command(name="prepare")
@click.option(
    "--device",
    default="auto",
    show_default=True,
    metavar="auto|cpu|cuda|cuda:N",
    help="Also load what was prepared onto this device and run it once there.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def prepare(device: str, as_json: bool) -> None:
    """Build ahead of a run what its first cases would otherwise build inside them: the
    speculative-decoding model pair (trained once on the CPU, about 25 s on 2 cores, then loaded
    from the cache, $GPUBENCH_CACHE_DIR or ~/.cache/gpubench, in spec_pair/)."""
    import time

    import torch

    from gpubench.measure import env as envmod
    from gpubench.models import decode_pair, train_small

    dev = envmod.resolve_device(device)
    t0 = time.perf_counter()
    pair = train_small.trained_pair()
    built_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    decode_pair.load_pair(decode_pair.TRAINED, decode_pair.TRAINED, dev, torch.float32)
    loaded_s = time.perf_counter() - t0
    info = {
        "speculative_pair": {
            "path": pair.info["cache_path"],
            "key": pair.info["key"],
            "from_cache": pair.info["from_cache"],
            "seconds": built_s,
            "device": str(dev),
            "device_seconds": loaded_s,
        }
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    how = "loaded from the cache" if pair.info["from_cache"] else "trained and cached"
    click.echo(
        f"speculative pair: {how} in {built_s:.1f} s ({pair.info['cache_path']}); "
        f"loaded and run once on {dev} in {loaded_s:.2f} s"
    )
