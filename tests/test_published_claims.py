"""The table of published claims (gpubench.published_claims) and the techniques that declare them."""
from gpubench import techniques
from gpubench.published_claims import PUBLISHED


def test_every_table_entry_is_a_registered_technique_that_declares_exactly_its_claims():
    """A claim in the table is read against a run only through its technique's declaration: an
    entry under a misspelt name, or a technique declaring other claims than its entry, would leave
    a published figure in the table that no report ever checks."""
    registry = techniques.all_techniques()
    for name, claims in PUBLISHED.items():
        assert name in registry, f"{name}: in the table, not a registered technique"
        assert tuple(registry[name].claims) == claims, f"{name} declares other claims than its table entry"


def test_every_claim_in_the_table_can_be_judged_on_the_cases_of_its_technique():
    """A claim's ``when`` conditions name params of its technique (a param it does not have can never
    be compared, so the claim would read "not comparable" on every case, silently)."""
    registry = techniques.all_techniques()
    for name, claims in PUBLISHED.items():
        params = {p.name for p in registry[name].params}
        for claim in claims:
            assert set(claim.when) <= params, f"{name}: {claim.text!r} conditions on {set(claim.when) - params}"
