"""A model's layer schedule: which mechanism each layer runs, as the field's hybrids build
them (Qwen3-Next: three Gated DeltaNet layers, then one gated softmax attention, repeated;
Jamba: one attention layer in eight; Kimi Linear: KDA and MLA 3:1).

``model.schedule`` is a pattern of layer kinds; ``model.kinds`` declares each kind but one:

    schedule: "(3*linear, attention)"     # tiles the layers: a block repeated
    kinds:
      linear: {attention: gated_deltanet, params: {conv: 4}, n_heads: 16}

* A kind is a mechanism with its parameters, the model's ``n_heads`` unless it sets its own,
  and grouped ``kv_heads`` or a ``head_dim`` of its own only where it sets them (the model's
  are its own mechanism's). The kind ``attention`` is the cell's own
  mechanism (``attention=``, its parameters, the model's heads): without a schedule every
  layer is that kind, so a uniform stack is the one-kind schedule and keeps every key; its
  all-attention twin is the same cell with ``model.schedule=null``.
* The pattern: items separated by commas, each a kind's name or a parenthesised block,
  repeated by ``N*item`` or ``item*N``: ``"3*gdn, attention"``, ``"(7*mamba, attention)*4"``,
  or every layer named (Kimi Linear's explicit list). A pattern shorter than the model
  repeats to tile ``model.layers``; one that does not divide it is refused.
* A kind inherits the cell's ``causal`` where its mechanism takes one and it sets none, so a
  causal (decoding) cell is causal in every layer.

Pure functions: :func:`layers_of` turns a cell's shape into one :class:`Layer` per layer;
:func:`canonical` is the schedule's one-line form a row's ``model`` stores (its key).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from attnbench.validators import check_int

OWN = "attention"  # the kind that is the cell's own mechanism
MAX_LAYERS = 100_000  # no model has more: a pattern that expands past it is a typo
KIND_KEYS = ("attention", "params", "n_heads", "kv_heads", "head_dim")
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*)|(,)|(\()|(\)))")


class Layer(NamedTuple):
    """What one layer is built as: its kind's name, mechanism, parameters and heads."""

    kind: str
    attention: str
    params: tuple[tuple[str, Any], ...]
    n_heads: int
    kv_heads: int | None
    head_dim: int | None


def frozen(value: Any) -> Any:
    """Mappings as sorted (key, value) pairs and lists as tuples, at every depth: a kind's
    declaration as a cell holds it (hashable, one form whatever order it was given in)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def thawed(kinds: Any) -> dict[str, dict[str, Any]]:
    """:func:`frozen` kinds back as mappings (``params`` a mapping too): the stored form."""
    return {
        name: {k: dict(v or ()) if k == "params" else v for k, v in spec} for name, spec in kinds
    }


def check_kinds(kinds: Any) -> dict[str, dict[str, Any]]:
    """``model.kinds`` as mappings, its form checked: a mapping of kind names to mappings of
    :data:`KIND_KEYS`, ``attention`` a mechanism's name, ``params`` a mapping or null. Each
    refusal one line naming the key; the values themselves are checked where the kind is
    built (:func:`layers_of`, the plan)."""
    if kinds is None:
        return {}
    given = dict(kinds) if isinstance(kinds, (Mapping, tuple)) and _pairs(kinds) else None
    if given is None:
        raise ValueError(f"model.kinds: must be a mapping of kind names to kinds, got {kinds!r}")
    out = {}
    for name, spec in given.items():
        where = f"model.kinds.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"model.kinds: a kind's name must be an identifier, got {name!r}")
        if name == OWN:
            raise ValueError(f"{where}: {OWN!r} is the cell's own mechanism (attention=)")
        if not (isinstance(spec, (Mapping, tuple)) and _pairs(spec)):
            raise ValueError(
                f"{where}: must be a mapping with an attention key, got {given[name]!r}"
            )
        if unknown := sorted(set(spec) - set(KIND_KEYS), key=str):
            allowed = ", ".join(KIND_KEYS)
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {allowed}")
        if not isinstance(spec.get("attention"), str):
            raise ValueError(f"{where}.attention: required, a mechanism's name")
        params = spec.get("params")
        if params is not None and not (isinstance(params, (Mapping, tuple)) and _pairs(params)):
            raise ValueError(f"{where}.params: must be a mapping of the mechanism's parameters")
        out[name] = {**spec, "params": dict(params or ())}
    return out


def _pairs(value: Any) -> bool:
    """A mapping, or pairs of (key, value) as :func:`frozen` makes of one."""
    if isinstance(value, Mapping):
        return True
    return all(isinstance(p, tuple) and len(p) == 2 for p in value)


def normal(
    pattern: Any, kinds: Any, layers: int, n_heads: int
) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """One form for one schedule, so that it has one key however it was written: the
    layers' shortest repeating block, run-length encoded (``(3*lin, attention)*12``), the
    kinds it uses only, without an ``n_heads`` equal to the model's; (None, {}) where every
    layer is the cell's own mechanism, or there is no schedule (kinds without one are the
    twin's, and unused)."""
    if pattern is None:
        return None, {}
    if not isinstance(pattern, str):
        raise ValueError(f"model.schedule: must be text or null, got {pattern!r}")
    declared = check_kinds(kinds)
    names = tiled(pattern, layers)
    if set(names) == {OWN}:
        return None, {}
    period = next(p for p in range(1, len(names) + 1)
                  if len(names) % p == 0 and names == names[:p] * (len(names) // p))  # fmt: skip
    runs: list[list[Any]] = []
    for name in names[:period]:
        if runs and runs[-1][1] == name:
            runs[-1][0] += 1
        else:
            runs.append([1, name])
    block = ", ".join(name if count == 1 else f"{count}*{name}" for count, name in runs)
    repeats = len(names) // period
    text = block if repeats == 1 else f"({block})*{repeats}"
    used = {}
    for name in dict.fromkeys(names):
        if name != OWN and name in declared:
            spec = dict(declared[name])
            if spec.get("n_heads") == n_heads:
                del spec["n_heads"]
            used[name] = spec
    return text, used


def expand(pattern: str) -> list[str]:
    """The kinds' names of a pattern, layer by layer (module docstring); a malformed pattern
    is one line naming ``model.schedule``."""
    tokens = _tokens(pattern)
    names, at = _sequence(pattern, tokens, 0)
    if at != len(tokens):
        raise _bad(pattern, f"unexpected {tokens[at][1]!r}")
    return names


def _tokens(pattern: str) -> list[tuple[str, str]]:
    if not isinstance(pattern, str) or not pattern.strip():
        raise _bad(pattern, "a pattern such as '3*linear, attention' is needed")
    out, at = [], 0
    while at < len(pattern.rstrip()):
        m = _TOKEN.match(pattern, at)
        if m is None or m.end() == at:
            raise _bad(pattern, f"unexpected {pattern[at:].strip()[:1]!r}")
        kind = ("int", "name", "*", ",", "(", ")")[m.lastindex - 1]
        out.append((kind, m.group(m.lastindex)))
        at = m.end()
    return out


def _sequence(pattern: str, tokens: list[tuple[str, str]], at: int) -> tuple[list[str], int]:
    names, at = _item(pattern, tokens, at)
    while at < len(tokens) and tokens[at][0] == ",":
        more, at = _item(pattern, tokens, at + 1)
        names += more
    return names, at


def _item(pattern: str, tokens: list[tuple[str, str]], at: int) -> tuple[list[str], int]:
    times = 1
    if at + 1 < len(tokens) and tokens[at][0] == "int" and tokens[at + 1][0] == "*":
        times, at = _count(pattern, tokens[at][1]), at + 2
    if at >= len(tokens):
        raise _bad(pattern, "it ends where a kind was expected")
    kind, text = tokens[at]
    if kind == "name":
        names, at = [text], at + 1
    elif kind == "(":
        names, at = _sequence(pattern, tokens, at + 1)
        if at >= len(tokens) or tokens[at][0] != ")":
            raise _bad(pattern, "a '(' is not closed")
        at += 1
    else:
        raise _bad(pattern, f"unexpected {text!r} where a kind was expected")
    if at + 1 < len(tokens) and tokens[at][0] == "*" and tokens[at + 1][0] == "int":
        times, at = times * _count(pattern, tokens[at + 1][1]), at + 2
    if len(names) * times > MAX_LAYERS:
        raise _bad(pattern, f"it expands past {MAX_LAYERS} layers")
    return names * times, at


def _count(pattern: str, text: str) -> int:
    if int(text) < 1:
        raise _bad(pattern, f"a repeat count must be >= 1, got {text}")
    return int(text)


def _bad(pattern: Any, why: str) -> ValueError:
    return ValueError(f"model.schedule: {why}, got {pattern!r}")


def tiled(pattern: str, layers: int) -> list[str]:
    """The pattern's kinds repeated to ``layers`` layers; one that does not divide them is
    refused (a schedule is the published model's, not a truncated one)."""
    names = expand(pattern)
    if layers % len(names):
        raise ValueError(
            f"model.schedule: its {len(names)} layers do not tile model.layers={layers} "
            f"(a block must repeat a whole number of times), got {pattern!r}"
        )
    return names * (layers // len(names))


def layers_of(cell: Any, own_params: Mapping[str, Any] | None = None) -> list[Layer]:
    """One :class:`Layer` per layer of ``cell`` (its shape's schedule and kinds, its own
    mechanism for the kind ``attention``, with ``own_params``: its resolved parameters, by
    default :meth:`~attnbench.cell.Cell.mechanism_params`); every layer its own mechanism
    without one."""
    shape = cell.model
    own_params = dict(cell.mechanism_params() if own_params is None else own_params)
    own = Layer(
        OWN, cell.attention, frozen(own_params), shape.n_heads, shape.kv_heads, shape.head_dim
    )
    if shape.schedule is None:
        return [own] * shape.layers
    kinds = _kinds(shape.kinds, own_params.get("causal"), shape)
    out = []
    for name in tiled(shape.schedule, shape.layers):
        if name != OWN and name not in kinds:
            declared = ", ".join([OWN, *sorted(kinds)])
            raise ValueError(
                f"model.schedule: kind {name!r} is not declared in model.kinds; declared: "
                f"{declared}"
            )
        out.append(own if name == OWN else kinds[name])
    return out


def _kinds(kinds: Any, causal: Any, shape: Any) -> dict[str, Layer]:
    """Each declared kind as a :class:`Layer`, its keys checked (one line naming
    ``model.kinds.NAME.KEY``); ``causal`` inherited where the kind sets none."""
    from attnbench import registry  # the registry imports every mechanism: only when asked

    out = {}
    for name, spec in check_kinds(thawed(kinds)).items():
        where = f"model.kinds.{name}"
        params = dict(spec.get("params") or {})
        try:
            takes_causal = "causal" in registry.info(spec["attention"]).params
        except ValueError as e:  # an unknown mechanism: the registry's line, named here
            raise ValueError(f"{where}.{e}") from None
        if causal is not None and takes_causal and "causal" not in params:
            params["causal"] = causal
        # the model's heads, but grouped keys and a width of its own only where it says so:
        # those of the model are its own mechanism's (a mixer has neither)
        heads = {"n_heads": spec.get("n_heads", shape.n_heads)}
        heads |= {k: spec.get(k) for k in ("kv_heads", "head_dim")}
        check_int(f"{where}.n_heads", heads["n_heads"])
        for key in ("kv_heads", "head_dim"):
            if heads[key] is not None:
                check_int(f"{where}.{key}", heads[key])
        out[name] = Layer(name, spec["attention"], frozen(params), **heads)
    return out


def canonical(pattern: str, kinds: Any) -> str:
    """The schedule in one line, as a row's ``model`` stores it and its key hashes it:
    ``(3*linear, attention); linear=gated_deltanet(conv=4, n_heads=16)``."""
    declared = [
        f"{name}={spec['attention']}("
        + ", ".join(
            [f"{k}={v}" for k, v in sorted((spec.get("params") or {}).items())]
            + [f"{k}={spec[k]}" for k in ("n_heads", "kv_heads", "head_dim") if k in spec]
        )
        + ")"
        for name, spec in sorted(thawed(kinds).items())
    ]
    return "; ".join([pattern.strip(), *declared])
