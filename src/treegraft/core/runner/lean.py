"""Lean forward: a Llama-shaped causal LM's forward over the runner's cache, without module calls.

A small model's forward in `transformers` spends most of its time outside arithmetic: module
dispatch, decorators, output records, mask preparation (the zoo's one-layer drafter: about 1.1 ms
of a 1.7 ms tree forward on 2 CPU threads). `LeanForward` runs the same tensor operations, in the
same order and on the same weights, as `transformers`' Llama, Mistral, Qwen2 and Qwen3 with `sdpa`
attention (`lean_families`: what each adds to Llama's layers, as data), writing keys and values
straight into the runner's preallocated cache. Being the same operations, its logits are bitwise
equal to the Hugging Face forward's (tested on every zoo model and on each family, float32 and
float64), so a target that runs it still decodes exactly what `generate` does.

`lean_support(model)` says why a model cannot take this path (None when it can): only those
families' plain causal LMs qualify (a static RoPE: one of `STATIC_ROPE_TYPES`, SiLU MLPs, `sdpa`
attention, eval mode, no hooks, no accelerate offloading, every module of the family's own exact
type and every linear layer a plain `torch.nn.Linear`: not quantised or wrapped by an adapter);
everything else runs through `transformers` unchanged.
RoPE frequencies and the factor on cosines and sines (YaRN's attention factor) are the model's
rotary embedding's own (`inv_freq`, `attention_scaling`), so a scaled RoPE (Llama 3.x's `llama3`,
`linear`, `yarn`) rotates exactly as `transformers` rotates it.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from treegraft.core.runner.lean_families import STATIC_ROPE_TYPES, lean_support

__all__ = ["FORWARDS", "STATIC_ROPE_TYPES", "FusedForward", "LeanForward", "lean_support"]

FORWARDS = ("auto", "lean", "fused", "transformers")
#: torch's SDPA takes `enable_gqa` (grouped key/value heads without repeating them) from 2.5 on
_SDPA_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)
#: blocks of at least this many rows project through contiguous transposed weights (`Transposed`)
TRANSPOSED_MIN_ROWS = 4
#: the most bytes of extra weight copies `Transposed` keeps for one model
TRANSPOSED_MAX_BYTES = 512 << 20
#: row counts the transposed projection is checked at against `F.linear` (`Transposed.probe`)
_PROBE_ROWS = (4, 5, 8, 13, 16, 33, 64)
#: an additive attention mask `[q, kv_len]`, or one `[1, 1, q, kv_len]` per layer type
Masks = Tensor | dict[str, Tensor] | None


class Layer(NamedTuple):
    """One decoder layer's weights as the lean forward reads them: norms `(weight, eps)`,
    linear layers `(weight, bias or None)`; `q_norm` and `k_norm` where queries and keys pass
    an RMSNorm per head (Qwen3's), else None."""

    input_norm: tuple[Tensor, float]
    q: tuple[Tensor, Tensor | None]
    k: tuple[Tensor, Tensor | None]
    v: tuple[Tensor, Tensor | None]
    o: tuple[Tensor, Tensor | None]
    post_norm: tuple[Tensor, float]
    gate: tuple[Tensor, Tensor | None]
    up: tuple[Tensor, Tensor | None]
    down: tuple[Tensor, Tensor | None]
    q_norm: tuple[Tensor, float] | None = None
    k_norm: tuple[Tensor, float] | None = None

    @classmethod
    def of(cls, layer: Any) -> Layer:
        """The weights of a `transformers` decoder layer (`lean_families.FAMILIES`)."""
        att, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(att, "q_norm", None), getattr(att, "k_norm", None)
        return cls(
            _norm(layer.input_layernorm),
            *(_linear(m) for m in (att.q_proj, att.k_proj, att.v_proj, att.o_proj)),
            _norm(layer.post_attention_layernorm),
            *(_linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)),
            None if q_norm is None else _norm(q_norm),
            None if k_norm is None else _norm(k_norm),
        )


#: the linear layers' places in a `Layer` (the others are norms)
_LINEARS = (1, 2, 3, 4, 6, 7, 8)


def _norm(module: Any) -> tuple[Tensor, float]:
    return module.weight, module.variance_epsilon


def _linear(module: Any) -> tuple[Tensor, Tensor | None]:
    return module.weight, module.bias


class LeanForward:
    """The forward of one causal LM of `lean_families.FAMILIES`, bound to its weights (read at
    construction).

    Call with `(ids [q], positions [q], additive, kv, write_start, n_logits)`, where `additive`
    is the block's attention mask `[q, kv_len]` with the model's attention rules applied (its
    sliding window), or a dict of `[1, 1, q, kv_len]` masks by layer type (the config's
    `layer_types`) where layers differ, as the runner builds them (`attention_rules`), `kv` is
    the runner's cache `[n_layers, 2, n_kv_heads, max_len, head_dim]` and the block's keys
    and values are written at slots `[write_start, write_start + q)`; returns logits
    `[n_logits, V]` of the block's last `n_logits` tokens. `head`: other output rows (weight
    `[K, hidden]`, bias or None) to project onto instead of the model's `lm_head`, giving
    `[n_logits, K]` logits (a runner restricted to some tokens: `CausalLMRunner.restrict_output`).
    `hidden`: a `[q, hidden]` buffer receiving the block's final-norm hidden states (what the
    output head reads: the features of `CausalLMRunner.track_hidden`). `causal`: the block is
    a causal chain over slots `0 .. q - 1` (a prefill: `additive` None, no other keys), attended
    as `transformers` attends a forward without a mask (`generate`'s prefill): SDPA's causal
    kernel, which skips the keys above the diagonal, and grouped heads handed over as they are.
    """

    def __init__(self, model: Any, *, transposed: bool = True, bitwise: bool = True) -> None:
        why = lean_support(model)
        if why is not None:
            raise ValueError(f"the lean forward does not support this model: {why}")
        cfg = model.config
        base = model.model
        self.embed = base.embed_tokens.weight
        self.padding_idx = base.embed_tokens.padding_idx
        #: RoPE as the model's rotary embedding built it (static: `STATIC_ROPE_TYPES`): inverse
        #: frequencies, and the factor on cosines and sines (YaRN's attention factor, else 1)
        self.inv_freq = base.rotary_emb.inv_freq
        self.rope_scaling = float(base.rotary_emb.attention_scaling)
        self.norm = _norm(base.norm)
        self.lm_head = _linear(model.lm_head)
        self.layers = [Layer.of(layer) for layer in base.layers[: cfg.num_hidden_layers]]
        #: each layer's type, naming its mask where masks come by layer type (None: one mask)
        kinds = getattr(cfg, "layer_types", None)
        self.kinds = tuple(kinds[: len(self.layers)]) if kinds else None
        first = base.layers[0].self_attn
        self.head_dim = first.head_dim
        self.groups = first.num_key_value_groups
        self.scaling = first.scaling
        #: contiguous transposed weights for blocks of several rows (None: `F.linear` only);
        #: with `bitwise` False kept where their products equal `F.linear`'s only to rounding
        self.transposed = (
            Transposed.build(self.layers, self.lm_head, bitwise=bitwise) if transposed else None
        )

    def layer_masks(self, additive: Masks) -> list[Tensor | None]:
        """Each layer's mask `[1, 1, q, kv_len]` from `additive` (None: every key visible)."""
        if not isinstance(additive, dict):
            mask = None if additive is None else additive[None, None]
            return [mask] * len(self.layers)
        if self.kinds is None or not set(self.kinds) <= set(additive):
            raise ValueError(
                "masks by layer type: expected one for each of the config's layer_types "
                f"{sorted(set(self.kinds or ()))}, got {sorted(additive)}"
            )
        return [additive[kind] for kind in self.kinds]

    def __call__(
        self,
        ids: Tensor,
        positions: Tensor,
        additive: Masks,
        kv: Tensor,
        write_start: int,
        n_logits: int,
        head: tuple[Tensor, Tensor | None] | None = None,
        hidden: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        q_len = int(ids.shape[0])
        end = write_start + q_len
        check_causal(causal, additive, write_start)
        h = F.embedding(ids[None], self.embed, self.padding_idx)  # [1, q, hidden]
        dtype = h.dtype
        freqs = positions[None, :, None].float() * self.inv_freq.to(
            device=h.device, dtype=torch.float
        )
        cos, sin = self._scaled(torch.cat((freqs, freqs), dim=-1))
        cos = cos.to(dtype)[:, None]  # [1, 1, q, D]
        sin = sin.to(dtype)[:, None]
        masks = self.layer_masks(additive)
        shape = (1, q_len, -1, self.head_dim)
        table = self.transposed if q_len >= TRANSPOSED_MIN_ROWS else None  # 1-3 rows: F.linear
        linear = table.linear if table is not None else _plain_linear
        for li, (n1, wq, wk, wv, wo, n2, wg, wu, wd, qn, kn) in enumerate(self.layers):
            residual = h
            x = _rms_norm(h, *n1)
            q = _heads(linear(x, wq).view(shape), qn)
            k = _heads(linear(x, wk).view(shape), kn)
            v = linear(x, wv).view(shape).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            layer = kv[li]
            layer[0, :, write_start:end] = k[0]
            layer[1, :, write_start:end] = v[0]
            keys = layer[0, :, :end].unsqueeze(0)
            values = layer[1, :, :end].unsqueeze(0)
            att = self._attention(q, keys, values, masks[li], q_len, causal)
            h = residual + linear(att.reshape(1, q_len, -1).contiguous(), wo)
            residual = h
            x = _rms_norm(h, *n2)
            h = residual + linear(F.silu(linear(x, wg)) * linear(x, wu), wd)
        normed = _rms_norm(h, *self.norm)  # [1, q, hidden]
        if hidden is not None:
            hidden.copy_(normed[0])
        return self._logits(normed, n_logits, head)

    def _scaled(self, emb: Tensor) -> tuple[Tensor, Tensor]:
        """Cosines and sines of the float32 angles `emb`, times the rotary embedding's factor
        (in float32, as `LlamaRotaryEmbedding` scales them; a factor of 1 changes no bit)."""
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scaling != 1.0:
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        return cos, sin

    def _logits(
        self, h: Tensor, n_logits: int, head: tuple[Tensor, Tensor | None] | None
    ) -> Tensor:
        """`[n_logits, K]` logits of the last `n_logits` rows of the normed hidden states `h`
        (`[1, q, hidden]`), projected on `head` or the model's `lm_head`."""
        weight, bias = head if head is not None else self.lm_head
        if not n_logits:
            return h.new_zeros(0, weight.shape[0])
        if head is None and self.transposed is not None:
            return self.transposed.linear(h[:, -n_logits:, :], self.lm_head)[0]
        return F.linear(h[:, -n_logits:, :], weight, bias)[0]

    def _attention(
        self,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None,
        q_len: int,
        causal: bool = False,
    ) -> Tensor:
        """`transformers`' SDPA attention for a given additive mask, or `causal` with none.

        Grouped heads as it hands them to SDPA, but for a masked block of several rows on a CPU:
        there `transformers` repeats each key/value head for its query heads, a copy of the
        whole cache per layer (at 8k cached tokens most of a small tree forward's time), while
        SDPA's CPU kernel reads the grouped heads in place (`enable_gqa`), the same products
        on the same numbers (the tests check the logits bit for bit)."""
        gqa = {}
        if self.groups > 1:
            if q_len == 1:  # one query: heads packed per key/value head, no key repeat
                b, h, _, d = q.shape
                q = q.reshape(b, h // self.groups, self.groups, d)
            elif _SDPA_GQA and (causal or q.device.type == "cpu") and keys.shape[-1] <= 256:
                gqa = {"enable_gqa": True}
            else:
                keys = _repeat_kv(keys, self.groups)
                values = _repeat_kv(values, self.groups)
        out = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=mask,
            dropout_p=0.0,
            scale=self.scaling,
            is_causal=causal and q_len > 1,
            **gqa,
        )
        out = out.reshape(out.shape[0], -1, q_len, values.shape[-1])
        return out.transpose(1, 2).contiguous()


def check_causal(causal: bool, additive: Any, write_start: int) -> None:
    """A causal block takes no mask and starts at slot 0 (its keys are its own rows)."""
    if causal and (additive is not None or write_start != 0):
        raise ValueError(
            "a causal block starts at cache slot 0 and takes no mask, got "
            f"write_start={write_start} and {'a' if additive is not None else 'no'} mask"
        )


def _rounding_apart(got: Tensor, want: Tensor) -> bool:
    """Whether two float32 products of the same operands differ by no more than summation
    order explains (a relative 1e-5 of the largest magnitude)."""
    return bool((got - want).abs().max() <= 1e-5 * want.abs().max().clamp(min=1.0))


def _plain_linear(x: Tensor, linear: tuple[Tensor, Tensor | None]) -> Tensor:
    return F.linear(x, *linear)


class Transposed:
    """Contiguous transposed copies of a model's linear weights, for blocks of several rows.

    `F.linear(x, W)` multiplies by `W` transposed as a view; on a CPU in float32, torch's BLAS
    (MKL) multiplies by a contiguous `W.T` copy faster (the zoo target's projections: 5-11% of
    their time at 4-64 rows) and, from `TRANSPOSED_MIN_ROWS` rows on, with the same bits: each
    output row is summed in the same order whatever the row count (where 2-3 rows run more
    slowly than 4, the runner pads such blocks to 4: `treegraft.core.runner.padding`).
    The copies double the memory of the linear weights: kept up to `TRANSPOSED_MAX_BYTES`; a
    weight changed in place (its version counter moved) is copied again at its next use. Fewer rows take other kernels, whose bits
    differ, so they keep `F.linear`. `build` checks the equality on every weight shape at the
    row counts in `_PROBE_ROWS` and keeps the copies only where it holds everywhere, so a BLAS
    that sums otherwise falls back to `F.linear` for all blocks. Where the runner's products
    need not be bitwise (`CausalLMRunner.bitwise` False, `decoding.forward: lean-fast`), the
    copies are kept wherever they agree to rounding: on a BLAS whose transposed product sums in
    another order (an AVX512/AMX Xeon's MKL) that makes the zoo target's forwards of 4-32
    tokens 9-23% cheaper.
    """

    def __init__(self, weights: dict[int, Tensor]) -> None:
        self.weights = weights  # id(W) -> W.T contiguous  [in, out]
        self.versions: dict[int, int] = {}  # id(W) -> W._version when copied

    @classmethod
    def build(
        cls, layers: list[tuple], lm_head: tuple[Tensor, Tensor | None], *, bitwise: bool = True
    ) -> Transposed | None:
        """The copies for `layers` (as `LeanForward.layers`) and `lm_head`, or None where the
        model is not float32 on a CPU, its copies would pass `TRANSPOSED_MAX_BYTES`, or a
        transposed product differs from `F.linear` in any bit (with `bitwise` False: by more
        than rounding; `CausalLMRunner.bitwise` False)."""
        linears = [lm_head] + [layer[i] for layer in layers for i in _LINEARS]
        weight = lm_head[0]
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        if sum(w.numel() * w.element_size() for w, _ in linears) > TRANSPOSED_MAX_BYTES:
            return None
        fresh = [w for w, _ in linears if not _held(w)]  # copies this build makes
        table = cls({id(w): transposed_copy(w) for w, _ in linears})
        table.versions = {id(w): w._version for w, _ in linears}
        probed: set[tuple] = set()
        for w, b in linears:
            kind = (tuple(w.shape), b is None)
            if kind not in probed:
                probed.add(kind)
                # bitwise: `probe(linear)`, the form an override of `probe` may take alone
                agrees = table.probe((w, b)) if bitwise else table.probe((w, b), bitwise=False)
                if not agrees:  # refused: keep no copy made for it
                    for w in fresh:
                        _COPIES.pop(id(w), None)
                    return None
        return table

    def probe(self, linear: tuple[Tensor, Tensor | None], *, bitwise: bool = True) -> bool:
        """Whether `linear` gives `F.linear`'s bits (`bitwise`; else its results to float32
        rounding) at every row count in `_PROBE_ROWS`."""
        weight = linear[0]
        gen = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for rows in _PROBE_ROWS:
                x = torch.randn(1, rows, weight.shape[1], generator=gen, dtype=weight.dtype)
                got, want = self.linear(x, linear), F.linear(x, *linear)
                if not (torch.equal(got, want) if bitwise else _rounding_apart(got, want)):
                    return False
        return True

    def linear(self, x: Tensor, linear: tuple[Tensor, Tensor | None]) -> Tensor:
        """`F.linear(x, *linear)` for `x` `[1, rows, in]`, bit for bit."""
        weight, bias = linear
        if x.shape[-2] < TRANSPOSED_MIN_ROWS:
            return F.linear(x, weight, bias)
        key = id(weight)
        if weight._version != self.versions[key]:  # changed in place since copied
            self.weights[key] = transposed_copy(weight)
            self.versions[key] = weight._version
        wt = self.weights[key]  # [in, out]
        if bias is None:
            return torch.matmul(x, wt)
        flat = torch.addmm(bias, x.reshape(-1, x.shape[-1]), wt)  # F.linear's path with a bias
        return flat.view(*x.shape[:-1], wt.shape[1])


#: contiguous `W.T` copies by `id(W)`: a weak reference to `W`, `W`'s version when copied, the
#: copy. Every runner of a model builds its own `Transposed`; they share these, so a process
#: holding many runners of one model (a benchmark) keeps one copy of its weights, not one each.
_COPIES: dict[int, tuple[weakref.ref, int, Tensor]] = {}
#: ids of the weights `_forget` is registered for (once each)
_WATCHED: set[int] = set()


def transposed_copy(weight: Tensor) -> Tensor:
    """A contiguous copy of `weight.T` (`[in, out]`), shared by every caller asking for the same
    weight at the same version; copied again once the weight changed in place, and dropped with
    the weight."""
    key = id(weight)
    if _held(weight):
        return _COPIES[key][2]
    if key not in _WATCHED:
        _WATCHED.add(key)
        weakref.finalize(weight, _forget, key)
    copy = weight.detach().t().contiguous()
    _COPIES[key] = (weakref.ref(weight), weight._version, copy)
    return copy


def _forget(key: int) -> None:
    """Drop the copy of the weight `key` names (it is being collected)."""
    _COPIES.pop(key, None)
    _WATCHED.discard(key)


def _held(weight: Tensor) -> bool:
    """Whether `_COPIES` holds a current copy of `weight`."""
    held = _COPIES.get(id(weight))
    return held is not None and held[0]() is weight and held[1] == weight._version


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _heads(x: Tensor, norm: tuple[Tensor, float] | None) -> Tensor:
    """Projected heads `[1, q, heads, D]` as `[1, heads, q, D]`, RMS-normed per head first
    where the layer has such a norm (`Layer.q_norm`, `Layer.k_norm`)."""
    return (x if norm is None else _rms_norm(x, *norm)).transpose(1, 2)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class FusedForward(LeanForward):
    """A faster lean forward whose logits are close to, not bitwise equal to, `transformers`'.

    The same model, with fewer and larger operations: the query, key and value projections as one
    linear layer (their weights stacked once, here), gate and up projections as one, RoPE rotating
    queries and keys together with cosines and sines read from a table of every cache position,
    `torch.nn.functional.rms_norm`, queries' and keys' per-head norms (Qwen3's) as one, and
    grouped key/value heads handed to SDPA as they are (torch 2.5 and newer). A small drafter's
    forward is mostly per-operation overhead, so this saves 10-40% of it on a CPU
    (`benchmarks/drafter_forward_cost.py`); the sums run in another order, so the last bits of
    the logits can differ. Drafts only steer what the target verifies, so a drafter may run it
    (the `hf_lm` drafter's default); the target never does: its logits decide the output.
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model, transposed=False)
        cfg = model.config
        self.hidden = int(cfg.hidden_size)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        nq, nkv = self.n_heads, self.n_kv
        self.fused = [
            (n1, _stack(wq, wk, wv), wo, n2, _stack(wg, wu), wd, _stack_norms(qn, kn, nq, nkv))
            for n1, wq, wk, wv, wo, n2, wg, wu, wd, qn, kn in self.layers
        ]
        self._rope: tuple[Tensor, Tensor] | None = None  # cos, signed sin: [positions, D]

    def _rope_table(self, n_positions: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """Cosines and signed sines of positions `0 .. n_positions - 1` (grown when needed)."""
        table = self._rope
        if table is None or table[0].shape[0] < n_positions or table[0].device != like.device:
            pos = torch.arange(n_positions, device=like.device, dtype=torch.float)
            freqs = pos[:, None] * self.inv_freq.to(device=like.device, dtype=torch.float)
            half = freqs.shape[-1]
            cos, sin = self._scaled(torch.cat((freqs, freqs), dim=-1))
            sin[:, :half] = -sin[:, :half]  # rotate_half's sign folded in
            table = (cos.to(like.dtype), sin.to(like.dtype))
            self._rope = table
        return table

    def __call__(
        self,
        ids: Tensor,
        positions: Tensor,
        additive: Masks,
        kv: Tensor,
        write_start: int,
        n_logits: int,
        head: tuple[Tensor, Tensor | None] | None = None,
        hidden: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        q_len = int(ids.shape[0])
        end = write_start + q_len
        check_causal(causal, additive, write_start)
        h = F.embedding(ids[None], self.embed, self.padding_idx)  # [1, q, hidden]
        cos_table, sin_table = self._rope_table(kv.shape[3], h)
        cos = cos_table[positions][None, None]  # [1, 1, q, D]
        sin = sin_table[positions][None, None]
        masks = self.layer_masks(additive)
        d = self.head_dim
        nq, nkv = self.n_heads, self.n_kv
        half = d // 2
        shape = (self.hidden,)
        gqa = self.groups > 1
        for li, (n1, wqkv, wo, n2, wgu, wd, qk_norm) in enumerate(self.fused):
            x = F.rms_norm(h, shape, n1[0], n1[1])
            qkv = F.linear(x, *wqkv).view(1, q_len, nq + 2 * nkv, d)
            if qk_norm is not None:
                qkv = _normed_heads(qkv, nq + nkv, qk_norm)
            qkv = qkv.transpose(1, 2)
            qk = qkv[:, : nq + nkv]
            rotated = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rotated * sin
            layer = kv[li]
            layer[0, :, write_start:end] = qk[0, nq:]
            layer[1, :, write_start:end] = qkv[0, nq + nkv :]
            keys = layer[0, :, :end].unsqueeze(0)
            values = layer[1, :, :end].unsqueeze(0)
            q = qk[:, :nq]
            if gqa and not _SDPA_GQA:
                keys, values = _repeat_kv(keys, self.groups), _repeat_kv(values, self.groups)
            att = F.scaled_dot_product_attention(
                q,
                keys,
                values,
                attn_mask=masks[li],
                scale=self.scaling,
                is_causal=causal and q_len > 1,
                **({"enable_gqa": True} if gqa and _SDPA_GQA else {}),
            )
            h = h + F.linear(att.transpose(1, 2).reshape(1, q_len, -1), *wo)
            x = F.rms_norm(h, shape, n2[0], n2[1])
            gate, up = F.linear(x, *wgu).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, *wd)
        normed = F.rms_norm(h, shape, *self.norm)  # [1, q, hidden]
        if hidden is not None:
            hidden.copy_(normed[0])
        return self._logits(normed, n_logits, head)


def _stack(*linears: tuple[Tensor, Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """Several linear layers' `(weight, bias)` as one layer whose outputs follow in order."""
    weight = torch.cat([w for w, _ in linears])
    if all(b is None for _, b in linears):
        return weight, None
    biases = [b if b is not None else w.new_zeros(w.shape[0]) for w, b in linears]
    return weight, torch.cat(biases)


def _stack_norms(
    q_norm: tuple[Tensor, float] | None, k_norm: tuple[Tensor, float] | None, nq: int, nkv: int
) -> tuple[Tensor, Tensor] | None:
    """Queries' and keys' per-head norms as one over their `nq + nkv` heads: weights
    `[nq + nkv, D]` and epsilons `[nq + nkv, 1]` (None where the layer has none)."""
    if q_norm is None or k_norm is None:
        return None
    (wq, eq), (wk, ek) = q_norm, k_norm
    weight = torch.cat((wq.expand(nq, -1), wk.expand(nkv, -1)))
    eps = torch.tensor([[eq]] * nq + [[ek]] * nkv, dtype=torch.float32, device=wq.device)
    return weight, eps


def _normed_heads(qkv: Tensor, n: int, norm: tuple[Tensor, Tensor]) -> Tensor:
    """`qkv` `[1, q, heads, D]` with its first `n` heads (queries, keys) RMS-normed per head,
    in float32 as `transformers`' RMSNorm computes, by `norm` (`_stack_norms`)."""
    weight, eps = norm
    qk = qkv[:, :, :n].float()
    qk = qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + eps)
    return torch.cat((weight * qk.to(qkv.dtype), qkv[:, :, n:]), dim=2)
