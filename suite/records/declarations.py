"""What a run records of each technique it measured, so that its report needs no technique code.

A technique's declarations (summary, anchor, headline figures, plots, claims, param meanings) are
code today and may be renamed, changed or gone tomorrow (or came from a plug-in that is not
installed where the report is drawn). :class:`TechniqueRecord` is their data: written into
results.json by the run's own process (:func:`record_of`, through the registry, where a plug-in
is importable) and read back by the report, so an old run is drawn and judged by the
declarations of its day.

This module never imports the registry (nor does ``gpubench.records.results`` or ``gpubench.reports``):
whatever needs it takes a :class:`Registry` from its caller (the runner, the CLI), which already
has one (``gpubench.techniques`` is one). Three things use it: :func:`declare` (the run's process
recording its techniques), :func:`legacy_record`, the fallback for runs of schema versions 1 and
2, which recorded no declarations, and :func:`figures_hook`, a technique's own figure function
(``figures_fn``: code, which cannot be stored). Without a registry a record is read as data only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpubench.contract import Headline, Plot
from gpubench.records.claims import FALLBACK_CLAIMS, Claim


def _rebuild(cls: type, data: Mapping[str, Any]) -> Any:
    """A frozen declaration (:class:`Plot`, :class:`Headline`) from its dict: keys this version
    does not know are ignored (a newer minor version may add fields), lists become tuples."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ParamRecord:
    """A param as the report explains it: its name, type, default, meaning and allowed values."""

    name: str
    type: str
    default: Any
    help: str = ""
    allowed: str = ""

    @classmethod
    def of(cls, param: Any) -> ParamRecord:
        return cls(param.name, param.type_name, param.default, param.help, param.allowed())


@dataclass(frozen=True)
class TechniqueRecord:
    """One technique's declarations as the run recorded them."""

    name: str
    summary: str = ""
    shape: str = ""
    anchor: str = ""
    gpu_specific: str = ""
    source: str = ""
    headline: str = ""  # the legacy headline metric key
    headline_figures: tuple[Headline, ...] = ()
    gate_metric: str = ""
    plots: tuple[Plot, ...] = ()
    claims: tuple[Claim, ...] = ()
    params: tuple[ParamRecord, ...] = ()
    figures_hook: bool = False  # the technique had its own figure function (code: not recorded)

    @classmethod
    def of(cls, tech: Any) -> TechniqueRecord:
        """The declarations of a registered :class:`gpubench.contract.Technique`."""
        return cls(
            tech.name,
            tech.summary,
            tech.shape,
            tech.anchor,
            tech.gpu_specific,
            tech.source,
            getattr(tech, "headline", ""),
            tuple(tech.headline_figures),
            tech.gate_metric,
            tuple(tech.plots),
            tuple(tech.claims),
            tuple(ParamRecord.of(p) for p in tech.params),
            getattr(tech, "figures_fn", None) is not None,
        )

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def to_dict(self) -> dict[str, Any]:
        # asdict recurses into the Headline, Plot, Claim and ParamRecord dataclasses, whatever
        # fields they have (a field added to Headline is recorded without a change here).
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TechniqueRecord:
        plain = {f.name for f in dataclasses.fields(cls)} - {"headline_figures", "plots", "claims", "params"}
        return cls(
            **{k: v for k, v in data.items() if k in plain},
            headline_figures=tuple(_rebuild(Headline, h) for h in data.get("headline_figures") or ()),
            plots=tuple(_rebuild(Plot, p) for p in data.get("plots") or ()),
            claims=tuple(Claim.from_dict(c) for c in data.get("claims") or ()),
            params=tuple(_rebuild(ParamRecord, p) for p in data.get("params") or ()),
        )


@dataclass
class Declarations:
    """What a run records of techniques: those it measured (by name) and the published claims of
    the registered techniques it did not include (the report folds them into one line)."""

    techniques: dict[str, TechniqueRecord] = field(default_factory=dict)
    claims_elsewhere: dict[str, tuple[Claim, ...]] = field(default_factory=dict)

    def to_dicts(self) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        return (
            {n: t.to_dict() for n, t in self.techniques.items()},
            {n: [c.to_dict() for c in claims] for n, claims in self.claims_elsewhere.items()},
        )

    @classmethod
    def from_dicts(cls, techniques: Mapping[str, Any] | None, elsewhere: Mapping[str, Any] | None) -> Declarations:
        return cls(
            {n: TechniqueRecord.from_dict(t) for n, t in (techniques or {}).items()},
            {n: tuple(Claim.from_dict(c) for c in claims) for n, claims in (elsewhere or {}).items()},
        )


# -- the run's process: the registry, passed in ---------------------------------------------------
class Registry(Protocol):
    """What records and reports are given to reach technique code: the technique registry
    (``gpubench.techniques`` is one), passed in by the caller that imported it (the runner, the
    CLI); records and reports never import it themselves."""

    def find(self, name: str, source: str = "") -> Any: ...

    def all_techniques(self) -> Mapping[str, Any]: ...


def record_of(registry: Registry, name: str, source: str = "") -> TechniqueRecord | None:
    """The declarations of technique ``name`` (from ``source`` when not registered), read in the
    run's process where a plug-in is importable; None when it cannot be found."""
    tech = registry.find(name, source)
    return TechniqueRecord.of(tech) if tech is not None else None


def claims_elsewhere(registry: Registry, measured: Sequence[str]) -> dict[str, tuple[Claim, ...]]:
    """The claims of every registered technique (and of those known only by their claims) not in
    ``measured``."""
    out = {n: tuple(t.claims) for n, t in registry.all_techniques().items() if n not in measured and t.claims}
    out.update({n: c for n, c in FALLBACK_CLAIMS.items() if n not in measured and n not in out})
    return out


def declare(held: Declarations, wanted: Mapping[str, str], registry: Registry) -> None:
    """Add to ``held`` the declarations of the techniques in ``wanted`` (name -> source) it does
    not hold yet, and the claims of the registered techniques not among them."""
    for name, source in wanted.items():
        if name not in held.techniques:
            found = record_of(registry, name, source)
            if found is not None:
                held.techniques[name] = found
    held.claims_elsewhere = claims_elsewhere(registry, [*wanted, *held.techniques])


# -- the report's reaches for code, through the registry its caller gave -------------------------
def legacy_record(registry: Registry | None, name: str, source: str = "") -> TechniqueRecord | None:
    """FALLBACK FOR OLD RUNS ONLY (schema versions 1 and 2 recorded no declarations): the given
    registry's declarations of ``name``, None when it does not know it or none was given. A run
    of version 3 is never read through this."""
    return record_of(registry, name, source) if registry is not None else None


def legacy_claims_elsewhere(registry: Registry | None, measured: Sequence[str]) -> dict[str, tuple[Claim, ...]]:
    """FALLBACK FOR OLD RUNS ONLY: the registry's claims of the techniques a v1/v2 run left out
    (none without a registry)."""
    return claims_elsewhere(registry, measured) if registry is not None else {}


def figures_hook(
    record: TechniqueRecord, registry: Registry | None = None
) -> tuple[Callable[[list[dict[str, Any]]], list[Any]] | None, str]:
    """A technique's own figure function (deprecated ``figures_fn``) when its code can be found
    through ``registry`` (the caller's): ``(fn, "")``, or ``(None, why not)``; ``(None, "")``
    when it had none. The one place the report may call technique code, and only for this."""
    if not record.figures_hook:
        return None, ""
    if registry is None:
        return None, "no technique registry was given to the report (a figure function is code, not data)"
    try:
        tech = registry.find(record.name, record.source)
    except Exception as exc:  # noqa: BLE001 - the report goes on without the hook
        return None, f"its code cannot be loaded here ({type(exc).__name__}: {exc})"
    if tech is None or getattr(tech, "figures_fn", None) is None:
        where = record.source or record.name
        return None, f"its code ({where}) cannot be loaded here, and a figure function is code, not data"
    return tech.figures_fn, ""
