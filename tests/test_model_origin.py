"""The ``model:`` block of a `run --model` scenario read and written through one typed record
(gpubench.records.model_origin): what the generator writes reads back field for field, a trimmed
or damaged block reads as far as it is valid, and a key from a newer version is kept."""

from __future__ import annotations

from gpubench.models.config import load_model
from gpubench.records.model_origin import MODEL_KEYS, ModelOrigin, NotApplicable
from gpubench.records.results import RunRecord
from gpubench.run import model_scenario


def test_the_generators_block_reads_back_field_for_field():
    """Every key the generator writes is a field (none falls into ``extra``), and to_dict gives
    back the same mapping, so results.json's scenario copy is unchanged by the typing."""
    cfg = load_model("smollm2-135m")
    doc = model_scenario.build_model_scenario(cfg, "both", None, None, "cpu", 16 * 2**30, spec="smollm2-135m")
    block = doc["model"]
    origin = ModelOrigin.from_dict(block)
    assert origin is not None and origin.extra == {}
    assert set(block) <= set(MODEL_KEYS)
    assert origin.to_dict() == block
    assert origin.name == "smollm2-135m" and origin.source == "preset smollm2-135m"
    assert origin.shapes_text() == f"both, seq len {block['seq_len']}, batch {block['batch']}"


def test_a_trimmed_or_damaged_block_reads_what_is_valid_and_keeps_newer_keys():
    origin = ModelOrigin.from_dict(
        {
            "name": "my-model",
            "seq_len": "long",  # the wrong type: read as absent, not an error (a report shows what it can)
            "batch": float("nan"),
            "memory_gib": 10**400,  # past any float: no figure, not an OverflowError
            "sizing": ["two layers of 40", 3, ""],
            "not_applicable": [{"technique": "paged_attention", "reason": "no decode"}, "junk", {"reason": "x"}],
            "future_key": {"kept": True},
        }
    )
    assert origin is not None
    assert origin.seq_len is None and origin.batch is None and origin.memory_gib is None
    assert origin.shapes_text() == ""
    assert origin.sizing == ("two layers of 40",)
    assert origin.not_applicable == (NotApplicable("paged_attention", "no decode"),)
    assert origin.reason_left_out("paged_attention") == "no decode" and origin.reason_left_out("kv_cache") is None
    assert origin.to_dict()["future_key"] == {"kept": True}


def test_a_run_without_a_model_block_has_no_origin():
    """None for no block, an empty one or one that is no mapping: such a run is titled by its
    scenario, not as a model's."""
    for scenario in ({}, {"model": {}}, {"model": "gpt-oss-20b"}):
        assert RunRecord.from_dict({"scenario": scenario, "cases": []}).model_origin is None
