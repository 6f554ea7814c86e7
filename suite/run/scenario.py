"""Scenario files: YAML -> validated :class:`Scenario` -> list of :class:`Case`.

Validation happens before anything runs and reports every problem at once, each with the file,
the line and the key, e.g. ``scenarios/x.yaml:12: flash_attention.head_dim: 80 is not one of
[32, 64, 96, 128]``.

Format::

    name: smoke                      # required
    description: CPU-sized check     # optional
    device: auto                     # auto | cpu | cuda | cuda:N
    seed: 0                          # optional; added to each case's own seed
    policy: {min_reps: 5, ...}       # see gpubench.measure.timing.Policy
    thresholds: {flash_attention: 10%}  # optional: per-technique slowdown the gate tolerates
    order: [moe_grouping, flash_attention]  # optional: --budget runs these techniques' cases first
    model: {name: gpt-oss-20b, ...}  # optional: what `gpubench run --model` generated from (MODEL_KEYS)
    entries:                         # required, non-empty
      - technique: flash_attention   # or a module (my_pkg.my_pair) or a .py file beside this one
        params: {seq_len: [128, 256], causal: [false, true]}   # lists expand as a cartesian product
        policy: {max_reps: 20}       # optional per-entry override
        variants: [optimized, sdpa]  # optional subset: names or roles (the baseline is always kept)
        note: sliding layers (12 of 24)  # optional free text: what the case stands for (the report shows it)
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.resources
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpubench import techniques
from gpubench.contract import Param
from gpubench.errors import BadInput
from gpubench.records.case_ids import id_pairs
from gpubench.records.model_origin import MODEL_KEYS, MODEL_WORKLOADS
from gpubench.records.policy import POLICY_PARAMS, Policy, parse_threshold, policy_problems
from gpubench.techniques import catalog

TOP_KEYS = ("name", "description", "device", "seed", "policy", "thresholds", "order", "model", "entries")
ENTRY_KEYS = ("technique", "params", "policy", "variants", "note")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
DEVICE_ALLOWED = "auto, cpu, cuda or cuda:N"


@dataclass(frozen=True)
class Case:
    """One technique at one point of the parameter grid."""

    technique: str
    params: dict[str, Any]  # every param of the technique: scenario values over defaults
    policy: Policy
    seed: int
    variants: tuple[str, ...] | None = None  # None: all; names, or roles resolved on the device
    # param -> its declared default, for the params declared ``omit_default_from_id`` (added after
    # runs were recorded): at that default the id leaves them out, so it (and the seed drawn from
    # it) stays what it was before they existed and `compare` and the history still match the case.
    id_omits: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        inner = ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items() if not self._at_omitted_default(k, v))
        return f"{self.technique}[{inner}]"

    def _at_omitted_default(self, key: str, value: Any) -> bool:
        # equal as values (a float param's 0 and 0.0 are one value; a bool is never a number here)
        if key not in self.id_omits:
            return False
        default = self.id_omits[key]
        return isinstance(value, bool) == isinstance(default, bool) and value == default


def id_omits(params: Iterable[Param]) -> dict[str, Any]:
    """A technique's (or catalogue entry's) :attr:`Case.id_omits`: name -> default of each param
    declared ``omit_default_from_id``."""
    return {p.name: p.default for p in params if p.omit_default_from_id}


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class Entry:
    technique: str
    grid: dict[str, list[Any]]  # param -> values to sweep (defaults fill the rest)
    policy: Policy
    variants: tuple[str, ...] | None
    line: int
    note: str | None = None  # what the entry's cases stand for (e.g. "sliding layers (12 of 24)")

    @property
    def size(self) -> int:
        """How many cases the entry expands to."""
        return math.prod(len(values) for values in self.grid.values())


@dataclass
class Scenario:
    name: str
    description: str
    device: str
    policy: Policy
    seed: int
    entries: list[Entry]
    path: Path
    text: str = field(repr=False, default="")
    thresholds: dict[str, float] = field(default_factory=dict)  # technique -> slowdown fraction
    order: tuple[str, ...] = ()  # techniques whose cases go first in a --budget run's rounds
    model: dict[str, Any] | None = None  # the `model` block of a scenario generated from a model

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def cases(self, only: list[str] | None = None, repeat_scale: float = 1.0) -> list[Case]:
        return list(self.iter_cases(only, repeat_scale))

    def iter_cases(self, only: list[str] | None = None, repeat_scale: float = 1.0) -> Iterator[Case]:
        """The cases one by one, in run order (a dry run reads the first few of a huge sweep)."""
        for entry in self.entries:
            if not only or entry.technique in only:
                yield from self.entry_cases(entry, repeat_scale)

    def entry_cases(self, entry: Entry, repeat_scale: float = 1.0) -> Iterator[Case]:
        tech = catalog.declaration(entry.technique)
        assert tech is not None  # validated at load
        defaults = tech.defaults()
        policy = entry.policy.scaled(repeat_scale) if repeat_scale != 1.0 else entry.policy
        omits = id_omits(tech.params)
        keys = list(entry.grid)
        for combo in itertools.product(*(entry.grid[k] for k in keys)):
            params = {**defaults, **dict(zip(keys, combo))}
            case = Case(entry.technique, params, policy, 0, entry.variants, omits)
            yield dataclasses.replace(case, seed=case_seed(case.id, self.seed))

    def varying(self, only: list[str] | None = None) -> dict[str, set[str]]:
        """Per technique, the params a case label needs: those whose value differs between its
        cases (for a technique with one case, those the scenario sets), from the grids alone."""
        values: dict[str, dict[str, set[str]]] = {}  # technique -> param -> the values' reprs
        set_keys: dict[str, set[str]] = {}
        for entry in self.entries:
            if only and entry.technique not in only:
                continue
            declared = catalog.declaration(entry.technique)
            if declared is None:  # (a loaded scenario's techniques are all known here: never so)
                continue
            defaults = declared.defaults()
            seen = values.setdefault(entry.technique, {})
            for key, default in defaults.items():
                seen.setdefault(key, set()).update(map(repr, entry.grid.get(key, [default])))
            set_keys.setdefault(entry.technique, set()).update(entry.grid)
        return {t: {k for k, v in seen.items() if len(v) > 1} or set_keys[t] for t, seen in values.items()}

    def count(self, only: list[str] | None = None) -> dict[str, int]:
        """Cases per technique, counted without building them (a 250,000-case sweep in microseconds)."""
        out: dict[str, int] = {}
        for entry in self.entries:
            if not only or entry.technique in only:
                out[entry.technique] = out.get(entry.technique, 0) + entry.size
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "device": self.device,
            "seed": self.seed,
            "path": str(self.path),
            "sha256": self.sha256,
            "policy": self.policy.to_dict(),
            "thresholds": self.thresholds,
            **({"order": list(self.order)} if self.order else {}),
            **({"model": self.model} if self.model is not None else {}),
            "entries": [
                {
                    "technique": e.technique,
                    "params": e.grid,
                    "policy": e.policy.to_dict(),
                    "variants": list(e.variants) if e.variants else None,
                    **({"note": e.note} if e.note is not None else {}),
                }
                for e in self.entries
            ],
        }


def case_seed(case_id: str, scenario_seed: int = 0) -> int:
    """A stable seed per case: the same case draws the same inputs in every run."""
    digest = hashlib.sha256(case_id.encode()).digest()
    return (int.from_bytes(digest[:4], "little") + scenario_seed) % (2**31)


# --------------------------------------------------------------------------------------------
# Finding scenario files


def shipped_scenarios() -> dict[str, Path]:
    root = importlib.resources.files("gpubench.scenarios")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}


def resolve(name_or_path: str) -> Path:
    """A path to an existing file, or the name of a shipped scenario."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        yamls = sorted(p.name for p in path.glob("*.y*ml"))[:5]
        raise BadInput(
            f"scenario {name_or_path!r}: is a directory, not a scenario file; give a YAML file"
            + (f" (here: {', '.join(yamls)})" if yamls else "")
            + " or a shipped scenario name."
        )
    shipped = shipped_scenarios()
    stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
    if stem in shipped:
        return shipped[stem]
    hint = difflib.get_close_matches(stem, shipped, n=1)
    raise BadInput(
        f"scenario {name_or_path!r}: no such file and no shipped scenario of that name"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f"; shipped scenarios: {', '.join(sorted(shipped))}; or give a path to a YAML file."
    )


# --------------------------------------------------------------------------------------------
# Loading with line numbers


class _Located:
    """A YAML document as Python values plus the line of every key path."""

    def __init__(self, node: yaml.Node):
        self.lines: dict[tuple, int] = {}
        self.duplicates: list[tuple[tuple, int]] = []
        self.bad_keys: list[tuple[tuple, int]] = []
        self._constructor = yaml.constructor.SafeConstructor()
        self.value = self._convert(node, ())

    def _build(self, node: yaml.Node) -> Any:
        """The Python value of a key or scalar node; _BadValue (its line) where YAML cannot build
        it: an unknown tag, a merge key, a date that does not exist."""
        if node.tag == "tag:yaml.org,2002:merge":
            raise _BadValue(node.start_mark.line + 1, "a merge key (<<) is not read here; write the keys out")
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or node.start_mark
            raise _BadValue(mark.line + 1, getattr(exc, "problem", None) or str(exc)) from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise _BadValue(node.start_mark.line + 1, f"{node.value!r} cannot be read ({exc})") from None

    def _convert(self, node: yaml.Node, path: tuple) -> Any:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self._build(key_node)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    self.bad_keys.append((path, key_node.start_mark.line + 1))
                    continue
                if key in out:
                    self.duplicates.append((path + (key,), key_node.start_mark.line + 1))
                out[key] = self._convert(value_node, path + (key,))
                self.lines[path + (key,)] = key_node.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(item, path + (i,)) for i, item in enumerate(node.value)]
        return self._build(node)

    def line(self, path: tuple) -> int:
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)


def load(name_or_path: str | Path, cross_checks: bool = True) -> Scenario:
    """Load and validate a scenario; raise :class:`BadInput` listing every problem.
    ``cross_checks=False`` leaves out the techniques' own cross-param rules (``validate_fn``: their
    code, so torch), for a reader that only counts a shipped scenario's cases (``gpubench list``)."""
    path = resolve(str(name_or_path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the scenario file: {exc}") from None
    return parse(text, path, cross_checks)


def parse(text: str, path: Path, cross_checks: bool = True) -> Scenario:
    """The scenario in YAML ``text`` (from ``path``, which every problem names), validated; raise
    :class:`BadInput` listing every problem, or the one that stops reading (invalid YAML, an empty
    file, a document that is no mapping). A technique's own rules across its params (its
    ``validate_fn``: code, so torch) are checked last, and only when nothing else was wrong, so a
    scenario refused for its keys or values is refused without importing any technique code."""
    doc = _compose(text, path)
    problems = _key_problems(doc, path)

    def bad(key_path: tuple, label: str, message: str) -> None:
        problems.append(f"{path}:{doc.line(key_path)}: {label}: {message}")

    data = doc.value
    if not isinstance(data, dict):
        raise BadInput(f"{path}:1: a scenario must be a mapping with keys {', '.join(TOP_KEYS)}")
    for key in data:
        if key not in TOP_KEYS:
            bad((key,), str(key), f"unknown key; allowed: {', '.join(TOP_KEYS)}")
    name, description, device, seed = _header(data, path, bad)
    policy = _policy(data.get("policy", {}), Policy(), ("policy",), "policy", bad)
    pending: list[tuple[Any, dict[str, list[Any]], tuple]] = []  # (technique, grid, where): rules to check
    entries = _entries(data.get("entries"), policy, doc, path, bad, pending)
    thresholds = _thresholds(data.get("thresholds", {}), bad)
    order = _order(data.get("order", []), {e.technique for e in entries}, bad)
    model = _model(data["model"], bad) if "model" in data else None

    checked = cross_checks and not problems
    if checked:
        for tech, grid, where in pending:
            _check_combinations(tech, grid, where, bad)
    if problems:
        deferred = (
            " (the techniques' own rules across params are checked once these are fixed)"
            if cross_checks and not checked and any(_has_rules(tech) for tech, _, _ in pending)
            else ""
        )
        raise BadInput(
            f"{path}: the scenario is not valid ({len(problems)} problem"
            f"{'s' if len(problems) > 1 else ''}){deferred}; nothing was run:",
            problems,
        )
    return Scenario(
        name=name,
        description=description,
        device=device,
        policy=policy,
        seed=seed,
        entries=entries,
        path=path,
        text=text,
        thresholds=thresholds,
        order=order,
        model=model,
    )


# libyaml's parser where PyYAML was built with it (the wheels are): ~10x faster than the pure-Python
# one (gpubench list reads every shipped scenario), and on a valid file the same nodes and marks.
# They differ on invalid ones: libyaml's messages say less ("found character that cannot start any
# token", not which), and it lets tabs pass where the Python parser refuses them. So a file with a
# tab, or one libyaml refuses, is read by the Python parser: the verdict and the message are the
# same whether or not PyYAML has libyaml.
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _compose_node(text: str) -> yaml.Node | None:
    if _FAST_LOADER is None or "\t" in text:
        return _compose_in_python(text)
    try:
        return yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.YAMLError as fast_error:
        try:
            return yaml.compose(text, Loader=yaml.SafeLoader)
        except RecursionError:  # nested past Python's stack: libyaml's refusal says so
            raise fast_error from None


def _compose_in_python(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:  # the parser recurses per level: a refusal, not a traceback
        raise yaml.YAMLError("exceeded maximum nesting depth") from None


class _BadValue(Exception):
    """A scalar YAML parses but cannot build (``!foo x``, ``2020-13-45``), at ``line``."""

    def __init__(self, line: int, problem: str):
        super().__init__(problem)
        self.line = line


def _compose(text: str, path: Path) -> _Located:
    """The YAML document of ``text`` with the line of every key; BadInput (its line) for invalid
    YAML, a value YAML cannot build, or an empty file."""
    try:
        node = _compose_node(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(f"{path}:{line}: invalid YAML: {problem}") from None
    if node is None:
        raise BadInput(f"{path}:1: the scenario file is empty; it needs at least 'name' and 'entries'.")
    try:
        return _Located(node)
    except _BadValue as exc:
        raise BadInput(f"{path}:{exc.line}: invalid YAML value: {exc}") from None


def _key_problems(doc: _Located, path: Path) -> list[str]:
    """Keys YAML allows and a scenario does not: a list or mapping as a key, a key given twice."""
    problems = []
    for key_path, line in doc.bad_keys:
        problems.append(
            f"{path}:{line}: {'.'.join(map(str, key_path)) or '(top level)'}: "
            f"a key must be a plain name, not a list or mapping"
        )
    for dup_path, line in doc.duplicates:
        problems.append(f"{path}:{line}: {'.'.join(map(str, dup_path))}: key given twice")
    return problems


def _header(data: dict[Any, Any], path: Path, bad) -> tuple[str, str, str, int]:
    """``name``, ``description``, ``device`` and ``seed``; each that is not valid is reported and
    replaced by its default (the file's stem for the name), so validation goes on."""
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        bad(("name",), "name", "required, a non-empty string")
        name = path.stem
    description = data.get("description", "")
    if not isinstance(description, str):
        bad(("description",), "description", "must be a string")
        description = ""
    device = data.get("device", "auto")
    if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
        bad(("device",), "device", f"{device!r} is not valid; allowed: {DEVICE_ALLOWED}")
        device = "auto"
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        bad(("seed",), "seed", f"{seed!r} is not valid; allowed: an integer >= 0")
        seed = 0
    return name, description, device, seed


def _entries(
    raw_entries: Any,
    policy: Policy,
    doc: _Located,
    path: Path,
    bad,
    pending: list[tuple[Any, dict[str, list[Any]], tuple]],
) -> list[Entry]:
    """``entries``: each valid one with the line it starts on (a technique given as a .py file is
    looked up beside the scenario file); each valid entry's technique and grid go on ``pending``
    for its cross-param rules."""
    entries: list[Entry] = []
    if not isinstance(raw_entries, list) or not raw_entries:
        bad(("entries",), "entries", "required, a non-empty list of {technique, params} mappings")
        raw_entries = []
    for i, raw in enumerate(raw_entries):
        entry = _entry(raw, i, policy, bad, Path(path).resolve().parent, pending)
        if entry is not None:
            entry.line = doc.line(("entries", i))
            entries.append(entry)
    return entries


def _thresholds(raw: Any, bad) -> dict[str, float]:
    """``thresholds: {technique: 10%}``: the slowdown the regression gate tolerates per technique."""
    if not isinstance(raw, dict):
        bad(("thresholds",), "thresholds", "must be a mapping of technique: slowdown (e.g. 10% or 0.1)")
        return {}
    out = {}
    registry = catalog.declared()
    for key, value in raw.items():
        if key not in registry:
            bad(("thresholds", key), f"thresholds.{key}", f"not a registered technique; allowed: {', '.join(registry)}")
            continue
        try:
            out[key] = parse_threshold(value, "")
        except BadInput:
            bad(
                ("thresholds", key),
                f"thresholds.{key}",
                f"{value!r} is not valid; allowed: a slowdown such as 10% or 0.1",
            )
    return out


def _order(raw: Any, in_scenario: set[str], bad) -> tuple[str, ...]:
    """``order: [technique, ...]``: under ``--budget`` the cases run breadth-first, these
    techniques first in each round (the others after them, as they first appear)."""
    allowed = ", ".join(sorted(in_scenario)) or "the techniques of the entries"
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        bad(("order",), "order", f"must be a list of technique names; allowed: {allowed}")
        return ()
    seen: list[str] = []
    for i, name in enumerate(raw):
        if name in seen:
            bad(("order", i), "order", f"{name!r} is given twice")
        elif name not in in_scenario:
            bad(("order", i), "order", f"{name!r} is not a technique of this scenario's entries; allowed: {allowed}")
        else:
            seen.append(name)
    return tuple(seen)


def _model(raw: Any, bad) -> dict[str, Any] | None:
    """``model:``, what a scenario generated by ``gpubench run --model`` was generated from: a
    mapping of :data:`MODEL_KEYS`, each optional; ``not_applicable`` a list of {technique, reason}."""
    if not isinstance(raw, dict):
        bad(("model",), "model", f"must be a mapping; allowed keys: {', '.join(MODEL_KEYS)}")
        return None
    ok = True
    for key, value in raw.items():
        types = MODEL_KEYS.get(key)
        if types is None:
            bad(("model", key), f"model.{key}", f"unknown key; allowed: {', '.join(MODEL_KEYS)}")
            ok = False
        elif not isinstance(value, types) or isinstance(value, bool):
            kinds = " or ".join(
                {"str": "a string", "int": "an integer", "float": "a number", "list": "a list"}[t.__name__]
                for t in types
            )
            bad(("model", key), f"model.{key}", f"{value!r} is not valid; allowed: {kinds}")
            ok = False
    if isinstance(raw.get("workload"), str) and raw["workload"] not in MODEL_WORKLOADS:
        bad(
            ("model", "workload"),
            "model.workload",
            f"{raw['workload']!r} is not valid; allowed: {', '.join(MODEL_WORKLOADS)}",
        )
        ok = False
    if isinstance(raw.get("sizing"), list) and not all(isinstance(s, str) for s in raw["sizing"]):
        bad(("model", "sizing"), "model.sizing", "must be a list of strings")
        ok = False
    listed = raw.get("not_applicable")
    for i, item in enumerate(listed if isinstance(listed, list) else []):
        if not (
            isinstance(item, dict)
            and set(item) == {"technique", "reason"}
            and all(isinstance(v, str) for v in item.values())
        ):
            bad(
                ("model", "not_applicable", i),
                f"model.not_applicable[{i}]",
                "must be a mapping {technique: NAME, reason: TEXT}",
            )
            ok = False
    return dict(raw) if ok else None


def _policy(raw: Any, base: Policy, key_path: tuple, label: str, bad) -> Policy:
    if not isinstance(raw, dict):
        bad(key_path, label, f"must be a mapping of policy keys; allowed keys: {', '.join(POLICY_PARAMS)}")
        return base
    problems = policy_problems({**{k: v for k, v in base.to_dict().items() if k in ("min_reps", "max_reps")}, **raw})
    for key, message in problems.items():
        bad(key_path + (key,), f"{label}.{key}", message)
    if problems:
        return base
    return dataclasses.replace(base, **{k: POLICY_PARAMS[k].coerce(v) for k, v in raw.items()})


def _entry(
    raw: Any,
    i: int,
    scenario_policy: Policy,
    bad,
    base_dir: Path | None = None,
    pending: list[tuple[Any, dict[str, list[Any]], tuple]] | None = None,
) -> Entry | None:
    """One entry, checked against its technique's declarations: a built-in's from the catalogue
    (no technique code), a plug-in's from its module. A valid entry's technique and grid go on
    ``pending``, for its cross-param rules (``validate_fn``), checked by :func:`parse` last."""
    where = ("entries", i)
    if not isinstance(raw, dict):
        bad(where, f"entries[{i}]", "must be a mapping with keys technique, params")
        return None
    for key in raw:
        if key not in ENTRY_KEYS:
            bad(where + (key,), f"entries[{i}].{key}", f"unknown key; allowed: {', '.join(ENTRY_KEYS)}")
    spec = raw.get("technique")
    registry = catalog.declared()
    if not isinstance(spec, str) or not spec.strip():
        bad(
            where + ("technique",),
            f"entries[{i}].technique",
            f"{spec!r} is not valid; allowed: {', '.join(registry)}, a module (my_pkg.my_pair) or a .py file",
        )
        return None
    if spec not in registry and "." not in spec and "/" not in spec and difflib.get_close_matches(spec, registry, n=1):
        hint = difflib.get_close_matches(spec, registry, n=1)[0]
        bad(
            where + ("technique",),
            f"entries[{i}].technique",
            f"{spec!r} is not a registered technique (did you mean {hint!r}?); allowed: {', '.join(registry)}, "
            "a module (my_pkg.my_pair) or a .py file",
        )
        return None
    try:
        tech = catalog.load(spec, base_dir)
    except BadInput as exc:
        bad(where + ("technique",), f"entries[{i}].technique", str(exc))
        return None
    name = tech.name
    grid, ok = _grid(tech, raw, where, bad)
    policy = _policy(raw.get("policy", {}) or {}, scenario_policy, where + ("policy",), f"{name}.policy", bad)
    variants, variants_ok = _variants(tech, raw, where, bad)
    ok = ok and variants_ok
    note = raw.get("note")
    if note is not None and not isinstance(note, str):
        bad(where + ("note",), f"{name}.note", f"{note!r} is not valid; allowed: a string (what the cases stand for)")
        ok = False
    if ok and pending is not None and _has_rules(tech):
        pending.append((tech, grid, where))
    return Entry(technique=name, grid=grid, policy=policy, variants=variants, line=0, note=note) if ok else None


def _grid(
    tech: catalog.Declared | techniques.Technique, raw: dict[Any, Any], where: tuple, bad
) -> tuple[dict[str, list[Any]], bool]:
    """An entry's ``params``: each key's values (a list sweeps them), coerced; and whether all were valid."""
    name = tech.name
    ok = True

    grid: dict[str, list[Any]] = {}
    params = raw.get("params", {}) or {}
    if not isinstance(params, dict):
        bad(where + ("params",), f"{name}.params", "must be a mapping of param: value or [values]")
        params, ok = {}, False
    for key, value in params.items():
        spec = tech.param(key)
        if spec is None:
            bad(
                where + ("params", key),
                f"{name}.{key}",
                f"unknown param; allowed: {', '.join(p.name for p in tech.params)}",
            )
            ok = False
            continue
        values = value if isinstance(value, list) else [value]
        if not values:
            bad(where + ("params", key), f"{name}.{key}", "an empty list sweeps nothing; give at least one value")
            ok = False
        coerced = []
        for j, v in enumerate(values):
            item_path = where + ("params", key) + ((j,) if isinstance(value, list) else ())
            problem = spec.problem(v)
            if problem is not None:
                bad(item_path, f"{name}.{key}", problem)
                ok = False
            else:
                coerced.append(spec.coerce(v))
        grid[key] = coerced
    return grid, ok


def _variants(
    tech: catalog.Declared | techniques.Technique, raw: dict[Any, Any], where: tuple, bad
) -> tuple[tuple[str, ...] | None, bool]:
    """An entry's ``variants`` (None: all), the baseline put first; and whether they were valid."""
    name = tech.name
    ok = True
    variants = raw.get("variants")
    allowed = ", ".join([*tech.variants, "baseline", "optimized"])
    if variants is not None:
        if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants) or not variants:
            bad(
                where + ("variants",),
                f"{name}.variants",
                f"must be a list of variant names or roles; allowed: {allowed}",
            )
            variants, ok = None, False
        else:
            for j, v in enumerate(variants):
                if v not in tech.variants and v not in ("baseline", "optimized"):
                    bad(
                        where + ("variants", j),
                        f"{name}.variants",
                        f"{v!r} is not a variant of {name}; allowed: {allowed} (a role names the variant "
                        "playing it on the device)",
                    )
                    ok = False
            # The baseline is always measured: every other variant is checked and timed against it.
            variants = tuple(dict.fromkeys(["baseline", *variants]))
    return variants, ok


def _has_rules(tech: Any) -> bool:
    """Whether a technique (or a catalogued built-in's declarations) has cross-param rules."""
    return tech.validates if isinstance(tech, catalog.Declared) else tech.validate_fn is not None


def _validate_fn(tech: Any) -> Any:
    """A technique's cross-param rules: code, so a catalogued built-in's come from its module
    (the registry imports it, and torch, here: only once nothing else in the scenario is wrong)."""
    if isinstance(tech, catalog.Declared):
        built_in = techniques.get(tech.name) if tech.validates else None  # (a catalogued name: registered)
        return built_in.validate_fn if built_in is not None else None
    return tech.validate_fn


def _check_combinations(tech: Any, grid: dict[str, list[Any]], where: tuple, bad) -> None:
    """The technique's own rules across params (its ``validate_fn``) on every point of the grid,
    each problem reported once."""
    name = tech.name
    validate_fn = _validate_fn(tech)
    if validate_fn is None:
        return
    seen = set()
    keys = list(grid)
    for combo in itertools.product(*(grid[k] for k in keys)):
        full = {**tech.defaults(), **dict(zip(keys, combo))}
        for problem in validate_fn(full):
            if problem not in seen:
                seen.add(problem)
                bad(where + ("params",), f"{name}.params", problem)


def rule_problems(tech: Any, params: dict[str, Any]) -> list[str]:
    """The technique's own rules across params (its ``validate_fn``, as :func:`parse` checks an
    entry) on ``params`` over its defaults, a list value standing for each of its items; [] where
    it has none. Imports the technique's code (torch) for a catalogued built-in."""
    grid = {k: v if isinstance(v, list) else [v] for k, v in params.items()}
    found: list[str] = []
    _check_combinations(tech, grid, (), lambda where, label, problem: found.append(problem))
    return found


# --------------------------------------------------------------------------------------------
# One case, for `gpubench profile`


def one_case_scenario(
    target: str, params: list[str], scenario_name: str | None, device: str, calls: int | None = None
) -> Scenario:
    """The scenario ``gpubench profile`` runs: one case with ``policy.profile`` on. ``target`` is a
    technique or a case id (``moe_grouping[tokens=512,...]``); with ``scenario_name`` the case and
    its policy come from that scenario (the case with that id, or the technique's first case);
    ``params`` (``KEY=VALUE``) override. Validated as a scenario file is (BadInput, exit 2)."""
    technique, _, inner = target.partition("[")
    from_id = _parse_pairs(id_pairs(inner.rstrip("]")), "the case id") if inner else {}
    overrides = _parse_pairs(list(params), "--param")
    if techniques.get(technique) is None:
        raise BadInput(
            f"profile: {technique!r} is not a registered technique; allowed: "
            f"{', '.join(techniques.all_techniques())} (or a case id such as {technique}[tokens=512])."
        )
    policy: dict[str, Any] = {}
    case_params: dict[str, Any] = {}
    if scenario_name is not None:
        chosen = _case_to_profile(load(scenario_name), technique, target if inner else None)
        case_params, policy = dict(chosen.params), chosen.policy.to_dict()
    case_params.update(from_id)
    case_params.update(overrides)
    policy.update(profile=True, **({"profile_calls": calls} if calls is not None else {}))
    text = yaml.safe_dump(
        {
            "name": f"profile-{technique}",
            "device": device,
            "policy": policy,
            "entries": [
                {
                    "technique": technique,
                    "params": {k: [v] if isinstance(v, list) else v for k, v in case_params.items()},
                }
            ],
        },
        sort_keys=False,
    )
    return parse(text, Path(f"gpubench profile {target}"))


def _case_to_profile(scen: Scenario, technique: str, case_id: str | None) -> Case:
    """The scenario's case with ``case_id``, or its first case of ``technique``; BadInput if none."""
    cases = list(scen.iter_cases(only=[technique]))
    if not cases:
        raise BadInput(
            f"--scenario: {scen.name} ({scen.path}) has no case of {technique}; its techniques: "
            f"{', '.join(sorted({e.technique for e in scen.entries}))}."
        )
    chosen = next((c for c in cases if c.id == case_id), None) if case_id is not None else cases[0]
    if chosen is None:
        raise BadInput(
            f"profile: {scen.name} ({scen.path}) has no case {case_id}; its {technique} cases: "
            f"{', '.join(c.id for c in cases[:5])}{' ...' if len(cases) > 5 else ''}."
        )
    return chosen


def _parse_pairs(pairs: list[str], where: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each value read as YAML (``tokens=512`` is an int); BadInput otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"{where}: {pair!r} is not valid; allowed: KEY=VALUE, e.g. tokens=512.")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out
