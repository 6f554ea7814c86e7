"""Case ids (and the seeds drawn from them) survive a release that adds params: a param declared
``omit_default_from_id`` is left out of the id at its default, so `compare`, the history and the
inputs a case draws still match the runs recorded before it existed."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpubench import techniques
from gpubench.contract import Param
from gpubench.gate import compare
from gpubench.run import scenario
from gpubench.run.scenario import Case, case_seed
from gpubench.techniques import catalog

# The ids of each technique's case at its defaults, as the release before these params (e8ab809)
# wrote them, character for character: what a stored baseline and the history hold.
OLD_IDS = {
    "activation_offload": "activation_offload[layers=4,hidden=128,heads=4,kv_heads=2,batch=2,seq_len=128,"
    "vocab=256,dtype=float32,copy_delay_ms=0.0,buffer_limit=0]",
    "combined_training": "combined_training[layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,experts=8,top_k=2,"
    "expert_dim=64,rows=1,seq_len=256,mean_doc_len=48,dtype=float32]",
    "flash_attention": "flash_attention[batch=2,heads=4,kv_heads=0,seq_len=256,seq_len_q=0,head_dim=64,"
    "head_dim_v=0,dtype=float32,causal=false,causal_align=bottom_right,mode=forward,varlen=false,block_m=0,"
    "block_n=0]",
    "kv_cache": "kv_cache[model=llama-2-7b,kv_dtype=bf16,layers=2,requests=4,max_len=1024,lengths=random,"
    "block_size=16,tp=1]",
    "packed_metadata": "packed_metadata[model=tiny,layers=0,rows=2,micro_batches=1,seq_len=256,mean_doc_len=64,"
    "dtype=float32,backend=auto]",
    "paged_kv_serving": "paged_kv_serving[model=tiny,dtype=float32,requests=50,arrival=poisson:40,"
    "prompt_len=uniform:16:64,output_len=exp:48:160,trace_file=,max_len=256,kv_budget_mib=2.0,block_size=16,"
    "max_batch=16,batch_timeout_ms=50.0,temperature=0.0,wait=true,slo_ttft_ms=1000.0,slo_tpot_ms=100.0,"
    "min_preemptions=0,check_requests=0,scheduler=continuous]",
    "continuous_batching": "continuous_batching[model=tiny,dtype=float32,requests=50,arrival=poisson:40,"
    "prompt_len=uniform:16:64,output_len=exp:48:160,trace_file=,max_len=256,kv_budget_mib=2.0,block_size=16,"
    "max_batch=16,batch_timeout_ms=50.0,temperature=0.0,wait=true,slo_ttft_ms=1000.0,slo_tpot_ms=100.0,"
    "min_preemptions=0,check_requests=0,kv=contiguous]",
}
# The seeds those cases drew before (case_seed of the old id, scenario seed 0), written out so a
# change to the seeding itself shows too.
OLD_SEEDS = {
    "activation_offload": 313269832,
    "combined_training": 1844281800,
    "flash_attention": 192860673,
    "kv_cache": 621743498,
    "packed_metadata": 1830521543,
    "paged_kv_serving": 695286561,
    "continuous_batching": 1558967088,
}
# The params this release added, and only they: a param of an earlier release changed the ids
# once already, and marking it now would change them a second time.
MARKED = {
    ("activation_offload", "head_dim"),
    ("activation_offload", "intermediate"),
    ("combined_training", "head_dim"),
    ("flash_attention", "window"),
    ("flash_attention", "chunk"),
    ("kv_cache", "ignore_fields"),
    ("packed_metadata", "ignore_fields"),
    ("paged_kv_serving", "ignore_fields"),
    ("paged_kv_serving", "layers"),
    ("continuous_batching", "ignore_fields"),
    ("continuous_batching", "layers"),
}


def _cases(text: str) -> list[Case]:
    return scenario.parse(text, Path("ids.yaml")).cases()


def _one(technique: str, params: str = "{}", seed: int = 0) -> Case:
    (case,) = _cases(f"name: ids\nseed: {seed}\nentries:\n  - technique: {technique}\n    params: {params}\n")
    return case


@pytest.mark.parametrize("technique", sorted(OLD_IDS))
def test_a_case_at_its_defaults_keeps_the_id_and_seed_it_had_before_the_new_params(technique):
    case = _one(technique)
    assert case.id == OLD_IDS[technique]
    assert case.seed == OLD_SEEDS[technique] == case_seed(OLD_IDS[technique])
    # the params are all still there for the technique to read: only the id leaves them out
    assert {name for t, name in MARKED if t == technique} <= set(case.params)


@pytest.mark.parametrize("technique", sorted(OLD_IDS))
def test_a_new_param_set_to_its_default_explicitly_is_the_same_case(technique):
    name = sorted(n for t, n in MARKED if t == technique)[0]
    default = catalog.declaration(technique).param(name).default  # type: ignore[union-attr]
    case = _one(technique, json.dumps({name: default}))
    assert (case.id, case.seed) == (OLD_IDS[technique], OLD_SEEDS[technique])


@pytest.mark.parametrize(
    "technique,params,shown",
    [
        ("flash_attention", {"causal": True, "window": 64}, "window=64"),
        ("flash_attention", {"causal": True, "chunk": 128}, "chunk=128"),
        ("activation_offload", {"head_dim": 64}, "head_dim=64"),
        ("activation_offload", {"intermediate": 384}, "intermediate=384"),
        ("combined_training", {"head_dim": 32}, "head_dim=32"),
        ("kv_cache", {"ignore_fields": "my_flag"}, "ignore_fields=my_flag"),
        ("packed_metadata", {"ignore_fields": "my_flag"}, "ignore_fields=my_flag"),
        ("paged_kv_serving", {"layers": 1}, "layers=1"),
        ("continuous_batching", {"layers": 1}, "layers=1"),
    ],
)
def test_a_case_that_sets_a_new_param_carries_it_in_its_id_and_draws_its_own_seed(technique, params, shown):
    case = _one(technique, json.dumps(params))
    assert shown in case.id.split("[", 1)[1].rstrip("]").split(",")
    assert case.seed == case_seed(case.id) != OLD_SEEDS[technique]
    assert all(case.params[k] == v for k, v in params.items())


def test_the_scenario_seed_adds_to_the_old_seed_as_before():
    case = _one("kv_cache", seed=7)
    assert (case.id, case.seed) == (OLD_IDS["kv_cache"], (OLD_SEEDS["kv_cache"] + 7) % 2**31)


def test_only_this_release_s_params_are_left_out_of_ids():
    marked = {(name, p.name) for name, t in catalog.declared().items() for p in t.params if p.omit_default_from_id}
    assert marked == MARKED


def test_the_catalogue_carries_the_flag_so_torch_free_ids_equal_the_registry_s():
    for technique in sorted(OLD_IDS):
        registered = techniques.get(technique)
        # write, JSON, read: what a torch-free path rebuilds
        declared = catalog.declared_of(json.loads(json.dumps(catalog.entry_of(registered))))
        assert [(p.name, p.omit_default_from_id) for p in declared.params] == [
            (p.name, p.omit_default_from_id) for p in registered.params
        ]
        assert scenario.id_omits(declared.params) == scenario.id_omits(registered.params)
        shipped = catalog.declaration(technique)
        assert scenario.id_omits(shipped.params) == scenario.id_omits(registered.params), technique


def test_a_catalogue_written_before_the_flag_reads_as_not_omitted():
    entry = catalog.entry_of(techniques.get("kv_cache"))
    for p in entry["params"]:
        del p["omit_default_from_id"]
    assert not scenario.id_omits(catalog.declared_of(entry).params)


def test_case_s_old_constructor_calls_still_build_the_full_id():
    case = Case("t", {"n": 1, "x": 0}, None, 0)  # type: ignore[arg-type]
    assert case.id == "t[n=1,x=0]"
    omitted = Case("t", {"n": 1, "x": 0}, None, 0, None, {"x": 0})  # type: ignore[arg-type]
    assert omitted.id == "t[n=1]"
    assert Case("t", {"n": 1, "x": 0.0}, None, 0, None, {"x": 0}).id == "t[n=1]"  # type: ignore[arg-type]
    assert Case("t", {"n": 1, "x": 2}, None, 0, None, {"x": 0}).id == "t[n=1,x=2]"  # type: ignore[arg-type]
    assert Case("t", {"n": 1, "x": True}, None, 0, None, {"x": 1}).id == "t[n=1,x=true]"  # type: ignore[arg-type]


def test_param_leaves_its_default_in_the_id_unless_declared():
    assert Param("n", int, 1).omit_default_from_id is False
    assert Param("n", int, 1, omit_default_from_id=True).omit_default_from_id is True


def _results(case_id: str, technique: str, params: dict, samples: list[float], entries: list) -> dict:
    return {
        "kind": "gpubench.results",
        "schema_version": 1,
        "run_id": "r",
        "status": "complete",
        "device_label": "CPU: test",
        "scenario": {"name": "ids", "entries": entries, "thresholds": {}},
        "cases": [
            {
                "id": case_id,
                "technique": technique,
                "params": params,
                "status": "passed",
                "variants": {
                    "baseline": {"role": "baseline", "samples_s": samples},
                    "optimized": {"role": "optimized", "samples_s": samples},
                },
            }
        ],
    }


def test_compare_matches_a_baseline_written_before_the_new_params(tmp_path):
    # The baseline as the earlier release wrote it: the old id, the params without the new ones.
    old_catalog = {"activation_offload": ["head_dim", "intermediate"], "flash_attention": ["window", "chunk"]}
    entries = [{"technique": t} for t in old_catalog]
    samples = list(np.random.default_rng(0).normal(1.0, 0.01, 20))
    base_cases, cur_cases = [], []
    for technique, added in old_catalog.items():
        case = _one(technique)
        old_params = {k: v for k, v in case.params.items() if k not in added}
        base_cases += _results(OLD_IDS[technique], technique, old_params, samples, entries)["cases"]
        cur_cases += _results(case.id, technique, case.params, samples, entries)["cases"]
    base = {**_results("", "", {}, [], entries), "cases": base_cases}
    (tmp_path / "results.json").write_text(json.dumps(base))
    current = {**_results("", "", {}, [], entries), "cases": cur_cases}
    result = compare.compare(compare.load_any(tmp_path / "results.json"), current)
    assert {c.case_id: c.verdict for c in result.changes} == {OLD_IDS[t]: "unchanged" for t in old_catalog}
    assert result.passed


def test_labels_tell_a_case_at_an_omitted_default_from_one_that_sets_the_param():
    # compare's and `history`'s labels come from ids alone: the id without window is the one at
    # window's default, and its label says so rather than falling back to the whole id
    from gpubench.reports.terminal import id_labels

    plain = _one("flash_attention", '{"causal": true}').id
    windowed = _one("flash_attention", '{"causal": true, "window": 64}').id
    assert id_labels([plain, windowed]) == {
        plain: "flash_attention window=default",
        windowed: "flash_attention window=64",
    }


def test_labels_are_whole_when_the_ids_come_as_a_generator():
    # `gpubench history` passes a generator: read once, the ids without a varying param got no
    # label at all (a KeyError in the terminal table)
    from gpubench.reports.terminal import id_labels

    ids = [OLD_IDS["kv_cache"], OLD_IDS["flash_attention"]]
    assert id_labels(i for i in ids) == {i: i for i in ids}


def test_the_history_holds_one_series_across_the_upgrade(tmp_path):
    # A run recorded before the new params and one after: one case, one series of two points.
    from gpubench.gate import history

    case = _one("flash_attention")
    samples = [1e-3, 1.01e-3, 0.99e-3, 1e-3, 1.02e-3]
    paths = []
    for n, (case_id, params) in enumerate(
        [
            (OLD_IDS["flash_attention"], {k: v for k, v in case.params.items() if k not in ("window", "chunk")}),
            (case.id, case.params),
        ]
    ):
        doc = _results(case_id, "flash_attention", params, samples, [{"technique": "flash_attention"}])
        doc.update(run_id=f"run{n}", started_at=f"2026-12-0{n + 1}T10:00:00+00:00", env={"host": "h"})
        (tmp_path / f"run{n}").mkdir()
        paths.append(tmp_path / f"run{n}" / "results.json")
        paths[-1].write_text(json.dumps(doc))
    with history.open_store(tmp_path / "h.sqlite") as store:
        rows = [r for p in paths for r in history.rows_of_file(p)]
        store.add(rows)
        assert {r.case_id for r in rows} == {OLD_IDS["flash_attention"]}
        assert len(store.series(rows[0].device_model, OLD_IDS["flash_attention"], "optimized")) == 2
        # and one case of two runs, shown with the newest run's params (the new ones among them)
        (held,) = store.cases(rows[0].device_model)
        assert (held.case_id, held.runs, held.params) == (OLD_IDS["flash_attention"], 2, case.params)


@pytest.fixture
def forget_idpair():
    yield
    techniques.unregister("idpair")  # loading the file registered it: later tests list the built-ins


def test_a_plug_in_s_param_declared_so_is_left_out_too(tmp_path, forget_idpair):
    # a pair of one's own is built from its module, not the catalogue: the flag works there as well
    (tmp_path / "idpair.py").write_text(
        "from gpubench.contract import Param, Technique\n"
        "TECHNIQUE = Technique('idpair', summary='ids', shape='kernel', params=[Param('n', int, 1), "
        "Param('extra', int, 0, omit_default_from_id=True)])\n"
        "@TECHNIQUE.build\ndef build(params, device, seed): ...\n"
        "@TECHNIQUE.variant('a', role='baseline')\ndef a(w): ...\n"
        "@TECHNIQUE.variant('b', role='optimized')\ndef b(w): ...\n"
        "@TECHNIQUE.check\ndef check(reference, output): ...\n"
    )
    (tmp_path / "s.yaml").write_text("name: s\nentries:\n  - technique: idpair.py\n    params: {extra: [0, 3]}\n")
    ids = [c.id for c in scenario.load(str(tmp_path / "s.yaml")).cases()]
    assert [i.split("[", 1)[1] for i in ids] == ["n=1]", "n=1,extra=3]"]


def test_a_run_from_before_a_param_existed_does_not_make_it_vary_in_labels():
    # the fleet matrix labels the cases of several runs alike: an older run's params lack window
    from gpubench.reports.terminal import shown_params

    new = _one("flash_attention").params
    old = {k: v for k, v in new.items() if k not in ("window", "chunk")}
    assert shown_params([old, new], set(new)) == set(new)  # nothing varies: the scenario's keys
    assert shown_params([old, new, {**new, "window": 64}], set(new)) == {"window"}


# -- ids whose values hold commas (review of issue 37) ---------------------------------------------


def test_a_case_id_with_a_comma_in_a_value_reads_back_whole():
    """`ignore_fields=a,b` keeps its comma: `gpubench profile` parses the id the run printed, and
    the labels show the whole value (splitting at every comma lost `b` or refused the id)."""
    from gpubench.records.case_ids import id_pairs
    from gpubench.reports.terminal import id_labels

    assert id_pairs("model=x,ignore_fields=a,b,kv_dtype=bf16") == ["model=x", "ignore_fields=a,b", "kv_dtype=bf16"]
    labels = id_labels(["kv_cache[model=x,ignore_fields=a,b]", "kv_cache[model=x,ignore_fields=a,c]"])
    assert sorted(labels.values()) == ["kv_cache ignore_fields=a,b", "kv_cache ignore_fields=a,c"]
    scen = scenario.one_case_scenario("kv_cache[model=llama-3.1-8b,ignore_fields=a,b,kv_dtype=bf16]", [], None, "cpu")
    assert scen.cases()[0].params["ignore_fields"] == "a,b"


def test_ignored_fields_in_any_order_or_repeated_are_one_case():
    """The same fields named in another order, or twice, give the same params (so the same id and
    seed): compare and the history would otherwise split one case in two."""
    from gpubench.models.config import load_model
    from gpubench.run.model_scenario import build_model_scenario

    def kv(fields):
        doc = build_model_scenario(load_model("llama-3.1-8b"), "serve", 256, 1, "cpu", 8 * 2**30, ignore_fields=fields)
        return [e["params"] for e in doc["entries"] if e["technique"] == "kv_cache"]

    assert kv(("zz_b", "zz_a")) == kv(("zz_a", "zz_b", "zz_a"))
    assert kv(("zz_b", "zz_a"))[0]["ignore_fields"] == "zz_a,zz_b"
