"""The user's plugins: the modules ``$ATTNBENCH_PLUGINS`` names and the entry points of the
group ``attnbench.mechanisms``, the one code that finds and imports them (for the registries,
:func:`attnbench.registry.load_plugins`, and for the gate, which must know where each came
from).

A plugin that cannot be loaded — missing, a syntax error, anything raised while it runs (a
registration refused, a ``sys.exit``), a file path where a module name belongs — is one
:class:`PluginError` line naming the variable or the entry point, the module and the error:
each command prints it and exits 2 before it writes anything. A plugin's mechanism that
breaks a forward's contract as it runs (:func:`watch`: the wrong shape, NaN from a finite
input, an error from inside its layer) is named as at fault in its cell's row
(:func:`fault`). This module imports nothing of attnbench, and torch only in :func:`watch`,
so that the command line can name a plugin's error without loading either.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import PurePath
from types import ModuleType
from typing import Any

PLUGIN_ENV = "ATTNBENCH_PLUGINS"
PLUGIN_GROUP = "attnbench.mechanisms"
_LONGEST = 500  # characters of an error's message kept in the line
_WHO = "_attnbench_plugin"  # the attribute naming a watched layer's mechanism and module


class PluginError(ImportError):
    """A plugin that cannot be loaded, in one line. Not a ``ValueError``: the layers that
    word a bad value with its place (a row's file and line, a flag) let it pass, and the
    command line says it as it is (:func:`attnbench.cli.main`), exit 2."""


def named() -> list[str]:
    """The modules ``$ATTNBENCH_PLUGINS`` names (comma-separated), in order. A name that is
    no dotted module name is refused here, not as Python's "No module named": a file path
    is told which module name and which PYTHONPATH it stands for."""
    names = [m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(",") if m.strip()]
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise PluginError(f"{PLUGIN_ENV}: {name!r} is not a module name; {_hint(name)}")
    return names


def _hint(name: str) -> str:
    path = PurePath(name)
    if name.endswith(".py") or "/" in name or os.sep in name:
        where = str(path.parent) if str(path.parent) != "." else "."
        return f"name the module ({path.stem!r}) and put its directory ({where!r}) on PYTHONPATH"
    return "allowed: dotted module names separated by commas, e.g. mypkg.mymech,other"


def imported(name: str) -> ModuleType:
    """Module ``name`` of ``$ATTNBENCH_PLUGINS``, imported. Whatever its import raises, a
    ``SystemExit`` too, is one :class:`PluginError` line; Python forgets a module whose
    import failed, so the next call tries it afresh (and says it again until it is fixed)."""
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as e:
        raise PluginError(f"{PLUGIN_ENV}: cannot import {name!r}: {why(e, name)}") from e


def _entry_point(ep: EntryPoint) -> None:
    try:
        ep.load()
    except (Exception, SystemExit) as e:
        raise PluginError(
            f"entry point {ep.name!r} ({ep.value}) of group {PLUGIN_GROUP}: cannot load "
            f"{ep.module!r}: {why(e, ep.module)}"
        ) from e


def load() -> None:
    """Every plugin: the entry points of :data:`PLUGIN_GROUP`, then the modules of
    ``$ATTNBENCH_PLUGINS``; the first that cannot be loaded raises :class:`PluginError`."""
    for ep in entry_points(group=PLUGIN_GROUP):
        _entry_point(ep)
    for name in named():
        imported(name)


def why(e: BaseException, module: str) -> str:
    """``Type: message`` in one line, however many lines the message had. A plugin module
    that is itself not found is told where Python looks for it."""
    text = " ".join(str(e).split())
    if len(text) > _LONGEST:
        text = text[:_LONGEST] + " ..."
    missing = e.name if isinstance(e, ModuleNotFoundError) else None
    if missing and (module == missing or module.startswith(f"{missing}.")):
        text += " (is the directory that holds it on PYTHONPATH?)"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class PluginFault(RuntimeError):
    """A plugin's mechanism broke the layer's contract as it ran: its line names the
    mechanism and its module (:func:`watch`)."""


def watch(layers: Iterable[Any], who: str) -> None:
    """Hold the layers of a plugin's mechanism (``who``: ``attention=NAME (plugin MODULE)``)
    to the contract of a forward as they run: its output has its input's shape (on meta
    too, so the memory model finds it before anything real runs), and on a layer's first
    call with real tensors no NaN or inf at a real (unpadded) position where its input had
    none. That first real call removes the check (a few reductions and a sync, once), so
    the layer is timed as it is; in a compiled graph the shape check is a constant and the
    values are not read. A fault is one :class:`PluginFault` line rather than a wrong row
    or a shape error deep in the next layer. The built-ins are held to the contract by the
    test suite instead."""
    import torch

    def finite(t: Any) -> bool:  # no temporary the size of t: a probe's peak stays its own
        if t.numel() == 0:
            return True
        lo, hi = torch.aminmax(t)
        return bool(torch.isfinite(lo) & torch.isfinite(hi))

    def hook(handles: list[Any]) -> Callable[..., None]:
        def check(layer: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
            x = args[0] if args else kwargs["x"]
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                is_tensor = isinstance(out, torch.Tensor)
                got = f"shape {tuple(out.shape)}" if is_tensor else f"a {type(out).__name__}"
                raise PluginFault(f"{who}: forward returned {got} for input {tuple(x.shape)}")
            # is_compiling first: a compiled graph never reads the handles, nor drops them
            if torch.compiler.is_compiling() or not handles or out.device.type == "meta":
                return
            handles.pop().remove()
            mask = args[1] if len(args) > 1 else kwargs.get("key_padding_mask")
            if mask is not None:  # a padded position's output is not the contract's
                out, x = out[~mask], x[~mask]
            if not finite(out) and finite(x):
                raise PluginFault(
                    f"{who}: forward returned NaN or inf for a finite input {tuple(x.shape)}"
                )

        return check

    for layer in layers:
        handles: list[Any] = []
        handles.append(layer.register_forward_hook(hook(handles), with_kwargs=True))
        setattr(layer, _WHO, who)  # what fault() names, when an error comes from inside it


def fault(e: BaseException) -> str | None:
    """The one line for ``e``, raised as a cell ran, when a plugin's mechanism is at fault:
    a :class:`PluginFault`, or an error raised inside a layer :func:`watch` holds (its own
    code, or the base class's on what its code returned), named as that layer is; None
    when ``e`` came from elsewhere."""
    if isinstance(e, PluginFault):
        return str(e)
    tb = e.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if (who := getattr(owner, "__dict__", {}).get(_WHO)) is not None:
            return f"{who}: {why(e, '')}"
        tb = tb.tb_next
    return None
