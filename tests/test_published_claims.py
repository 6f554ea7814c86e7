"""The published claims each built-in technique declares (its package's ``claims.py``, or inline)
and the params they are judged on."""

import importlib
import pkgutil

from gpubench import techniques


def claim_modules() -> dict[str, tuple]:
    """Technique name -> the CLAIMS of its package's claims module, for every package that has one."""
    found = {}
    for info in pkgutil.iter_modules(techniques.__path__):
        try:
            module = importlib.import_module(f"gpubench.techniques.{info.name}.claims")
        except ModuleNotFoundError:
            continue
        found[info.name] = module.CLAIMS
    return found


def test_every_claims_module_belongs_to_a_registered_technique_that_declares_exactly_its_claims():
    """A claim is read against a run only through its technique's declaration: a claims module in a
    package the registry does not know, or a technique declaring other claims than its module's,
    would leave a published figure that no report ever checks."""
    registry = techniques.all_techniques()
    modules = claim_modules()
    assert {"activation_offload", "packed_metadata", "moe_grouping", "speculative_decoding"} <= set(modules)
    for name, claims in modules.items():
        assert name in registry, f"{name}: has a claims module, not a registered technique"
        assert tuple(registry[name].claims) == tuple(claims), f"{name} declares other claims than its claims.py"


def test_every_declared_claim_can_be_judged_on_the_cases_of_its_technique():
    """A claim's ``when`` conditions name params of its technique (a param it does not have can never
    be compared, so the claim would read "not comparable" on every case, silently)."""
    for name, tech in techniques.all_techniques().items():
        params = {p.name for p in tech.params}
        for claim in tech.claims:
            assert set(claim.when) <= params, f"{name}: {claim.text!r} conditions on {set(claim.when) - params}"
