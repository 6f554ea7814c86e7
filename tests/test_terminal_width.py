"""What a person reads in a terminal at 80 and 100 columns, on a terminal and in a log: cases told
apart by the params that vary among them, nothing that must be read cut (a label, a CI, a check,
a failure's reason, a gate note), progress lines that break between fields, no bar left stale
after a stop, `gpubench history` that never prints two different cases the same, and the other
tables (`gpubench kv-cache`, `env`, `serve`, `profile`) whole on any width, unpadded in a log."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

from gpubench.cli import console as cli_console
from gpubench.cli import history as cli_history
from gpubench.cli import info as cli_info
from gpubench.cli import run as cli_run
from gpubench.gate import compare as comparemod
from gpubench.records import results
from gpubench.reports import gate
from gpubench.reports.terminal import fit_fields, id_labels, print_rows, print_summary, shorten_words
from gpubench.techniques import catalog

BOX = set("│┃━─┏┓┗┛┡┩╇╋┼")
REASON = (
    "optimized paged: check failed (bytes_off_prediction 3.2e+05 > tolerance 0 on layer 7 of 32; the "
    "allocator reserved 14 blocks more than the prediction for requests of lengths 511, 17 and 3, which "
    "is what a block table that is never freed does) Cas"
)
MODELS = ["llama-3.1-8b", "gpt-oss-20b", "deepseek-v3", "llama-2-7b"]


def _doc() -> dict:
    """kv_cache-like cases: three params vary (two cases share a model and dtype and differ in
    lengths only), two are the same everywhere; the last case failed with a long reason."""
    cases = []
    combos = [(m, "bf16", "random") for m in MODELS] + [("llama-3.1-8b", "bf16", "edges")]
    for i, (model, dtype, lengths) in enumerate(combos):
        failed = i == len(combos) - 1
        params = {
            "model": model,
            "kv_dtype": dtype if i != 3 else "fp8",
            "layers": 2,
            "lengths": lengths,
            "block_size": 16,
        }
        cases.append(
            {
                "id": "kv_cache[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]",
                "technique": "kv_cache",
                "params": params,
                "status": "failed" if failed else "passed",
                "failure": {"message": REASON} if failed else None,
                "speedups": {"paged": {"ratio": 1.04 + i, "ci_low": 0.71 + i, "ci_high": 1.22 + i}},
                "variants": {
                    "contiguous": {
                        "role": "baseline",
                        "status": "ok",
                        "stats": {"median": 0.0998},
                        "check": {"passed": True, "error": 0.0, "metric": "reference"},
                    },
                    "paged": {
                        "role": "optimized",
                        "status": "ok",
                        "stats": {"median": 0.0959},
                        "check": {
                            "passed": not failed,
                            "error": 3.2e5 if failed else 0.0,
                            "metric": "bytes_off_prediction",
                        },
                    },
                },
            }
        )
    entry_params = {
        "model": MODELS,
        "kv_dtype": ["bf16", "fp8"],
        "layers": [2],
        "lengths": ["random", "edges"],
        "block_size": [16],
    }
    return {
        "scenario": {"name": "smoke", "entries": [{"technique": "kv_cache", "params": entry_params}]},
        "device": "cpu",
        "device_label": "CPU: AMD EPYC (2 logical cores)",
        "cases": cases,
        "status": "complete",
        "summary": {"passed": len(cases) - 1, "failed": 1},
    }


def _printed(doc, terminal: bool, width: int) -> str:
    buffer = io.StringIO()
    print_summary(doc, Console(file=buffer, force_terminal=terminal, width=width, color_system=None))
    return buffer.getvalue()


def _words(text: str) -> str:
    return " ".join(text.split())


LABELS = [f"kv_cache model={m} kv_dtype={'fp8' if i == 3 else 'bf16'} lengths=random" for i, m in enumerate(MODELS)] + [
    "kv_cache model=llama-3.1-8b kv_dtype=bf16 lengths=edges"
]


@pytest.mark.parametrize("width", [80, 100])
def test_a_narrow_terminal_tells_cases_apart_and_cuts_nothing(width):
    out = _printed(_doc(), terminal=True, width=width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert "…" not in out
    for i, label in enumerate(LABELS):  # each case's varying params whole, on one line
        assert any(label in line for line in lines), (label, out)
        assert any(f"{1.04 + i:.2f}x [{0.71 + i:.2f}, {1.22 + i:.2f}]" in line for line in lines), out  # a CI whole
    assert "layers=" not in out and "block_size=" not in out  # equal for all: not shown
    assert sum("check pass bytes_off_prediction=0.0e+00" in line for line in lines) == 4
    assert _words(REASON) in _words(out)  # the reason whole, to its last word
    assert out.index("FAIL bytes_off_prediction=3.2e+05") > out.index(LABELS[-1])


@pytest.mark.parametrize("width", [80, 100])
def test_a_log_keeps_one_whole_line_per_case_at_any_width(width):
    lines = _printed(_doc(), terminal=False, width=width).splitlines()
    rows = lines[2:7]
    assert not BOX & set("".join(lines))
    for label, row in zip(LABELS, rows):
        assert row.startswith(label + " ")
    assert rows[-1].endswith("failed: " + REASON)  # never cut ("failed: Cas")
    assert all(line == line.rstrip() for line in lines)  # no padding to a width


def test_a_wide_terminal_keeps_the_table():
    out = _printed(_doc(), terminal=True, width=250)
    assert BOX & set(out) and "speedup [95% CI]" in out
    assert _words(LABELS[-1] + ": failed: " + REASON) in _words(out)  # under the table, whole


def test_fields_move_whole_to_the_next_line():
    ci = "1.04x [0.71, 1.22]"
    lines = fit_fields(
        [
            "[1/7] passed  kv_cache model=llama-3.1-8b kv_dtype=bf16 lengths=random",
            f"paged speedup {ci}",
            "(1.9 s, total 12 s)",
        ],
        80,
    )
    assert lines == [
        "[1/7] passed  kv_cache model=llama-3.1-8b kv_dtype=bf16 lengths=random",
        f"    paged speedup {ci}  (1.9 s, total 12 s)",
    ]
    # a field longer than the line wraps at its spaces, no word cut
    long = fit_fields(["a " * 30 + "bytes_off_prediction=0.0e+00"], 20)
    assert long[-1] == "    bytes_off_prediction=0.0e+00" and all(len(x) <= 20 for x in long[:-1])


def test_shortened_notes_end_between_words():
    text = "the baseline variant moved 12% the same way: the machine changed; judged by the ratio"
    short = shorten_words(text, 40)
    assert short.endswith(" ...") and text.startswith(short[:-4]) and text[len(short) - 4] == " "
    assert shorten_words(text, 1000) == text


# -- progress lines -----------------------------------------------------------------------------------


def _record(failed: bool = False) -> results.CaseRecord:
    doc = _doc()["cases"][-1 if failed else 0]
    return results.CaseRecord.from_dict({**doc, "elapsed_s": 1.9})


@pytest.mark.parametrize("width", [80, 100])
def test_a_progress_line_breaks_between_fields_and_keeps_its_reason(width):
    buffer = io.StringIO()
    progress = cli_run._CaseProgress(
        Console(file=buffer, force_terminal=True, width=width, color_system=None),
        {"kv_cache": {"model", "kv_dtype", "lengths"}},
    )
    progress.total = 7
    for i, failed in enumerate((False, True)):
        record = _record(failed)
        progress.case_finished(i, types.SimpleNamespace(technique="kv_cache"), record)
    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= width for line in lines)
    assert any("paged speedup 1.04x [0.71, 1.22]" in line for line in lines)  # the CI on one line
    assert lines[0].startswith("[1/7] passed  kv_cache model=llama-3.1-8b kv_dtype=bf16 lengths=random")
    assert _words(REASON) in _words(buffer.getvalue())


def test_a_stopped_progress_bar_is_erased_not_left_stale():
    buffer = io.StringIO()
    progress = cli_run._CaseProgress(Console(file=buffer, force_terminal=True, width=80, color_system=None), {})
    progress.run_started(3)
    progress.case_started(0, types.SimpleNamespace(technique="kv_cache", params={}))
    progress.bar.refresh()
    drawn = buffer.getvalue()
    assert "case" in drawn and "0/3" in drawn
    progress.run_finished()  # what Ctrl-C's path calls (the supervisor's close, then the command's finally)
    progress.run_finished()  # a second call does nothing
    out = buffer.getvalue()
    last = out[out.rindex("0/3") :]  # after the bar's last drawing: the cursor back up, the line erased
    assert "\x1b[1A\x1b[2K" in last.split("\n", 1)[1]


# -- gpubench history ---------------------------------------------------------------------------------

LONG = "kv_cache[model=gpt-oss-20b,kv_dtype=bf16,layers=2,requests=4,max_len=512,lengths={},block_size=16,tp=1]"


def _histories():
    change = types.SimpleNamespace(
        commit="0123456789abcdef",
        run_id="20261206-141850-smoke",
        magnitude_text="+12.5% [8.1, 16.0]",
        kind="regression",
    )
    out = []
    for lengths in ("edges", "random"):
        for variant in ("contiguous", "paged"):
            out.append(
                types.SimpleNamespace(
                    case_id=LONG.format(lengths),
                    variant=variant,
                    metric="time",
                    points=[1, 2, 3],
                    latest=change if lengths == "edges" else None,
                )
            )
    return out


def test_history_in_a_log_prints_whole_case_ids_unpadded(capsys):
    cli_history.print_changes("store.sqlite", "CPU: test", "main", _histories())
    lines = capsys.readouterr().out.splitlines()
    assert not BOX & set("".join(lines))
    assert sum(line.startswith(LONG.format("edges") + " ") for line in lines) == 2  # not cut at 40 characters
    assert sum(line.startswith(LONG.format("random") + " ") for line in lines) == 2
    assert all(line == line.rstrip() for line in lines)
    assert any("0123456789ab (20261206-141850-smoke)" in line and line.endswith("regression") for line in lines)


@pytest.mark.parametrize("width", [80, 100])
def test_history_on_a_narrow_terminal_labels_cases_by_what_varies(monkeypatch, width):
    buffer = io.StringIO()
    monkeypatch.setattr(
        cli_console,
        "make_console",
        lambda stderr=False: Console(file=buffer, force_terminal=True, width=width, color_system=None),
    )
    cli_history.print_changes("store.sqlite", "CPU: test", "main", _histories())
    out = buffer.getvalue()
    assert all(len(line) <= width for line in out.splitlines())
    assert "…" not in out
    assert "kv_cache lengths=edges" in out and "kv_cache lengths=random" in out
    assert "+12.5% [8.1, 16.0]" in out  # a magnitude's CI whole


def test_id_labels_keep_only_what_varies_and_leave_odd_ids_whole():
    ids = [LONG.format("edges"), LONG.format("random"), "pytest::test_thing"]
    assert id_labels(ids) == {
        ids[0]: "kv_cache lengths=edges",
        ids[1]: "kv_cache lengths=random",
        ids[2]: "pytest::test_thing",
    }


# -- the gate's note ----------------------------------------------------------------------------------


def _comparison():
    samples = list(np.random.default_rng(0).normal(1e-3, 1e-6, 20))
    doc = {
        "kind": "gpubench.results",
        "schema_version": 1,
        "run_id": "r",
        "device_label": "CPU: test",
        "status": "complete",
        "scenario": {"name": "s", "entries": [{"technique": "t"}]},
        "cases": [
            {
                "id": "t[a=1]",
                "technique": "t",
                "status": "passed",
                "failure": None,
                "params": {"a": 1},
                "variants": {
                    "b": {"role": "baseline", "samples_s": samples},
                    "o": {"role": "optimized", "samples_s": samples},
                },
            }
        ],
    }
    comp = comparemod.compare(doc, doc)
    comp.changes[0].reason = REASON + " " + "and more words " * 30
    return comp


@pytest.mark.parametrize("width", [80, 100])
def test_the_gates_terminal_note_is_whole(width):
    buffer = io.StringIO()
    gate.print_table(_comparison(), Console(file=buffer, force_terminal=True, width=width, color_system=None))
    out = buffer.getvalue()
    assert "…" not in out and all(len(line) <= width for line in out.splitlines())
    assert _words(REASON + " " + "and more words " * 30) in _words(out)  # past 120 characters, whole
    assert any(line.startswith("t[a=1] (o)") and line.rstrip().endswith("unchanged") for line in out.splitlines())


def test_a_wide_terminal_keeps_the_gates_table():
    buffer = io.StringIO()
    gate.print_table(_comparison(), Console(file=buffer, force_terminal=True, width=1000, color_system=None))
    assert BOX & set(buffer.getvalue())


def test_the_gates_markdown_note_is_shortened_between_words():
    md = gate.to_markdown(_comparison())
    row = next(line for line in md.splitlines() if line.startswith("| `t[a=1]`"))
    note = row.rstrip(" |").rsplit(" | ", 1)[1]
    assert note.endswith(" ...") and (REASON + " " + "and more words " * 30).startswith(note[:-4] + " ")


def test_the_gates_log_has_whole_unpadded_lines():
    buffer = io.StringIO()
    gate.print_table(_comparison(), Console(file=buffer, force_terminal=False, width=160, color_system=None))
    lines = buffer.getvalue().splitlines()
    assert not BOX & set("".join(lines))
    assert all(line == line.rstrip() for line in lines)  # no padding to 160 columns
    assert "  " + REASON + " " + ("and more words " * 30).rstrip() in lines  # the note on one line, whole


def _listed(monkeypatch, width: int) -> str:
    """`gpubench list` as a terminal of ``width`` columns shows it."""
    buffer = io.StringIO()
    monkeypatch.setattr(
        cli_info,
        "make_console",
        lambda stderr=False: Console(file=buffer, force_terminal=True, width=width, color_system=None),
    )
    result = CliRunner().invoke(cli_info.list_, [])
    assert result.exit_code == 0, result.output
    return buffer.getvalue()


@pytest.mark.parametrize("width", [80, 100])
def test_list_at_a_narrow_terminal_wraps_between_words_and_cuts_nothing(monkeypatch, width):
    """Every param's name, default, allowed values and meaning are there whole, each word unbroken
    (a table whose columns cannot fit becomes one wrapped paragraph per param), no line too long."""
    out = _listed(monkeypatch, width)
    assert all(len(line) <= width for line in out.splitlines()), max(out.splitlines(), key=len)
    assert "…" not in out
    words = set(out.split())
    for name, tech in catalog.declared().items():
        assert name in words
        for p in tech.params:
            for field in (p.name, p.allowed(), p.help):
                for word in field.split():  # inside one printed word: never broken across lines
                    assert any(word in w for w in words), (name, p.name, word)


def test_list_on_a_wide_terminal_keeps_the_params_table(monkeypatch):
    out = _listed(monkeypatch, 250)
    assert sum("param" in line and "default" in line and "meaning" in line for line in out.splitlines()) == len(
        catalog.declared()
    )


# -- the other tables a person reads: gpubench kv-cache, env, serve, profile --------------------------


def _console(buffer, terminal: bool, width: int) -> Console:
    return Console(file=buffer, force_terminal=terminal, width=width, color_system=None)


def _kv_plan(name: str = "gpt-oss-20b"):
    from gpubench.lib import kvmath
    from gpubench.models import config as model_config
    from gpubench.models import params as model_params

    cfg = model_config.load_preset(name)
    return kvmath.plan(
        cfg, seq_len=4096, batch=None, gpu_memory_bytes=80 * 2**30, weight_bytes=model_params.weight_bytes(cfg).bytes
    )


def _kv_rendered(terminal: bool, width: int) -> str:
    from gpubench.reports import kv_table

    buffer = io.StringIO()
    kv_table.render(_kv_plan(), _console(buffer, terminal, width))
    return buffer.getvalue()


KV_ROWS = [
    "per token per layer",
    "free for KV per GPU",
    "vLLM's GPU KV cache size",
    "naive 2 x layers x hidden x bytes",
    "vLLM start-up log's max concurrency",
]


@pytest.mark.parametrize("width", [80, 100])
def test_the_kv_calculator_on_a_narrow_terminal_keeps_each_row_whole_and_apart(width):
    """gpubench kv-cache at 80 and 100 columns: no line wider than the terminal, nothing cut (no
    "…"), each figure's label whole at the start of its own line with its value, the allocators'
    rows one line each with all four figures, each memory-bar label whole on one line."""
    out = _kv_rendered(terminal=True, width=width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert "…" not in out
    plan = _kv_plan()
    for label in KV_ROWS:
        assert any(line.startswith(label) for line in lines), (label, out)
    assert any(line.startswith("vLLM's GPU KV cache size") and f"{plan.max_tokens:,} tokens" in line for line in lines)
    for name, text in (("paged", "paged, window-aware"), ("contiguous", "contiguous, max_len")):
        row = next(line for line in lines if line.lstrip("│ ").startswith(text))  # boxed at 100
        assert f"{plan.policies[name].max_sequences:,}" in row and "%" in row, out  # the row's figures on its line
    for label in ("▓ KV (paged) ", "░ free ", "· headroom "):
        assert sum(label in line for line in lines) == 1, out


def test_the_kv_calculator_in_a_log_prints_whole_unpadded_lines():
    """In a log (not a terminal, 160 columns): a line per row with its note whole, columns aligned
    by the text, never padded out to 160, no box drawing, the legend on one line."""
    from gpubench.reports.kv_table import POLICY_LEGEND

    out = _kv_rendered(terminal=False, width=160)
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    assert not BOX & set(out)
    assert POLICY_LEGEND in lines
    row = next(line for line in lines if line.startswith("vLLM's GPU KV cache size"))
    assert row.endswith("as its start-up log (blocks: free // (block of one layer x 12 layers))")
    assert any(line.startswith("[") and line.endswith("· headroom 8 GiB") for line in lines)  # the bar whole


HEADER = (
    "preset",
    "type",
    "attention",
    "layers",
    "KV heads",
    "KV vector",
    "sliding layers",
    "params (counted)",
    "published",
)
PRESETS = [
    ("deepseek-v3", "deepseek_v3", "MLA", "61", "-", "576", "0", "671.03B", "671.00B"),
    ("mistral-7b-v0.1", "mistral", "GQA", "32", "8", "128", "32", "7.24B", "7.30B"),
]


def _rows_printed(header, rows, terminal: bool, width: int, title: str = "") -> str:
    buffer = io.StringIO()
    print_rows(_console(buffer, terminal, width), header, rows, right=range(3, 9) if header else (), title=title)
    return buffer.getvalue()


def test_a_table_that_fits_only_with_its_names_wrapped_keeps_every_column_and_cell():
    """At 100 columns the presets table fits once its column names wrap between words: every
    column is kept (rich, squeezed, drops or crops the last one), every cell whole on its row."""
    out = _rows_printed(HEADER, PRESETS, terminal=True, width=100)
    lines = out.splitlines()
    assert all(len(line) <= 100 for line in lines) and "…" not in out
    for row in PRESETS:
        line = next(line for line in lines if line.startswith(row[0] + " "))
        assert line.split() == list(row)  # each cell whole, in order, the last column too
    assert any(line.split()[-1] == "published" for line in lines)


@pytest.mark.parametrize("width", [80, 60])
def test_a_table_too_narrow_for_its_columns_prints_a_line_per_row_of_whole_fields(width):
    out = _rows_printed(HEADER, PRESETS, terminal=True, width=width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines) and "…" not in out
    assert lines[0].startswith("deepseek-v3: type deepseek_v3")
    assert "published 671.00B" in out and "params (counted) 7.24B" in out  # a name and its cell together


@pytest.mark.parametrize("width", [80, 160])
def test_a_table_in_a_log_is_aligned_plain_lines_never_padded(width):
    """gpubench env, kv-cache --list, serve in a log: aligned by their text, no box, no trailing
    padding, nothing wrapped at the width."""
    grid = [("device", "cpu (CPU: AMD EPYC (2 logical cores))"), ("harness overhead", "0.11 us per repetition " * 5)]
    out = _rows_printed(None, grid, terminal=False, width=width)
    assert out.splitlines() == [
        "device            cpu (CPU: AMD EPYC (2 logical cores))",
        "harness overhead  " + ("0.11 us per repetition " * 5).rstrip(),
    ]
    table = _rows_printed(HEADER, PRESETS, terminal=False, width=width, title="presets (published configs)")
    lines = table.splitlines()
    assert lines[0] == "presets (published configs)" and lines[1].split()[-1] == "published"
    assert not BOX & set(table) and all(line == line.rstrip() for line in lines)
    assert [line.split() for line in lines[2:]] == [list(row) for row in PRESETS]


def _profile_table() -> dict:
    from gpubench.reports.profile_view import case_table

    def profile(ops: int, syncs: int, top: list[tuple[str, float, float]]) -> dict:
        return {
            "ops_per_call": ops,
            "syncs_per_call": syncs,
            "sync_ops": {"aten::nonzero": syncs},
            "copies_per_call": {"h2h": {"count": 1}},
            "peak_memory_bytes": 949 * 1024,
            "calls": 3,
            "time_basis": "cpu",
            "trace": "t.json.gz",
            "notes": [],
            "top_ops": [{"name": n, "share": s, "self_us_per_call": us, "count_per_call": 8} for n, s, us in top],
        }

    long_op = "autograd::engine::evaluate_function: AddmmBackward0"
    case = {
        "id": "moe_grouping[experts=8,top_k=2,tokens=64]",
        "technique": "moe_grouping",
        "status": "passed",
        "params": {"experts": 8, "top_k": 2, "tokens": 64},
        "variants": {
            "where_loop": {
                "role": "baseline",
                "profile": profile(627, 9, [("aten::scatter_add_", 0.35, 1.6e6), ("aten::mm", 0.5, 464e3)]),
            },
            "sort_group": {"role": "optimized", "profile": profile(211, 1, [(long_op, 0.01, 221.0)])},
            "grouped_mm": {"role": "peer", "profile": profile(84, 0, [("aten::_local_scalar_dense", 0.2, 7e3)])},
        },
    }
    return case_table(case, 1)


OPS = [
    "aten::scatter_add_ 35% (1.6 s, x8)",
    "aten::mm 50% (464 ms, x8)",
    "autograd::engine::evaluate_function: AddmmBackward0 1% (221 us, x8)",
    "aten::_local_scalar_dense 20% (7 ms, x8)",
]


@pytest.mark.parametrize("terminal,width", [(True, 80), (True, 100), (False, 80), (False, 160)])
def test_gpubench_profile_names_every_op_whole_on_a_narrow_terminal_and_in_a_log(terminal, width):
    """The profile's "what changed" table too wide for the terminal (and in a log): a block per
    variant, its counts as whole fields and each top op whole on its own line (never
    "aten::scatter_ad…"); the title keeps the case id's [params] (no rich markup); a log's lines
    are whole and unpadded; a time reads 1.6 s, never 1.6e+03 ms."""
    from gpubench.reports.profile_view import print_case

    buffer = io.StringIO()
    print_case(_profile_table(), _console(buffer, terminal, width))
    out = buffer.getvalue()
    lines = [line.strip() for line in out.splitlines()]
    assert "…" not in out and "e+" not in out
    assert out.startswith("moe_grouping[experts=8,top_k=2,tokens=64] (3 calls per variant)")
    for op in OPS:
        assert op in lines, (op, out)
    for variant in ("baseline where_loop", "optimized sort_group", "peer grouped_mm"):
        assert variant in lines
    assert "ops per call 627" in out and "host syncs per call 9 (aten::nonzero 9)" in out
    raw = out.splitlines()
    assert all(line == line.rstrip() for line in raw) if not terminal else all(len(line) <= width for line in raw)


def test_gpubench_profile_on_a_wide_terminal_keeps_the_variants_side_by_side():
    from gpubench.reports.profile_view import print_case

    buffer = io.StringIO()
    print_case(_profile_table(), _console(buffer, True, 250))
    out = buffer.getvalue()
    assert BOX & set(out) and "…" not in out
    header = next(line for line in out.splitlines() if "baseline where_loop" in line)
    assert "optimized sort_group" in header and "peer grouped_mm" in header


def test_history_in_a_log_pads_no_line_to_its_longest_case_id(capsys):
    """One 300-character case id (a serving case's) does not pad every other line of the log to
    300 characters: a short id's line stays short; the long one whole, its columns after it."""
    huge = "continuous_batching[" + ",".join(f"param_{i}=value_{i}" for i in range(18)) + "]"
    found = _histories() + [
        types.SimpleNamespace(case_id=huge, variant="paged", metric="time", points=[1, 2], latest=None)
    ]
    cli_history.print_changes("store.sqlite", "CPU: test", "main", found)
    lines = capsys.readouterr().out.splitlines()
    assert len(huge) > 300 and any(line.startswith(huge + "  paged") for line in lines)
    short = [line for line in lines if line.startswith(LONG.format("random"))]
    assert short and all(len(line) < 200 for line in short)


@pytest.mark.parametrize("terminal", [True, False])
def test_a_run_stopped_early_says_in_its_summary_how_many_planned_cases_never_ran(terminal):
    """After SIGTERM or Ctrl-C the end-of-run summary counts the planned cases it never reached
    (in red on a terminal), as the report does; a run that reached them all says nothing of it."""
    doc = {**_doc(), "status": "interrupted", "planned_cases": 68}
    out = _printed(doc, terminal=terminal, width=100)
    assert "4 passed, 1 failed, 63 of 68 planned not run (interrupted)" in out
    assert "planned not run" not in _printed({**_doc(), "planned_cases": 5}, terminal=terminal, width=100)
