"""Scenario files: every problem reported before anything runs, with file:line and key."""

import pytest

from gpubench.errors import BadInput
from gpubench.run import scenario

GOOD = """\
name: t
entries:
  - technique: toy_kernel
    params:
      n: [8, 16, 32]
      mode: ok
  - technique: toy_generation
    params: {tokens: [4, 8], vocab: [10, 20]}
"""


def problems_of(path):
    with pytest.raises(BadInput) as info:
        scenario.load(path)
    return str(info.value), info.value.problems


def test_lists_expand_as_cartesian_product_over_defaults(toys, write_scenario):
    scen = scenario.load(write_scenario(GOOD))
    cases = scen.cases()
    assert len(cases) == 3 + 4
    assert [c.params["n"] for c in cases[:3]] == [8, 16, 32]
    assert all(c.params["mode"] == "ok" for c in cases[:3])
    assert {(c.params["tokens"], c.params["vocab"]) for c in cases[3:]} == {(4, 10), (4, 20), (8, 10), (8, 20)}


def test_case_ids_and_seeds_are_stable_and_distinct(toys, write_scenario):
    a = scenario.load(write_scenario(GOOD)).cases()
    b = scenario.load(write_scenario(GOOD)).cases()
    assert [c.id for c in a] == [c.id for c in b]
    assert [c.seed for c in a] == [c.seed for c in b]
    assert len({c.seed for c in a}) == len(a)
    assert a[0].id == "toy_kernel[n=8,mode=ok]"


def test_bad_type_reports_file_line_and_key(toys, write_scenario):
    path = write_scenario(GOOD.replace("n: [8, 16, 32]", "n: [8, sixteen, 32]"))
    message, problems = problems_of(path)
    assert problems == [f"{path}:5: toy_kernel.n: 'sixteen' is not an int"]
    assert "nothing was run" in message


def test_value_outside_choices_names_the_allowed_values(toys, write_scenario):
    path = write_scenario(GOOD.replace("mode: ok", "mode: fast"))
    _, problems = problems_of(path)
    assert problems[0].startswith(f"{path}:6: toy_kernel.mode: 'fast' is not one of ['ok',")


def test_unknown_keys_at_every_level(toys, write_scenario):
    text = GOOD.replace("name: t", "name: t\ndevise: cpu").replace(
        "    params:\n      n:", "    parms: 1\n    params:\n      size: 3\n      n:"
    )
    path = write_scenario(text)
    _, problems = problems_of(path)
    assert any(p.startswith(f"{path}:2: devise: unknown key; allowed: name,") for p in problems)
    assert any(p.startswith(f"{path}:5: entries[0].parms: unknown key") for p in problems)
    assert any(p.startswith(f"{path}:7: toy_kernel.size: unknown param; allowed: n, mode") for p in problems)
    assert len(problems) == 3  # every problem at once


def test_unknown_technique_suggests_the_close_name(toys, write_scenario):
    path = write_scenario(GOOD.replace("technique: toy_kernel", "technique: toy_kernal"))
    _, problems = problems_of(path)
    assert problems[0].startswith(
        f"{path}:3: entries[0].technique: 'toy_kernal' is not a registered technique (did you mean 'toy_kernel'?)"
    )
    from gpubench import techniques

    allowed = problems[0].split("allowed: ", 1)[1]
    assert all(name in allowed for name in techniques.all_techniques())  # every registered one


def test_invalid_yaml_reports_the_line(write_scenario):
    path = write_scenario("name: t\nentries:\n  - technique: [unclosed\n    params: {}\n", policy=False)
    message, _ = problems_of(path)
    assert message.startswith(f"{path}:") and "invalid YAML" in message


INVALID_YAML = {
    # text -> (line, the message's words): PyYAML's pure-Python parser's, with or without libyaml
    "name: t\nentries:\n\t- technique: kv_cache\n": (3, "found character '\\t' that cannot start any token"),
    "name:\tt\nentries: []\n": (1, "found character '\\t' that cannot start any token"),
    "name: t\nentries: [a, @b]\n": (2, "found character '@' that cannot start any token"),
    "name: t\nentries: *x\n": (2, "found undefined alias 'x'"),
    "name: t\ndescription: !foo x\nentries: []\n": (2, "could not determine a constructor for the tag '!foo'"),
    "name: t\ndescription: 2020-13-45\nentries: []\n": (2, "'2020-13-45' cannot be read (month must be in 1..12)"),
    "name: t\nbase: &b {technique: x}\nentries:\n  - <<: *b\n": (4, "a merge key (<<) is not read here"),
    # nested past Python's stack (the Python parser recurses per level), with a tab that sends it there
    "# a\tcomment\nname: t\nentries: " + "[" * 5000 + "]" * 5000 + "\n": (1, "exceeded maximum nesting depth"),
}


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "python"])
@pytest.mark.parametrize("text", INVALID_YAML, ids=lambda text: text[:40])
def test_invalid_yaml_reads_the_same_with_or_without_libyaml(write_scenario, monkeypatch, text, fast):
    """A file YAML refuses, or a value it cannot build (an unknown tag, a merge key, a date that
    does not exist), is one line naming the file, the line and what is wrong, the same words
    whether or not PyYAML has libyaml (which says less, and lets tabs pass): never a traceback."""
    if not fast:
        monkeypatch.setattr(scenario, "_FAST_LOADER", None)
    elif scenario._FAST_LOADER is None:
        pytest.skip("this PyYAML has no libyaml")
    path = write_scenario(text, policy=False)
    line, words = INVALID_YAML[text]
    message, _ = problems_of(path)
    assert message.startswith(f"{path}:{line}: invalid YAML") and words in message, message


def test_bad_device_and_policy_are_reported(toys, write_scenario):
    path = write_scenario(GOOD + "device: gpu0\npolicy:\n  min_reps: 0\n  warmup: 1\n", policy=False)
    _, problems = problems_of(path)
    assert any("device: 'gpu0' is not valid; allowed: auto, cpu, cuda or cuda:N" in p for p in problems)
    assert any(p.startswith(f"{path}:11: policy.min_reps:") for p in problems)
    assert any(p.startswith(f"{path}:12: policy.warmup: unknown policy key") for p in problems)


def test_cross_param_rules_of_a_technique_are_checked(write_scenario):
    path = write_scenario(
        "name: t\nentries:\n  - technique: flash_attention\n    params: {heads: 8, kv_heads: [2, 3]}\n"
    )
    _, problems = problems_of(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:4: flash_attention.params:")
    assert "kv_heads" in problems[0]


def test_missing_required_keys_and_empty_file(write_scenario):
    _, problems = problems_of(write_scenario("description: nothing\n", policy=False))
    assert any("name: required" in p for p in problems) and any("entries: required" in p for p in problems)
    message, _ = problems_of(write_scenario("", policy=False))
    assert "empty" in message


def test_duplicate_keys_are_an_error_not_a_silent_override(toys, write_scenario):
    path = write_scenario(GOOD.replace("mode: ok", "mode: ok\n      mode: hang"))
    _, problems = problems_of(path)
    assert any("key given twice" in p for p in problems)


def test_unknown_scenario_name_lists_shipped_ones():
    with pytest.raises(BadInput) as info:
        scenario.load("smok")
    assert "did you mean 'smoke'" in str(info.value) and "gpu-quick" in str(info.value)


def test_shipped_scenarios_are_valid_and_smoke_covers_every_technique():
    from gpubench import techniques

    shipped = scenario.shipped_scenarios()
    assert {"smoke", "gpu-quick"} <= set(shipped)
    for name in shipped:
        assert scenario.load(name).cases()
    smoke = scenario.load("smoke")
    assert {e.technique for e in smoke.entries} == set(techniques.all_techniques())


def test_entry_policy_overrides_and_variants_subset(toys, write_scenario):
    text = GOOD.replace(
        "      mode: ok\n", "      mode: ok\n    policy: {max_reps: 2, min_reps: 1}\n    variants: [optimized]\n"
    )
    scen = scenario.load(write_scenario(text))
    case = scen.cases()[0]
    assert case.policy.max_reps == 2 and case.variants == ("baseline", "optimized")
    assert scen.cases()[-1].policy.max_reps == 5  # the scenario's policy, untouched


def test_repeat_scale_scales_reps_and_times(toys, write_scenario):
    scen = scenario.load(write_scenario(GOOD))
    case = scen.cases(repeat_scale=2.0)[0]
    assert case.policy.max_reps == 10 and case.policy.min_reps == 6
    assert case.policy.max_time_s == pytest.approx(1.0)


def test_a_non_scalar_key_is_reported_not_a_crash(toys, write_scenario):
    path = write_scenario(GOOD.replace("name: t", "name: t\n? [a, b]\n: 1"))
    _, problems = problems_of(path)
    assert problems == [f"{path}:2: (top level): a key must be a plain name, not a list or mapping"]


def test_per_technique_thresholds_are_validated_and_kept(toys, write_scenario):
    scen = scenario.load(write_scenario(GOOD + "thresholds: {toy_kernel: 10%, toy_generation: 0.2}\n"))
    assert scen.thresholds == {"toy_kernel": pytest.approx(0.1), "toy_generation": pytest.approx(0.2)}
    assert scen.to_dict()["thresholds"] == scen.thresholds
    path = write_scenario(GOOD + "thresholds: {toy_kernal: 10%, toy_kernel: lots}\n")
    _, problems = problems_of(path)
    assert any("thresholds.toy_kernal: not a registered technique" in p for p in problems)
    assert any("thresholds.toy_kernel: 'lots' is not valid" in p for p in problems)
