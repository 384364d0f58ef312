"""The one place that knows every attention mechanism.

A mechanism registers itself with :func:`register`: its module class, its strict config
dataclass and its capabilities. Everything else (``create``, ``build_model``, the CLI, sweeps,
reports, tests) asks the registry, so a mechanism registered by a user shows up everywhere
without editing attnbench. Capabilities live here as data rather than as flags on the module
class, so nothing dispatches on a module's class: code asks the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from torch import nn

from attnbench import plugins
from attnbench.attention import (
    deltanet,
    flex,
    gated_deltanet,
    gla,
    kda,
    linear,
    linformer,
    local,
    mamba2,
    mla,
    nystromformer,
    performer,
    reformer,
    retnet,
    sdpa,
    vanilla,
    xformers,
)
from attnbench.attention.base import MultiHeadAttention
from attnbench.attention.packing import PER_DOCUMENT
from attnbench.attention.sinks_gate import FIELDS as SOFTMAX_OPTIONS
from attnbench.plugins import PLUGIN_ENV as PLUGIN_ENV
from attnbench.plugins import PLUGIN_GROUP as PLUGIN_GROUP

DTYPES = ("fp32", "fp16", "bf16")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Info:
    """What a mechanism can do, and, when it cannot run on this machine, why not."""

    name: str
    summary: str
    causal: bool
    padding_mask: bool
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    fixed_max_len: bool
    budget: str | None  # the config field that the sweep's ``k`` sets, if any
    params: dict[str, Any]  # config field -> default
    unavailable: str | None  # one line, or None when it can run here
    cannot_train: str | None = None  # why mode=train is refused, or None: it trains
    limits: str | None = None  # what of the common contract it does not meet, or None
    cannot_decode: str | None = None  # why mode=decode is refused, or None: it decodes
    gqa: bool = False  # builds with kv_heads < n_heads (grouped-query attention)
    # builds with head_dim · n_heads ≠ d_model (the attention's own width: Qwen3-Next's)
    head_dim: bool = False
    # its kernel is compiled whatever the cell's ``compile`` says (torch.compile inside it)
    compiles: bool = False
    # why its backward cannot run on a CPU (training refused there), or None: it can
    no_cpu_backward: str | None = None
    # (parameter, value): the budget is used only when that parameter has that value
    # (FlexAttention's window, by pattern=window alone), or None: always
    budget_when: tuple[str, Any] | None = None
    # why a non-causal cell is refused (the mechanism is causal by construction), or None
    causal_only: str | None = None
    # why packed documents cannot be kept apart in a row (packing refused), or None
    cannot_pack: str | None = None
    packs: str = PER_DOCUMENT  # how it keeps packed documents apart (attend_packed)


@dataclass(frozen=True)
class _Spec:
    cls: type[MultiHeadAttention]
    config: type
    info: Info  # with ``unavailable`` left None: that is asked afresh on each info()
    why_unavailable: Callable[[], str | None]


_REGISTRY: dict[str, _Spec] = {}
# what a mechanism registered without an incremental form says when asked to decode
NO_DECODE = "has no incremental form registered (new_state, extend_attend, state_bytes)"
_INCREMENTAL = ("new_state", "extend_attend", "state_bytes")
_plugins_loaded = False


def register(
    name: str,
    *,
    config: type,
    summary: str,
    causal: bool,
    padding_mask: bool = True,
    devices: tuple[str, ...] = DEVICES,
    dtypes: tuple[str, ...] = DTYPES,
    fixed_max_len: bool = False,
    budget: str | None = None,
    why_unavailable: Callable[[], str | None] = lambda: None,
    cannot_train: str | None = None,
    limits: str | None = None,
    cannot_decode: str | None = NO_DECODE,
    gqa: bool = False,
    head_dim: bool = False,
    compiles: bool = False,
    no_cpu_backward: str | None = None,
    budget_when: tuple[str, Any] | None = None,
    causal_only: str | None = None,
    cannot_pack: str | None = None,
    packs: str = PER_DOCUMENT,
) -> Callable[[type[MultiHeadAttention]], type[MultiHeadAttention]]:
    """Class decorator that adds a mechanism under ``name``.

    Refuses nonsense at registration time rather than at first use: a duplicate name, a class
    that is not a :class:`MultiHeadAttention`, a config that is not a dataclass, a budget that is
    not one of the config's fields, devices/dtypes outside the known sets, or a claim to
    decode (``cannot_decode=None``) by a class without a causal form or without the three
    methods of the incremental form.
    """
    _check_registration(name, config, budget, budget_when, devices, dtypes)
    if causal_only is not None and not causal:
        raise ValueError(f"register({name!r}): causal_only, but causal=False")

    def decorate(cls: type[MultiHeadAttention]) -> type[MultiHeadAttention]:
        _check_class(name, cls, causal, cannot_decode)
        defaults = {
            f.name: (f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(config)
        }
        caps = Info(
            name, summary, causal, padding_mask, tuple(devices), tuple(dtypes), fixed_max_len,
            budget, defaults, unavailable=None, cannot_train=cannot_train, limits=limits,
            cannot_decode=cannot_decode, gqa=gqa, head_dim=head_dim, compiles=compiles,
            no_cpu_backward=no_cpu_backward, budget_when=budget_when, causal_only=causal_only,
            cannot_pack=cannot_pack, packs=packs,
        )  # fmt: skip
        _REGISTRY[name] = _Spec(cls, config, caps, why_unavailable)
        return cls

    return decorate


def _check_registration(
    name: str,
    config: type,
    budget: str | None,
    budget_when: tuple[str, Any] | None,
    devices: tuple[str, ...],
    dtypes: tuple[str, ...],
) -> None:
    """What :func:`register` refuses before it sees the class: a name that is no
    identifier, a config that is not a dataclass, a budget (or the parameter its use
    depends on) that is not one of its fields, devices or dtypes outside the known sets."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register: name must be an identifier, got {name!r}")
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"register({name!r}): config must be a dataclass, got {config!r}")
    fields = {f.name for f in dataclasses.fields(config)}
    for field in (budget, *(budget_when or ())[:1]):
        if field is not None and field not in fields:
            raise ValueError(f"register({name!r}): budget {field!r} is not a config field")
    if bad := set(devices) - set(DEVICES):
        raise ValueError(f"register({name!r}): unknown devices {sorted(bad)}; allowed: {DEVICES}")
    if bad := set(dtypes) - set(DTYPES):
        raise ValueError(f"register({name!r}): unknown dtypes {sorted(bad)}; allowed: {DTYPES}")


def _check_class(name: str, cls: type, causal: bool, cannot_decode: str | None) -> None:
    """What :func:`register` refuses of the class it decorates: one that is not a
    :class:`MultiHeadAttention`, a name already taken, and a claim to decode
    (``cannot_decode=None``) without a causal form or without the incremental form's
    methods."""
    if not (isinstance(cls, type) and issubclass(cls, MultiHeadAttention)):
        raise TypeError(f"register({name!r}): {cls!r} is not a MultiHeadAttention subclass")
    if name in _REGISTRY:
        raise ValueError(f"register: attention {name!r} is already registered")
    if cannot_decode is None:
        missing = [m for m in _INCREMENTAL if getattr(cls, m) is getattr(MultiHeadAttention, m)]
        if missing or not causal:
            why = f"does not implement {', '.join(missing)}" if missing else "is not causal"
            raise TypeError(f"register({name!r}): cannot_decode=None, but {cls.__name__} {why}")


def load_plugins() -> None:
    """Import user mechanisms (and workloads) named by entry points or by ``$ATTNBENCH_PLUGINS``
    (:func:`attnbench.plugins.load`: one that cannot be loaded is one ``PluginError`` line).

    Done lazily, once, so that ``import attnbench`` stays cheap and a plugin can itself
    ``import attnbench`` to use the decorator.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    plugins.load()  # PluginError: one line; raised again on every call until fixed
    _plugins_loaded = True


def names() -> list[str]:
    """Every registered mechanism: the built-ins in :data:`BUILTINS` order (whichever module
    was imported first), then the others in the order they registered."""
    load_plugins()
    rank = {name: i for i, name in enumerate(BUILTINS)}
    return sorted(_REGISTRY, key=lambda name: rank.get(name, len(rank)))


def _spec(name: str) -> _Spec:
    load_plugins()
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"attention: unknown mechanism {name!r}; allowed: {', '.join(names())}")
    return _REGISTRY[name]


def info(name: str) -> Info:
    """Capabilities of ``name``; ``unavailable`` says in one line why it cannot run here."""
    s = _spec(name)
    # a copy of params: a caller's edit must not change what later callers see
    return dataclasses.replace(s.info, params=dict(s.info.params), unavailable=s.why_unavailable())


def packing() -> tuple[dict[str, str], dict[str, str]]:
    """How each registered mechanism keeps packed documents apart, and why those that cannot
    pack cannot, by name (the packed report's facts that no row holds)."""
    every = {name: info(name) for name in names()}
    how = {name: i.packs for name, i in every.items() if not i.cannot_pack}
    return how, {name: i.cannot_pack for name, i in every.items() if i.cannot_pack}


def make_config(name: str, params: dict[str, Any]) -> Any:
    """Build ``name``'s config from ``params``; an unknown key is an error, never dropped."""
    s = _spec(name)
    allowed = [f.name for f in dataclasses.fields(s.config)]
    for key in params:
        if key in SOFTMAX_OPTIONS and key not in allowed:  # a softmax option elsewhere
            takers = [m for m in names() if key in _spec(m).info.params]
            raise ValueError(
                f"{key}: attention={name} cannot hold {SOFTMAX_OPTIONS[key]}; {key} works "
                f"with {', '.join(takers)}"
            )
        if key not in allowed:
            raise ValueError(
                f"{name}: unknown parameter {key!r}; allowed: {', '.join(allowed) or 'none'}"
            )
    return s.config(**params)


def mechanism_class(name: str) -> type[MultiHeadAttention]:
    return _spec(name).cls


def shape_kwargs(
    name: str, n_heads: int, kv_heads: int | None, head_dim: int | None = None
) -> dict[str, int]:
    """``kv_heads`` and ``head_dim`` for a layer's constructor, each only where it changes
    the layer (every mechanism builds as many key/value heads as query heads, and heads of
    d_model / n_heads); one a mechanism cannot build is one line naming those that can."""
    out = {}
    for key, value, default, can, why, null in (
        ("kv_heads", kv_heads, n_heads, "gqa", "has no grouped-query form", "as many as n_heads"),
        ("head_dim", head_dim, None, "head_dim", "has no width of its own", "d_model / n_heads"),
    ):
        if value is None or value == default:
            continue
        if not getattr(_spec(name).info, can):
            have = [m for m in names() if getattr(_spec(m).info, can)]
            raise ValueError(
                f"{key}: attention={name} {why}; {key} works with {', '.join(have)} (null: {null})"
            )
        out[key] = value
    return out


def create(
    name: str,
    *,
    d_model: int,
    n_heads: int,
    max_seq_len: int,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    **params: Any,
) -> nn.Module:
    """One multi-head attention layer: ``module(x, key_padding_mask=None)``.

    ``x`` is ``(batch, n, d_model)``; the mask is bool ``(batch, n)`` with True = padding.
    ``kv_heads``: key/value heads for grouped-query attention (mechanisms with ``gqa``);
    ``head_dim``: each head's width where not d_model / n_heads (mechanisms with
    ``head_dim``). Bad parameters raise ``ValueError`` naming the parameter and what is
    allowed.
    """
    cfg = make_config(name, params)
    gqa = shape_kwargs(name, n_heads, kv_heads, head_dim)
    cls = _spec(name).cls
    kwargs = dict(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg, **gqa)
    (layer,) = built(name, lambda: [cls(**kwargs)])
    return layer


def built(name: str, build: Callable[[], list[MultiHeadAttention]]) -> list[MultiHeadAttention]:
    """The layers ``build`` makes of mechanism ``name``, however they are built (:func:`create`,
    the model). A plugin's are held to a forward's contract as they run
    (:func:`attnbench.plugins.watch`), and an error its constructor raises, but a bad
    parameter's ``ValueError``, is one ``ValueError`` line naming it: its cell is refused."""
    if name in BUILTINS:
        return build()
    who = f"attention={name} (plugin {_spec(name).cls.__module__})"
    try:
        layers = build()
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"{who}: building its layer raised {plugins.why(e, '')}") from e
    plugins.watch(layers, who)
    return layers


def _declared(module: ModuleType) -> type[MultiHeadAttention]:
    """The one mechanism class a built-in module declares (:func:`attention.base.declare`)."""
    (cls,) = (
        v
        for v in vars(module).values()
        if isinstance(v, type) and v.__module__ == module.__name__ and "declared" in vars(v)
    )
    return cls


def _register_builtin(module: ModuleType) -> str:
    cls = _declared(module)
    name, capabilities = cls.declared  # type: ignore[attr-defined]
    register(name, **capabilities)(cls)
    return name


# the built-ins, in the order of names(): the one list of them, registered here
BUILTINS = tuple(
    _register_builtin(module)
    for module in (vanilla, sdpa, xformers, linformer, performer, nystromformer, linear, local,
                   reformer, flex, retnet, gla, mamba2, deltanet, gated_deltanet,
                   kda, mla)
)  # fmt: skip
