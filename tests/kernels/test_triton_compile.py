"""Every Triton kernel compiles for a CUDA GPU (sm_90) with the arguments its launcher passes.

The interpreter executes kernels as Python and misses compiler-only errors (non-constexpr globals,
loop-carried type changes, unsupported dot shapes). This compiles each launch to a cubin without a
GPU: the launchers run on CPU tensors with the launch itself recorded instead of executed.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from treegraft.kernels import _dispatch, ancestor_mask, tree_depth  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
POINTER_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.uint8: "u8",
}


class Recorder:
    """Stands in for ``launchable``: records ``kernel[grid](*args, **constexprs)`` calls."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, tuple, dict]] = []

    def __call__(self, kernel: Any) -> Recorder:
        self.kernel = kernel
        return self

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        kernel = self.kernel
        return lambda *args, **kwargs: self.launches.append((kernel, args, kwargs))


def _scalar_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


def compile_launch(kernel: Any, args: tuple, constexprs: dict) -> Any:
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {
        name: _scalar_type(arg) for name, arg in zip(names[: len(args)], args, strict=True)
    }
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=TARGET)


def recorded_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, tuple, dict]]:
    """Run every launcher once per dtype on CPU tensors, recording the kernel launches."""
    from treegraft.kernels.ancestor_mask import triton as mask_ops
    from treegraft.kernels.greedy_accept import triton as accept_ops
    from treegraft.kernels.kv_compact import triton as compact_ops
    from treegraft.kernels.prune_to_budget import triton as prune_ops
    from treegraft.kernels.tree_attention import triton as attention_ops

    recorder = Recorder()
    modules = (mask_ops, accept_ops, compact_ops, prune_ops, attention_ops)
    for module in modules:
        monkeypatch.setattr(module, "launchable", recorder)
        monkeypatch.setattr(module, "check_device", lambda *tensors: None)
    parents = torch.cat([torch.tensor([-1]), torch.arange(99) // 2])  # [100]
    mask_ops.ancestor_mask(parents)
    mask_ops.ancestor_mask_packed(parents)
    mask_ops.tree_depth(parents)
    accept_ops.greedy_accept(parents, parents, parents)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        compact_ops.kv_compact(torch.zeros(2, 2, 2, 16, 128, dtype=dtype), torch.tensor([3, 5]), 2)
    for dtype in (torch.float32, torch.float64):
        prune_ops.prune_to_budget(parents, torch.zeros(100, dtype=dtype), tree_depth(parents), 10)
    attention_cases = [(torch.float16, 128, 1), (torch.bfloat16, 128, 1), (torch.float32, 64, 1)]
    attention_cases.append((torch.float16, 128, 3))  # split-KV: partial kernel + merge kernel
    for dtype, head_dim, splits in attention_cases:
        monkeypatch.setattr(attention_ops, "num_key_splits", lambda *args, s=splits: s)
        query = torch.zeros(1, 4, 100, head_dim, dtype=dtype)
        kv = torch.zeros(1, 2, 300, head_dim, dtype=dtype)
        attention_ops.tree_attention(
            query, kv, kv, prefix_len=200, tree_mask=ancestor_mask(parents)
        )
    return recorder.launches


def test_every_launch_compiles_for_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # the default; silences a warning
    if _dispatch.interpreter_enabled():
        pytest.skip("triton was imported in interpreter mode; it cannot compile in this process")
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton build has no CUDA backend")
    launches = recorded_launches(monkeypatch)
    assert len(launches) == 19  # 3 mask, 1 accept, 4 compact, 2x3 prune, 3 + 2 attention
    for kernel, args, constexprs in launches:
        compiled = compile_launch(kernel, args, constexprs)
        assert "cubin" in compiled.asm, kernel.fn.__name__
