"""Every use of torch's private compiler APIs, one module per torch area, for torch >= 2.11
(:mod:`.version`); importing it loads no part of dynamo or inductor (``docs/architecture.md``).
"""

from .aot import AOT_MISS, aot_call, aot_compile_call, aot_deserialize, aot_serialize, has_hooks
from .counters import (
    compile_events,
    inductor_cache_counts,
    recompile_limit_hits,
    reset_compiler,
    unique_graphs,
)
from .dynamo import (
    automatic_dynamic,
    frame_callback_getter,
    fresh_forward,
    get_recompile_limit,
    is_compiled_module,
    on_compile_start,
    raised_recompile_limit,
    set_recompile_limit,
    unwrap_compiled,
)
from .inductor import (
    fresh_inductor_cache,
    inductor_cache_dir,
    load_cache_artifacts,
    save_cache_artifacts,
)
from .logs import add_limit_handler, add_recompile_handler
from .marks import (
    apply_compiler_marks,
    mark_dynamic_dim,
    not_compiled,
    skip_frame_only,
)
from .profiler import cpu_allocation_peak_bytes
from .tensors import copy_all
from .version import recompile_limit_fix

__all__ = [
    "AOT_MISS",
    "add_limit_handler",
    "add_recompile_handler",
    "aot_call",
    "aot_compile_call",
    "aot_deserialize",
    "aot_serialize",
    "apply_compiler_marks",
    "automatic_dynamic",
    "compile_events",
    "copy_all",
    "cpu_allocation_peak_bytes",
    "frame_callback_getter",
    "fresh_forward",
    "fresh_inductor_cache",
    "get_recompile_limit",
    "has_hooks",
    "inductor_cache_counts",
    "inductor_cache_dir",
    "is_compiled_module",
    "load_cache_artifacts",
    "mark_dynamic_dim",
    "not_compiled",
    "on_compile_start",
    "raised_recompile_limit",
    "recompile_limit_fix",
    "recompile_limit_hits",
    "reset_compiler",
    "save_cache_artifacts",
    "set_recompile_limit",
    "skip_frame_only",
    "unique_graphs",
    "unwrap_compiled",
]
