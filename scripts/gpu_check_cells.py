"""The GPU check's cells, in the order it runs them (``scripts/gpu_check.py`` says what each
section is for), and the key that tells them apart in stored rows (``--resume``, estimates).

A :class:`Profile` is where the cells run: the GPU's (the paper's model under the V100's 16
GB, fp16) or the CPU smoke's (tiny shapes on the ``cpu`` preset, fp32: every section, two
mixers, so that a CPU walks every path the GPU will). :func:`order` builds the sections and
keeps each cell once, where it first comes.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from attnbench.cell import Cell
from attnbench.cell_rules import complete
from attnbench.measure import presets
from attnbench.row import Row
from attnbench.workload import find as find_workload
from attnbench.workload.base import setting


def flat_cell(attention: str, **flat: Any) -> Cell:
    """A cell from its fields named as the stored spec names them, one level (``layers``,
    ``mode``, ``mode_settings``): the shapes and settings below are such mappings."""
    return Cell.of(attention, **flat)


NS = (512, 1024, 2048, 4096, 8192, 16384)
NS_TRAIN = (512, 1024, 2048, 4096)
LAYERWISE = (("sharing", "layerwise"),)
EAGER = (("kernel", "eager"), ("sharing", "layerwise"))  # the paper's materialised n × k P̄
MECHANISMS = (
    ("vanilla", None, ()),
    ("sdpa", None, ()),
    ("linformer", 128, EAGER),
    ("linformer", 256, EAGER),
    ("linformer", 256, LAYERWISE),
)
# the other mechanisms at their default budgets, inference only: each one's first
# real CUDA forward, its memory model against the device, and its time beside vanilla's
ZOO = tuple(
    (name, None, params)
    for name in ("performer", "nystromformer", "linear", "local", "reformer", "vanilla")
    for params in ((), (("causal", True),))
    if not (name == "nystromformer" and params) and not (name == "vanilla" and not params)
)
MIXER_NAMES = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
KERNELS = ("fla", "torch")  # flash-linear-attention's beside ours
# the recurrent mixers, causal, inference, on both kernels (fla's refused where it cannot run)
MIXERS = tuple(
    (name, None, (("causal", True), ("kernel", kernel)))
    for name in MIXER_NAMES
    for kernel in ("torch", "fla")
)

TIMING = {"min_repeats": 3, "min_seconds": 0.3}
DECODE_TOKENS = 64  # the steps timed (the first two are warm-ups)
# section 1: each workload with its settings and the one batch both kernels run at
NEW = (
    ("inference", {}, 8),
    ("train", {}, 2),
    ("decode", {"decode_tokens": DECODE_TOKENS}, 8),
    ("packed", {"layout": "packed"}, 2),
)
MIX = ("vanilla", "sdpa")  # section 4
PACKED_VS_PADDED = (("sdpa", ()), ("gated_deltanet", (("kernel", "fla"),)))  # section 5
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"  # section 6
# serving: (mechanism, grouped-query heads): kv_heads = n_heads / 4 where True (3 of 12, as
# +sweep=serving), each at every n of NS_DECODE, causal, its decode steps timed
DECODE = (
    ("vanilla", False),
    ("vanilla", True),
    ("sdpa", False),
    ("linear", False),
    ("local", False),
    *((name, False) for name in MIXER_NAMES),
)
NS_DECODE = (2048,)
# compiled: (mechanism, params, mode, compile) at NS_COMPILED
COMPILED = (
    *((name, (), "inference", True) for name in ("vanilla", "sdpa", "linear", "local")),
    *(
        ("flex", (("pattern", "window"),), mode, comp)
        for mode in ("inference", "train")
        for comp in (False, True)
    ),
)
NS_COMPILED = (4096,)


@dataclass(frozen=True)
class Profile:
    """Where the check's cells run: a GPU's (:data:`GPU`) or the CPU smoke's (:data:`SMOKE`)."""

    shape: dict[str, Any]  # the model's shape and the timing
    device: str
    dtype: str
    ns: tuple[int, ...]  # the forward's (Table 3, the zoo, the mixers)
    ns_train: tuple[int, ...]
    ns_compiled: tuple[int, ...]
    ns_decode: tuple[int, ...]  # serving's; its first, decode over a mix
    n_new: int  # sections 1, 2 and 5
    mixers: tuple[str, ...]  # section 1's
    fragmented: tuple  # section 6's (mechanism, k, params), at ns[0]
    draw: dict[str, Any] = field(default_factory=dict)  # packed's documents, decode's prompts
    decode_device: str = "h100_80gb"
    extra: tuple[Cell, ...] = ()  # run last


GPU = Profile(
    TIMING, "v100_16gb", "fp16", NS, NS_TRAIN, NS_COMPILED, NS_DECODE, 2048, MIXER_NAMES,
    (("sdpa", None, ()), ("linformer", 256, LAYERWISE)),
)  # fmt: skip
TINY = {"layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128, "min_repeats": 2,
        "min_seconds": 0.0, "ceiling_bytes": 64 << 20}  # fmt: skip
# tiny shapes on the cpu preset: every section, two mixers; batch=max is modeled on a CPU,
# so vanilla's serving at batch=2 times its steps
SMOKE = Profile(
    TINY, "cpu", "fp32", (128,), (64, 128), (128,), (128,), 128, ("gla", "deltanet"),
    (("sdpa", None, ()), ("linformer", 32, LAYERWISE)),
    draw={"total_tokens": 512, "length_mean": 64},
    decode_device="cpu",
    extra=(flat_cell("vanilla", n=128, batch=2, params=(("causal", True),), device="cpu",
                dtype="fp32", mode="decode", mode_settings={"decode_tokens": DECODE_TOKENS},
                **TINY),),
)  # fmt: skip


@dataclass(frozen=True)
class Item:
    """A cell of the check, the section it belongs to, and the allocator setting it runs
    under (None: the default; else a child process with ``PYTORCH_CUDA_ALLOC_CONF`` set)."""

    cell: Cell
    section: str = ""
    alloc: str | None = None


def cells(
    ns: tuple[int, ...],
    shape: dict,
    device: str,
    dtype: str,
    mechanisms: tuple = MECHANISMS,
    **train: object,
) -> list[Cell]:
    return [
        flat_cell(name, n=n, k=k, params=params, device=device, dtype=dtype, **shape, **train)
        for n in ns
        for name, k, params in mechanisms
        if k is None or k < n
    ]


def all_cells(ns: tuple, ns_train: tuple, shape: dict, device: str, dtype: str) -> list[Cell]:
    """Inference at ``ns`` (the zoo and the mixers too); a training step at ``ns_train``;
    checkpointed at the second."""
    return (
        cells(ns, shape, device, dtype)
        + cells(ns, shape, device, dtype, ZOO)
        + cells(ns, shape, device, dtype, MIXERS)
        + cells(ns_train, shape, device, dtype, mode="train")
        + cells(
            ns_train[1:2], shape, device, dtype, mode="train", mode_settings={"checkpoint": True}
        )
    )


def decode_cell(name: str, n: int, shape: dict, device: str, dtype: str, **settings: Any) -> Cell:
    """A causal serving cell at the max batch, :data:`DECODE_TOKENS` steps timed."""
    return flat_cell(
        name, n=n, params=(("causal", True),), device=device, dtype=dtype, mode="decode",
        mode_settings={"decode_tokens": DECODE_TOKENS, **settings}, **shape,
    )  # fmt: skip


def decode_cells(
    ns: tuple[int, ...], shape: dict, device: str, dtype: str, batches: tuple = ("max",)
) -> list[Cell]:
    """The serving cells: each of :data:`DECODE` at each n and batch, causal."""
    return [
        Cell.of(
            **{
                **decode_cell(name, n, shape, device, dtype).to_dict(),
                "batch": batch,
                "kv_heads": shape.get("n_heads", 12) // 4 if gqa else None,
            }
        )
        for n in ns
        for batch in batches
        for name, gqa in DECODE
    ]


def compiled_cells(ns: tuple[int, ...], shape: dict, device: str, dtype: str) -> list[Cell]:
    """The compiled cells: each of :data:`COMPILED` at each n."""
    return [
        flat_cell(
            name, n=n, params=params, device=device, dtype=dtype, mode=mode, compile=comp, **shape
        )
        for n in ns
        for name, params, mode, comp in COMPILED
    ]


def order(p: Profile, measured: Collection[str] = ()) -> list[Item]:
    """Every cell of the check in the order it runs (the module docstring's sections),
    each once; in the last section, cells with a key in ``measured`` (a GPU has run them)
    after the others."""
    causal, shape, dev, dtype = (("causal", True),), p.shape, p.device, p.dtype
    fla = "fla against torch: the mixers' kernels side by side at one batch"
    out = []
    for mode, settings, b in NEW:
        drawn = {**settings, **p.draw} if mode == "packed" else settings  # packed's documents
        out += [
            Item(flat_cell(name, n=p.n_new, batch=b, params=(*causal, ("kernel", kernel)),
                      device=dev, dtype=dtype, mode=mode, mode_settings=drawn, **shape), fla)
            for name in p.mixers for kernel in KERNELS
        ]  # fmt: skip
    out += [
        Item(flat_cell("gated_deltanet", n=p.n_new, batch=8, params=(*causal, ("kernel", kernel)),
                  device=dev, dtype="fp32", **shape), "an fp32 Gated DeltaNet")
        for kernel in KERNELS
    ]  # fmt: skip
    compiled = compiled_cells(p.ns_compiled, shape, dev, dtype)
    flex = "flex trains after an inference cell"
    out += [Item(c, flex) for c in compiled if c.attention == "flex" and not c.compile]
    mix = "decode over a mix: drawn prompts beside every prompt n"
    out += [
        Item(decode_cell(name, p.ns_decode[0], shape, p.decode_device, dtype, **context), mix)
        for name in MIX for context in ({"contexts": "drawn", **p.draw}, {})
    ]  # fmt: skip
    packed = "packed against padded"
    out += [
        Item(flat_cell(name, n=p.n_new, params=(*causal, *params), device=dev, dtype=dtype,
                  mode="packed", mode_settings={"layout": layout, **p.draw}, **shape), packed)
        for name, params in PACKED_VS_PADDED for layout in ("packed", "padded")
    ]  # fmt: skip
    frag = f"the allocator's fragmentation: default, then {ALLOC_ENV}={EXPANDABLE}"
    fragmented = cells(p.ns[:1], shape, dev, dtype, p.fragmented)
    named = presets.load(dev).is_gpu  # a GPU preset's cell names its allocator (the row
    out += [  # records it, the model replays it); the CPU smoke's cpu preset has none
        Item(replace(c, allocator=alloc) if alloc and named else c, frag, alloc)
        for alloc in (None, EXPANDABLE) for c in fragmented
    ]  # fmt: skip
    rest = (
        all_cells(p.ns, p.ns_train, shape, dev, dtype)
        + compiled
        + decode_cells(p.ns_decode, shape, p.decode_device, dtype)
        + list(p.extra)
    )
    rest.sort(key=lambda c: _done_key(c) in measured)  # stable: otherwise in order
    out += [
        Item(c, "the rest: the first run's cells, those no GPU has measured first") for c in rest
    ]
    seen: set[str] = set()
    return [i for i in out if not (_done_key(i) in seen or seen.add(_done_key(i)))]


def _done_key(c: Item | Cell | Row) -> str:
    """What tells this script's cells apart, read alike from a cell (or an item) and from its
    stored row: the workload's settings where they are not the defaults (a layout, a mix of
    prompts) and the allocator setting it ran under (a row's ``env``) among them."""
    alloc = c.alloc if isinstance(c, Item) else c.env.get(ALLOC_ENV) if isinstance(c, Row) else None
    c = c.cell if isinstance(c, Item) else c
    c = complete(c) if isinstance(c, Cell) else c  # a cell's settings: its workload's defaults too
    work = find_workload(c.mode)
    settings = sorted(
        [s.name, setting(c, s.name)]
        for s in (work.settings if work else ())
        if s.name != "checkpoint" and setting(c, s.name) not in (None, s.default)
    )
    return json.dumps(
        [
            c.attention,
            c.n,
            c.k,
            sorted(dict(c.params).items()),
            c.mode,
            c.compile,
            c.device,
            bool(c.settings.get("checkpoint") if isinstance(c, Cell) else c.checkpoint),
            c.batch if isinstance(c, Cell) else c.batch_asked,
            (c.model.shape if isinstance(c, Cell) else c.model or {}).get("kv_heads"),
            c.dtype,
            settings,
            alloc,
        ],
        default=str,
    )
