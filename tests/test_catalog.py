"""The catalogue of the built-in techniques' declarations (gpubench.techniques.catalog, issue 35 point 5):
what `list` and a scenario's checks read instead of the technique code. It must say what the
modules declare (a stale one fails here, naming the command that rebuilds it), rebuild each Param
so that a value is refused or accepted exactly as the technique's own Param does, and give way to
the registry where the sources it was built from were edited."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from gpubench import techniques
from gpubench.errors import BadInput
from gpubench.run import scenario as scenariomod
from gpubench.techniques import catalog

# Values that exercise every check of a Param: types, choices, bounds, the excluded minimum.
PROBES = (
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    7,
    64,
    10**9,
    0.0,
    0.5,
    -0.5,
    1e-3,
    3.5,
    1e12,
    float("inf"),
    float("nan"),
    "",
    "x",
    "float32",
    "bfloat16",
    "poisson:40",
    "tiny",  # a model param's value check (Param.value_check): a built-in size, a preset, a misspelt one
    "llama-2-7b",
    "lama-2-7b",
    [1],
)


@pytest.fixture
def fresh(monkeypatch):
    """The catalogue read again in this test (its cache emptied before and after)."""
    monkeypatch.setattr(catalog, "_CACHE", {})
    yield
    catalog._CACHE.clear()


def _built_ins():
    return {n: t for n, t in techniques.all_techniques().items() if t.source.startswith("gpubench.techniques.")}


def test_the_committed_catalogue_is_what_the_modules_declare_now():
    """A stale catalogue (a param, a claim or a variant edited without `make catalog`) fails CI
    here, naming what changed and the command to run."""
    committed = json.loads(catalog.CATALOG_FILE.read_text(encoding="utf-8"))
    now = json.loads(json.dumps(catalog.build()))
    diff = catalog.stale_entries(committed, now)
    assert diff == [], f"{catalog.CATALOG_FILE} is stale ({'; '.join(diff)}): run {catalog.WRITE_COMMAND} and commit it"


def test_stale_entries_names_a_changed_declaration_and_a_changed_source():
    a = {"source_hash": "1", "techniques": {"x": {"summary": "old"}, "y": {}}}
    b = {"source_hash": "2", "techniques": {"x": {"summary": "new"}, "z": {}}}
    assert catalog.stale_entries(a, b) == [
        "the sources it was built from changed (source_hash)",
        "x: declarations changed",
        "y: removed",
        "z: added",
    ]
    assert catalog.stale_entries(a, a) == []


def test_each_declaration_rebuilds_as_the_module_declares_it(fresh):
    """Params equal (type, default, choices, bounds: so the same values are refused with the same
    words), claims, variants and the cross-param flag as the real techniques have them."""
    declared = catalog.built_ins()
    assert declared is not None, f"the committed catalogue is stale: run {catalog.WRITE_COMMAND}"
    real = _built_ins()
    assert list(declared) == list(real)
    for name, tech in real.items():
        mine = declared[name]
        assert (mine.shape, mine.summary, mine.anchor, mine.gpu_specific, mine.source) == (
            tech.shape,
            tech.summary,
            tech.anchor,
            tech.gpu_specific,
            tech.source,
        ), name
        assert mine.claims == tuple(tech.claims), name
        assert [(v.name, v.role, v.description) for v in mine.variants.values()] == [
            (v.name, v.role, v.description) for v in tech.variants.values()
        ], name
        assert mine.validates == (tech.validate_fn is not None), name
        assert mine.defaults() == tech.defaults(), name
        for theirs, ours in zip(tech.params, mine.params, strict=True):
            assert (
                ours.name,
                ours.type,
                ours.default,
                ours.help,
                ours.min,
                ours.max,
                ours.min_exclusive,
                ours.value_check,
            ) == (
                theirs.name,
                theirs.type,
                theirs.default,
                theirs.help,
                theirs.min,
                theirs.max,
                theirs.min_exclusive,
                theirs.value_check,
            ), (name, theirs.name)
            assert ours.allowed() == theirs.allowed(), (name, theirs.name)
            for value in PROBES:
                assert ours.problem(value) == theirs.problem(value), (name, theirs.name, value)


def test_edited_sources_fall_back_to_the_registry(fresh, monkeypatch, tmp_path):
    """Sources that hash otherwise than the catalogue's (an edited checkout: here a copy with one
    file changed) make it stand aside: declared() is the registry's, real techniques."""
    copy = {name: tmp_path / name for name in catalog.source_dirs()}
    for name, folder in catalog.source_dirs().items():
        shutil.copytree(folder, copy[name], ignore=shutil.ignore_patterns("__pycache__"))
    assert catalog.source_hash(copy) == catalog.source_hash()  # the copy hashes as the original
    (copy["gpubench"] / "lib" / "kvmath.py").write_text(
        (copy["gpubench"] / "lib" / "kvmath.py").read_text() + "\n# edited\n"
    )
    assert catalog.source_hash(copy) != catalog.source_hash()
    monkeypatch.setattr(catalog, "source_dirs", lambda: copy)
    assert catalog.built_ins() is None
    declared = catalog.declared()
    assert declared == techniques.all_techniques()
    assert all(not isinstance(t, catalog.Declared) for t in declared.values())


def test_a_catalogue_in_another_format_or_unreadable_is_not_used(fresh, monkeypatch, tmp_path):
    for text in (
        "{not json",
        json.dumps({"format": catalog.FORMAT + 1, "source_hash": catalog.source_hash(), "techniques": {}}),
    ):
        catalog._CACHE.clear()
        path = tmp_path / "catalog.json"
        path.write_text(text)
        monkeypatch.setattr(catalog, "CATALOG_FILE", path)
        assert catalog.built_ins() is None


def test_scenario_errors_read_from_the_catalogue_say_what_the_registry_said(fresh, monkeypatch, write_scenario):
    """The same scenario refused through the catalogue and through the registry: the same paragraph,
    word for word (unknown technique, with and without a close name; unknown param; bad type,
    choice and bound)."""
    path = write_scenario(
        textwrap.dedent("""
        name: bad
        entries:
          - technique: flash_atention
          - technique: nosuchthing
          - technique: kv_cache
            params: {no_such: 1, block_size: 0}
          - technique: flash_attention
            params: {dtype: float8, causal: 3}
        thresholds: {kv_cach: 10%}
    """).lstrip()
    )
    assert catalog.built_ins() is not None, f"the committed catalogue is stale: run {catalog.WRITE_COMMAND}"
    monkeypatch.setattr(techniques, "loaded", lambda: False)  # as in a fresh `gpubench run`: the catalogue answers
    monkeypatch.setattr(techniques, "registered", lambda: {})
    assert isinstance(catalog.declaration("kv_cache"), catalog.Declared)
    with pytest.raises(BadInput) as from_catalogue:
        scenariomod.load(path)
    catalog._CACHE["built_ins"] = None  # as where the sources were edited: the registry answers
    with pytest.raises(BadInput) as from_registry:
        scenariomod.load(path)
    assert str(from_catalogue.value) == str(from_registry.value)
    assert from_catalogue.value.problems == from_registry.value.problems
    text = " ".join(from_catalogue.value.problems)
    for words in (
        "did you mean 'flash_attention'",
        "'nosuchthing' is neither a registered technique",
        "kv_cache.no_such: unknown param",
        "kv_cache.block_size: 0 is below the minimum 1",
        "flash_attention.dtype",
        "flash_attention.causal",
        "thresholds.kv_cach",
    ):
        assert words in text, words


def test_cross_param_rules_still_refuse_through_the_catalogue(fresh, monkeypatch, write_scenario):
    """A technique's validate_fn (code) runs once the entry's params are valid, through its module."""
    monkeypatch.setattr(techniques, "loaded", lambda: False)
    monkeypatch.setattr(techniques, "registered", lambda: {})
    assert isinstance(catalog.declaration("moe_grouping"), catalog.Declared)
    path = write_scenario(
        textwrap.dedent("""
        name: bad
        entries:
          - technique: moe_grouping
            params: {experts: 4, top_k: 8}
    """).lstrip()
    )
    with pytest.raises(BadInput) as exc:
        scenariomod.load(path)
    assert "moe_grouping.params: top_k (8) must not exceed experts (4)" in str(exc.value)
