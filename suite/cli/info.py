"""``gpubench list`` (techniques, their params and variants, the shipped scenarios) and ``gpubench
env`` (this machine, the harness's overhead, the device's measured ceilings)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.segment import Segment, Segments
from rich.table import Table

from gpubench import techniques
from gpubench.cli.console import make_console
from gpubench.errors import BadInput
from gpubench.run import scenario as scenariomod
from gpubench.techniques import catalog


@click.command(name="list")
@click.argument("modules", nargs=-1, metavar="[MODULE|FILE.py ...]")
def list_(modules: tuple[str, ...]) -> None:
    """Show every technique (params, defaults, variants) and every shipped scenario. Techniques of
    installed packages (entry point group gpubench.techniques) are listed; MODULE or FILE.py adds
    your own (validated as a scenario would). The built-ins are read from their catalogue, at once;
    a plug-in (installed or named here) is imported, and with it torch where it imports it."""
    for spec in modules:
        techniques.load(spec, Path.cwd())
    out = make_console()
    for name, reason in catalog.broken().items():
        out.print(f"[bold red]{name}[/] (entry point, not loaded): {reason}", markup=True)
    for name, tech in catalog.declared().items():
        out.print(f"[bold]{name}[/] ({tech.shape}): {tech.summary}")
        if tech.anchor:
            out.print(f"  measured against: {tech.anchor}")
        for claim in tech.claims:  # checked in every report's "published claims on this device"
            out.print(f"  claim: {claim.text} ({claim.source}; {claim.url})", markup=False)
        _print_params(out, tech.params)
        if tech.source and not tech.source.startswith("gpubench.techniques."):
            out.print(f"  from: {tech.source}")
        out.print("  variants: " + ", ".join(f"{v.name} ({v.role})" for v in tech.variants.values()))
        out.print()
    out.print("[bold]scenarios[/] (gpubench run --scenario NAME):")
    for name, path in sorted(scenariomod.shipped_scenarios().items()):
        try:
            scen = scenariomod.load(path, cross_checks=False)  # counting needs no technique code
            out.print(f"  {name:<12} {sum(scen.count().values()):,} cases, device {scen.device}: {scen.description}")
        except BadInput as exc:
            out.print(f"  {name:<12} [red]invalid[/]: {exc}")


def _print_params(out: Console, params: Sequence[Any]) -> None:
    """A technique's params as a table; where its columns cannot fit the terminal without cutting
    a word (a narrow one), one wrapped paragraph per param instead, broken between words."""
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for col in ("param", "type", "default", "allowed", "meaning"):
        table.add_column(col)
    for p in params:
        table.add_row(p.name, p.type_name, str(p.default), p.allowed(), p.help)
    lines = out.render_lines(table, out.options, pad=False)  # rendered once: printed, unless a cell was cut
    if not any("…" in segment.text for line in lines for segment in line):
        out.print(Segments([segment for line in lines for segment in (*line, Segment.line())]))
        return
    for p in params:
        default = "''" if p.default == "" else p.default
        text = f"{p.name} ({p.type_name}, default {default}; allowed: {p.allowed()}): {p.help}"
        out.print(
            textwrap.fill(
                text,
                out.width,
                initial_indent="  ",
                subsequent_indent="      ",
                break_long_words=False,
                break_on_hyphens=False,
            ),
            markup=False,
            soft_wrap=True,
        )


@click.command(name="env")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option("--calibrate", is_flag=True, help="Measure matmul FLOP/s and copy bandwidth (takes a few seconds).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def env_(device: str, calibrate: bool, as_json: bool) -> None:
    """Show the environment, the harness's per-repetition overhead and (with --calibrate) the
    device's measured ceilings."""
    from gpubench.measure import env as envmod
    from gpubench.measure import timing  # torch: here, not when the CLI starts

    dev = envmod.resolve_device(device)
    info = envmod.capture_env(dev)
    info["harness_overhead_us"] = timing.harness_overhead_s(dev) * 1e6
    if calibrate:
        info["ceilings"] = envmod.calibrate(dev)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    from gpubench.reports.terminal import print_rows

    gpu = info.get("gpu") or {}
    rows = [
        ("device", f"{info['device']} ({info['device_label']})"),
        (
            "gpu",
            f"{gpu.get('name')} cc {gpu.get('compute_capability')}, driver {gpu.get('driver_version')}, "
            f"{(gpu.get('total_memory_bytes') or 0) / 2**30:.0f} GiB"
            if gpu
            else "none",
        ),
        ("torch", f"{info['torch']} (CUDA {info['torch_cuda'] or 'none'})"),
        ("triton", info["triton"] or "not installed"),
        ("python", info["python"]),
        (
            "cpu",
            f"{info['cpu']['model']}, {info['cpu']['logical_cores']} logical cores, "
            f"torch threads {info['cpu']['torch_threads']}",
        ),
        ("host", f"{info['host']} ({info['platform']})"),
        ("git", f"{info['git']['commit'] or 'not a git checkout'}" + (" (dirty)" if info["git"]["dirty"] else "")),
        (
            "harness overhead",
            f"{info['harness_overhead_us']:.2f} us per repetition "
            f"({'CUDA events' if dev.type == 'cuda' else 'perf_counter_ns'}, median of a no-op)",
        ),
    ]
    if calibrate:
        c = info["ceilings"]
        rows.append(
            (
                "matmul peak",
                f"{c['matmul']['peak_tflops']:.3g} TFLOP/s {c['matmul']['dtype']} "
                f"(n={c['matmul']['n']}; median {c['matmul']['median_tflops']:.3g})",
            )
        )
        rows.append(
            ("copy bandwidth", f"{c['copy']['peak_gbps']:.4g} GB/s read+write (median {c['copy']['median_gbps']:.4g})")
        )
        for key in ("h2d", "d2h"):
            if key in c:
                rows.append((key, f"{c[key]['peak_gbps']:.4g} GB/s pinned"))
    print_rows(make_console(), None, [(k, str(v)) for k, v in rows])
