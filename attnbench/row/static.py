"""The row's fields as a type checker sees them, generated from
attnbench.row.fields.FIELDS by fields.static_source(); never imported at run time
(attnbench.row.Row is made from the table)."""

from typing import Any

from attnbench.row.record import _Record


class Row(_Record):
    def __init__(self, **fields: Any) -> None: ...

    attention: str
    n: int
    dtype: str
    device: str
    params: dict[str, Any]
    k: int | None
    budget: str | None
    mode: str
    task: str
    optimizer: str | None
    checkpoint: bool | None
    decode_tokens: int | None
    state_dtype: str | None
    prefill_chunk: int | None
    contexts: str | None
    lengths: tuple | None
    distribution: str | None
    total_tokens: int | None
    length_mean: int | None
    length_min: int | None
    length_seed: int | None
    layout: str | None
    bucket_tokens: int | None
    compile: bool
    compile_mode: str | None
    allocator: str | None
    batch_asked: int | str
    ceiling_bytes: int | None
    overhead_bytes: int | None
    model: dict[str, int | str]
    status: str | None
    reason: str | None
    max_batch: int | None
    batch: int | None
    predicted_max_batch: int | None
    allocated_max_batch: int | None
    probes: int | None
    model_error: int | None
    peak_bytes: int | None
    peak_reserved_bytes: int | None
    fragmentation: float | None
    state_bytes: int | None
    eager_peak_bytes: int | None
    memory_source: str | None
    time_median_s: float | None
    time_iqr_s: float | None
    repeats: int | None
    time_per_seq_s: float | None
    time_batch: int | None
    time_device: str | None
    time_dtype: str | None
    time_method: str | None
    time_samples_s: list[float] | None
    flops: int | None
    flops_backward: int | None
    flops_dense: int | None
    attention_params: int | None
    compiled: str | None
    compile_s: float | None
    compilations: int | None
    warmup_s: float | None
    mask_build_s: float | None
    time_parts: dict[str, dict[str, Any]] | None
    contention: dict[str, Any] | None
    decode: dict[str, Any] | None
    modeled_step: dict[str, Any] | None
    packed: dict[str, Any] | None
    prompts: dict[str, Any] | None
    quality: dict[str, Any] | None
    flops_per_s: float | None
    pct_of_peak: float | None
    env: dict[str, Any]
    key: str | None
    key_version: int | None
    sweep: str | None
    wall_s: float | None
    finished_at: float | None
    invocation: str | None
    cell: dict[str, Any] | None
    schema: int
