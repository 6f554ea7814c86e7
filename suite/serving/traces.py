"""Request traces: when requests arrive and how long their prompts and outputs are.

Arrivals (``arrival`` spec strings, as a scenario writes them):

- ``poisson:RATE``: exponential gaps with mean 1/RATE seconds (requests per second);
- ``gamma:RATE:BURSTINESS``: gamma-distributed gaps with the same mean and shape BURSTINESS, as
  ``vllm bench serve --burstiness`` draws them (1 is Poisson; below 1 burstier, above 1 steadier);
- ``all``: every request at time 0 (offline throughput; the engines' ``--no-wait``).

As ``vllm bench serve`` does (with a fixed rate, no ramp-up), the first request arrives one gap
after time 0 and the summed gaps are then rescaled so that the last of N requests arrives at
exactly N / RATE seconds: the trace's length, and so the offered load, does not vary with the
seed. A JSONL trace's times are used as they are (vLLM's self-timed traces).

Lengths (``prompt_len`` / ``output_len`` spec strings, tokens):

- ``fixed:N``; ``uniform:LO:HI`` (inclusive);
- ``exp:MEAN:CAP``: exponential with MEAN, at least 1, capped at CAP (the Anyscale continuous
  batching benchmark's output lengths);
- ``lognormal:MEAN:SIGMA:CAP``: lognormal with that mean and log-space sigma, in [1, CAP].

A JSONL trace file has one request per line: ``{"arrival_s": 0.12, "prompt_len": 40,
"output_len": 90}``, or ``"prompt": "text"`` instead of ``prompt_len`` (its UTF-8 bytes become the
token ids, modulo the vocabulary: the models here have no tokenizer of their own).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpubench.errors import BadInput


@dataclass
class Request:
    id: int
    arrival_s: float
    prompt: list[int]
    output_len: int
    seed: int = 0  # per-request sampling seed (sampled decoding draws from its own generator)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class Dist:
    kind: str
    args: tuple[float, ...]

    @property
    def mean(self) -> float:
        """The distribution's mean before rounding (and, for the capped ones, before the cap)."""
        if self.kind == "fixed":
            return self.args[0]
        if self.kind == "uniform":
            return (self.args[0] + self.args[1]) / 2
        return self.args[0]

    @property
    def max(self) -> int:
        return int(self.args[1] if self.kind == "uniform" else self.args[-1])

    def sample(self, n: int, gen: torch.Generator) -> list[int]:
        if self.kind == "fixed":
            return [int(self.args[0])] * n
        if self.kind == "uniform":
            lo, hi = int(self.args[0]), int(self.args[1])
            return torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
        if self.kind == "exp":
            mean, cap = self.args
            draws = torch.empty(n, dtype=torch.float64).exponential_(1.0 / mean, generator=gen)
            return [int(min(cap, max(1, round(x)))) for x in draws.tolist()]
        mean, sigma, cap = self.args  # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
        mu = math.log(mean) - sigma * sigma / 2
        draws = torch.empty(n, dtype=torch.float64).log_normal_(mu, sigma, generator=gen)
        return [int(min(cap, max(1, round(x)))) for x in draws.tolist()]


_LENGTH_FORMS = {"fixed": 1, "uniform": 2, "exp": 2, "lognormal": 3}
LENGTH_HELP = "fixed:N, uniform:LO:HI, exp:MEAN:CAP or lognormal:MEAN:SIGMA:CAP"
ARRIVAL_HELP = "poisson:RATE, gamma:RATE:BURSTINESS or all"


def _numbers(spec: str, parts: list[str], what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what} {spec!r}: {':'.join(parts)!r} are not numbers") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{what} {spec!r}: every number must be positive")
    return values


def parse_length(spec: str) -> Dist:
    """A length spec string -> :class:`Dist`; ValueError saying what is allowed otherwise."""
    kind, *parts = str(spec).split(":")
    if kind not in _LENGTH_FORMS or len(parts) != _LENGTH_FORMS[kind]:
        raise ValueError(f"length {spec!r} is not one of {LENGTH_HELP}")
    args = _numbers(spec, parts, "length")
    if kind == "uniform" and args[0] > args[1]:
        raise ValueError(f"length {spec!r}: LO is above HI")
    if kind in ("exp", "lognormal") and args[-1] < 1:
        raise ValueError(f"length {spec!r}: CAP must be at least 1")
    if kind != "lognormal" and any(a != int(a) for a in (args if kind != "exp" else args[1:])):
        raise ValueError(f"length {spec!r}: token counts must be whole numbers")
    return Dist(kind, args)


def parse_arrival(spec: str) -> tuple[str, tuple[float, ...]]:
    kind, *parts = str(spec).split(":")
    forms = {"poisson": 1, "gamma": 2, "all": 0}
    if kind not in forms or len(parts) != forms[kind]:
        raise ValueError(f"arrival {spec!r} is not one of {ARRIVAL_HELP}")
    return kind, _numbers(spec, parts, "arrival") if parts else ()


def arrival_times(spec: str, n: int, gen: torch.Generator) -> list[float]:
    """Arrival times in seconds from 0, sorted; the first request arrives after one gap (as a
    Poisson process started at 0), except ``all``; rescaled so the last arrives at n / RATE, as
    ``vllm bench serve`` rescales its delays."""
    kind, args = parse_arrival(spec)
    if kind == "all":
        return [0.0] * n
    rate = args[0]
    if kind == "poisson":
        gaps = torch.empty(n, dtype=torch.float64).exponential_(rate, generator=gen)
    else:  # gamma with shape k and scale 1/(rate k): mean gap 1/rate, CV 1/sqrt(k)
        shape = args[1]
        gamma = torch.distributions.Gamma(
            torch.full((n,), shape, dtype=torch.float64), torch.full((n,), shape * rate, dtype=torch.float64)
        )
        # torch.distributions has no generator argument: draw through a forked global RNG state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
            gaps = gamma.sample()
    times = torch.cumsum(gaps, 0)
    return (times * (n / rate / times[-1])).tolist()


@dataclass
class TraceSpec:
    requests: int
    arrival: str = "poisson:10"
    prompt_len: str = "uniform:16:64"
    output_len: str = "exp:48:160"
    vocab_size: int = 512
    file: str | None = None
    extra: dict = field(default_factory=dict)


def generate(spec: TraceSpec, seed: int) -> list[Request]:
    """A seeded synthetic trace (or the file's, when ``spec.file`` is set)."""
    if spec.file:
        return read_jsonl(spec.file, spec.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed)
    arrivals = arrival_times(spec.arrival, spec.requests, gen)
    prompts = parse_length(spec.prompt_len).sample(spec.requests, gen)
    outputs = parse_length(spec.output_len).sample(spec.requests, gen)
    return [
        Request(
            i,
            arrivals[i],
            torch.randint(0, spec.vocab_size, (prompts[i],), generator=gen).tolist(),
            outputs[i],
            seed=seed * 1000003 + i,
        )
        for i in range(spec.requests)
    ]


def read_jsonl(path: str | Path, vocab_size: int, seed: int = 0) -> list[Request]:
    """Requests of a JSONL trace file, sorted by arrival. BadInput (file, line, key, what is
    allowed) for anything malformed."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the trace file ({exc.strerror or exc})") from None
    gen = torch.Generator().manual_seed(seed)
    out: list[Request] = []
    allowed = (
        "each line a JSON object with arrival_s (seconds >= 0), output_len (tokens >= 1) and "
        "prompt_len (tokens >= 1) or prompt (text)"
    )
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}:{number}: not JSON ({exc.msg}); {allowed}") from None
        if not isinstance(row, dict):
            raise BadInput(f"{path}:{number}: not a JSON object; {allowed}")

        def number_of(key: str, minimum: float, integer: bool):
            if key not in row:
                raise BadInput(
                    f"line {number} of {path}: {key!r} is missing; each line needs arrival_s (seconds "
                    f">= 0), prompt_len (tokens >= 1) or prompt (text), and output_len (tokens >= 1)"
                )
            value = row.get(key)
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= minimum
                and (not integer or value == int(value))
            )
            if not ok:
                raise BadInput(f"{path}:{number}: key {key!r} is {value!r}; {allowed}")
            return int(value) if integer else float(value)  # type: ignore[arg-type]  # ok: a finite number

        arrival = number_of("arrival_s", 0, False)
        output_len = number_of("output_len", 1, True)
        if "prompt" in row:
            if not isinstance(row["prompt"], str) or not row["prompt"]:
                raise BadInput(f"{path}:{number}: key 'prompt' must be non-empty text; {allowed}")
            prompt = [b % vocab_size for b in row["prompt"].encode("utf-8")]
        else:
            prompt = torch.randint(0, vocab_size, (number_of("prompt_len", 1, True),), generator=gen).tolist()
        out.append(Request(len(out), arrival, prompt, output_len, seed=seed * 1000003 + len(out)))
    if not out:
        raise BadInput(f"{path}: the trace file holds no requests; {allowed}")
    out.sort(key=lambda r: r.arrival_s)
    for i, r in enumerate(out):
        r.id = i
    return out
