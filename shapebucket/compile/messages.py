"""The compiler's recompile messages, read: what the ``fail_on_recompile`` stance raises,
the guard failures it lists and the recompile-limit warning (torch 2.13 wording, which is
not a public API: a torch upgrade that changes it touches this module only)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "GuardFailure",
    "attribute_change",
    "changes_keywords",
    "is_recompile_error",
    "limit_function",
    "mode_change",
    "parse_recompile_error",
]

_FAILURE_LINE = re.compile(r"- \d+/\d+: (.*)")
_SIZE_MISMATCH = re.compile(
    r"tensor '(.+?)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)"
)
_GLOBAL_STATE = re.compile(r"GLOBAL_STATE changed: (.*)")
_TRAINING = re.compile(r"^(.*?)\.training == (True|False)")
_KEYWORD_GUARD = re.compile(r"^len\(\w+\) [!=]= \d+$|\bis (not )?None$|^'\w+' (not )?in \w+$")
_ATTRIBUTE = re.compile(r"^(?:L\['self'\]|self)((?:\.\w+|\[[^\]]*\])+) (?:==|!=|is not|is) ")


@dataclass(frozen=True)
class GuardFailure:
    """One guard failure from a recompile message: a size mismatch (``name``, ``dim`` and
    ``actual`` set) or another guard (only ``text``)."""

    text: str
    name: str | None = None
    dim: int | None = None
    actual: int | None = None

    @property
    def is_size(self) -> bool:
        return self.name is not None


def is_recompile_error(error: BaseException) -> bool:
    """Whether ``error`` is what the ``fail_on_recompile`` stance raises."""
    return isinstance(error, RuntimeError) and "fail_on_recompile" in str(error)


def parse_recompile_error(text: str) -> list[GuardFailure]:
    """The guard failures listed in a ``fail_on_recompile`` error (torch 2.13 wording); a
    name may hold quotes itself (``kwargs['input_ids']``, a Hugging Face model's input).

    >>> [f.name for f in parse_recompile_error(
    ...     "- 0/0: tensor 'kwargs['input_ids']' size mismatch at index 1. expected 8, actual 24")]
    ["kwargs['input_ids']"]
    """
    out = []
    for line in _FAILURE_LINE.findall(text):
        m = _SIZE_MISMATCH.search(line)
        if m:
            name, dim, actual = m.group(1, 2, 4)
            out.append(GuardFailure(line, name, int(dim), int(actual)))
        else:
            out.append(GuardFailure(line.strip()))
    return out


def mode_change(guard: str) -> str | None:
    """The mode a failed guard says changed, as a cause and its fix: grad mode
    (``torch.no_grad()``, ``torch.inference_mode()``), a module's train or eval mode,
    or other global torch state; ``None`` for any other guard.

    >>> mode_change("GLOBAL_STATE changed: grad_mode ")[:42]
    'grad mode: the call runs with gradients on'
    >>> mode_change("fn._modules['1'].training == True   # return F.dropout(...)")[:56]
    "eval mode: fn._modules['1'] was compiled (or prewarmed) "
    >>> mode_change("tensor 'x' stride mismatch at index 0") is None
    True
    """
    head = guard.split("#", 1)[0].strip()
    state = _GLOBAL_STATE.search(head)
    if state and "grad_mode" in state.group(1):
        return (
            "grad mode: the call runs with gradients on or off (torch.no_grad(), "
            "torch.inference_mode()) unlike the prewarmed calls; prewarm in the loop's mode "
            "(modes=[Inference()] for a loop under torch.inference_mode(); for a loop under "
            "torch.no_grad(), call prewarm under it: with torch.no_grad(): prewarm(...))"
        )
    if state:
        return (
            f"global torch state changed ({state.group(1).strip()}); prewarm under the same "
            "state as the loop (autocast, grad mode, deterministic algorithms)"
        )
    training = _TRAINING.search(head)
    if training:
        module, was = training.group(1), training.group(2) == "True"
        now, then = ("eval", "train") if was else ("train", "eval")
        return (
            f"{now} mode: {module} was compiled (or prewarmed) in {then} mode and the call runs "
            f"it in {now} mode; call model.{now}() before prewarm or the first compiled call "
            "(prewarm puts the mode back afterwards)"
        )
    return None


def attribute_change(guard: str) -> str | None:
    """A failed guard on a model attribute (``self.config.problem_type is None``,
    ``self.ready == True``), as a cause and its fix; ``None`` for any other guard. The
    model changed it in a call (transformers sets a classifier's ``config.problem_type``
    in its first call with labels), so a later call runs in another state than the one
    compiled.

    >>> attribute_change("self.config.problem_type is None   # if self.config...")[:62]
    'a model attribute changed by a call (model.config.problem_type'
    >>> attribute_change("labels is None") is None
    True
    """
    head = guard.split("#", 1)[0].strip()
    match = _ATTRIBUTE.search(head)
    if match is None or match.group(1).endswith(".training"):
        return None
    path = "model" + re.sub(r"\._modules\['(\w+)'\]", r".\1", match.group(1))
    example = f"{path} = <the value it takes in the first call>"
    if path.endswith(".config.problem_type"):
        example = (
            f'{path} = "single_label_classification" (or "multi_label_classification", '
            '"regression": what transformers picks from num_labels and the labels\' dtype)'
        )
    return (
        f"a model attribute changed by a call ({path}; the compiled graph guards {head!r}): "
        "the model sets it while it runs, so later calls run in another state than the one "
        f"compiled (or prewarm put it back). Set it before prewarm and the loop: {example}"
    )


def limit_function(message: str) -> str:
    """The function named in dynamo's recompile-limit warning (or the warning's first line)."""
    match = re.search(r"function: '([^']+)' \(([^)]+)\)", message)
    return f"{match.group(1)} ({match.group(2)})" if match else message.splitlines()[0][:80]


def changes_keywords(guard: str) -> bool:
    """Whether a failed guard checks which inputs a call passes (``len(kwargs) == 1``,
    ``labels is None``, ``'labels' in kwargs``) rather than a tensor's size, dtype, device
    or stride.

    >>> changes_keywords("len(kwargs) == 1   # output = func(self, *args, **kwargs)")
    True
    >>> changes_keywords("labels is None   # return y if labels is None else y")
    True
    >>> changes_keywords("tensor 'x' stride mismatch at index 0")
    False
    """
    return bool(_KEYWORD_GUARD.search(guard.split("#", 1)[0].strip()))
