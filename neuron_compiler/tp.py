"""Tensor parallelism (Megatron style) for transformers decoders: one rank's shard of a model,
with its all_reduce / all_gather as torch functional collectives (device operations, timed by
``runtime_sim.collectives``; see ``neuron_compiler.collectives``).

``shard_decoder(model, world, rank=0, group=None)`` rewrites a transformers Llama-family causal LM
(``LlamaForCausalLM`` and models with the same layer names: ``self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, ``lm_head``) in place into rank ``rank`` of ``world`` (GPT-2's
fused ``attn.c_attn`` and ``Conv1D`` layers: ``_shard_gpt2``, the same scheme):
- q/k/v and gate/up are column-parallel: rank r keeps query heads [r*H/N, (r+1)*H/N), the
  key/value heads of those queries [r*KV/N, (r+1)*KV/N) and rows [r*I/N, (r+1)*I/N) of the MLP;
- o_proj and down_proj are row-parallel: rank r keeps the matching input columns, and an
  ``all_reduce(sum)`` over ``group`` follows each (``RowParallel``); a bias is added after it;
- ``lm_head`` (when ``shard_lm_head``) is vocabulary-parallel: rank r computes its 1/N of the
  logits and an ``all_gather`` on the last dimension rebuilds them (``GatherParallel``), as
  NeuronX Distributed's ``ColumnParallelLinear(gather_output=True)``; embeddings and norms stay
  replicated.
- The model's config is rewritten to the rank's shapes (heads, key/value heads, intermediate
  size; ``head_dim`` kept), so a static KV cache made from it holds the rank's heads only.

One rank for all (``neuron-eval --tp N``): ``fake_group(world)`` opens a single-process process
group of ``world`` ranks (torch's testing ``FakeProcessGroup``: collectives complete at once,
an all_reduce returns its input and an all_gather leaves the other ranks' parts unset). The
rank's graph is compiled and simulated and each collective is timed as among ``world`` ranks;
the values are then one rank's, not the model's (the two-rank gloo test checks those).

A model built on the meta device (``with torch.device("meta")``: a real-size model that would
not fit in memory whole) is sliced on the meta device and only the rank's shards are made, with
seeded random values (normal(0, 0.02), norms 1): shapes and timing are the model's, values not.

Invariants
- With ``world`` real ranks (gloo) and the same full weights on each, every rank's sharded
  model returns the unsharded model's outputs (up to the summation order of the all_reduce).
- ``world`` must divide the attention heads, the key/value heads and the intermediate size;
  otherwise ``TPError`` names the size. A vocabulary it does not divide (GPT-2's 50,257) is
  padded with zero rows to the next multiple and the gathered logits are cut back to it.
- ``world == 1`` leaves the model unchanged.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


_c10d = torch.ops._c10d_functional   # the functional collective ops (plain tensors in eager)


class TPError(ValueError):
    """A model that cannot be sharded as asked (names the size and the world)."""


class RowParallel(nn.Module):
    """A row-parallel linear layer: ``all_reduce(x @ W_r^T) + b`` over ``group``."""

    def __init__(self, linear: nn.Linear, group: str):
        super().__init__()
        self.linear, self.group = linear, group
        self.bias = linear.bias
        linear.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _c10d.wait_tensor(_c10d.all_reduce(self.linear(x), "sum", self.group))
        return y if self.bias is None else y + self.bias


class GatherParallel(nn.Module):
    """A column-parallel linear layer whose output is all-gathered on its last dimension (and
    cut to ``size`` features when the shards were padded to a multiple of the world)."""

    def __init__(self, linear: nn.Linear, group: str, world: int, size: int | None = None):
        super().__init__()
        self.linear, self.group, self.world, self.size = linear, group, world, size

    @property
    def weight(self) -> torch.Tensor:        # transformers ties / inspects lm_head.weight
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).contiguous()
        g = _c10d.wait_tensor(_c10d.all_gather_into_tensor(y, self.world, self.group))
        out = torch.cat(torch.chunk(g, self.world, dim=0), dim=-1)   # gathered on dim 0
        return out if self.size is None else out[..., :self.size]


def fake_group(world: int) -> object:
    """A single-process process group of ``world`` ranks (this process is rank 0), for timing one
    rank (module docstring); reuses the default group when one of that size is open."""
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise TPError(f"tensor parallel: a process group of {dist.get_world_size()} ranks is "
                          f"already open, asked for {world}")
        return dist.group.WORLD
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return dist.group.WORLD


def close_fake_group() -> None:
    """Close the default process group if it is one ``fake_group`` opened (single process)."""
    if dist.is_initialized() and dist.get_backend() == "fake":
        dist.destroy_process_group()


def _div(what: str, n: int, world: int) -> int:
    if n % world:
        raise TPError(f"tensor parallel over {world} ranks: {what} ({n}) is not divisible by "
                      f"{world}")
    return n // world


def _linear(old: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A Linear holding copies of ``weight`` / ``bias`` (made on the meta device: no allocation
    beyond the copies; meta slices stay meta)."""
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta",
                    dtype=weight.dtype)
    grad = old.weight.requires_grad
    new.weight = nn.Parameter(weight.detach().clone().contiguous(), requires_grad=grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.detach().clone().contiguous(), requires_grad=grad)
    return new


def _cols(lin: nn.Linear, rows: slice) -> nn.Linear:
    """Column-parallel: output features ``rows`` of ``lin``."""
    return _linear(lin, lin.weight[rows], None if lin.bias is None else lin.bias[rows])


def _rows(lin: nn.Linear, cols: slice) -> nn.Linear:
    """Row-parallel: input features ``cols`` of ``lin`` (the bias is kept whole, added once)."""
    return _linear(lin, lin.weight[:, cols], lin.bias)


def _as_linear(conv: nn.Module) -> nn.Linear:
    """transformers' ``Conv1D`` (``x @ W + b``, W [in, out]) as the ``nn.Linear`` it is."""
    return _linear(conv, conv.weight.t(), conv.bias)


def _vocab_shard(head: nn.Linear, world: int, rank: int) -> tuple[nn.Linear, int | None]:
    """Rank ``rank``'s rows of a vocabulary-parallel head; a vocabulary the world does not
    divide is padded with zero rows to the next multiple (Megatron's padded vocabulary), and the
    gathered logits are cut back to it (the size returned, else None)."""
    vocab = head.out_features
    per = -(-vocab // world)
    lo, hi = rank * per, min((rank + 1) * per, vocab)
    w = head.weight[lo:hi]
    b = None if head.bias is None else head.bias[lo:hi]
    if hi - lo < per:                      # the padding rows (zeros), in the last ranks
        pad = per - (hi - lo)
        w = torch.cat([w, torch.zeros(pad, w.shape[1], dtype=w.dtype, device=w.device)])
        if b is not None:
            b = torch.cat([b, torch.zeros(pad, dtype=b.dtype, device=b.device)])
    return _linear(head, w, b), (None if vocab % world == 0 else vocab)


def _shard_head(model: nn.Module, world: int, rank: int, group: str) -> None:
    """A linear ``lm_head`` becomes vocabulary-parallel (``_vocab_shard``, then gathered); a
    tied head is untied first (the rank's rows are its own copy)."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear):
        model.config.tie_word_embeddings = False
        shard, size = _vocab_shard(head, world, rank)
        model.lm_head = GatherParallel(shard, group, world, size)


def materialize(model: nn.Module, seed: int = 0) -> None:
    """Meta parameters and buffers become real ones with seeded random values (docstring)."""
    metas = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    metas += [n for n, b in model.named_buffers() if b.device.type == "meta"]
    if not metas:
        return
    gen = torch.Generator().manual_seed(seed)
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if p.device.type != "meta":
                continue
            t = torch.empty(p.shape, dtype=p.dtype)
            if "norm" in type(mod).__name__.lower() or p.dim() == 1:
                t.fill_(1.0 if "norm" in type(mod).__name__.lower() else 0.0)
            else:
                t.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02)
            setattr(mod, name, nn.Parameter(t, requires_grad=p.requires_grad))
        for name, b in list(mod.named_buffers(recurse=False)):
            if b.device.type != "meta":
                continue
            # computed buffers (rotary inv_freq): rebuilt by the module's own constructor
            fresh = type(mod)(mod.config) if hasattr(mod, "config") else None
            made = None if fresh is None else dict(fresh.named_buffers(recurse=False)).get(name)
            if made is None or made.device.type == "meta":
                raise TPError(f"tensor parallel: buffer {name!r} of {type(mod).__name__} is on "
                              f"the meta device and cannot be rebuilt; build it on the CPU")
            setattr(mod, name, made)


def shard_decoder(model: nn.Module, world: int, rank: int = 0, group: object = None,
                  shard_lm_head: bool = True, seed: int = 0) -> nn.Module:
    """Rewrite ``model`` in place into rank ``rank`` of ``world`` (module docstring); returns it.
    ``group``: the process group of the collectives (default: the default group)."""
    if world == 1:
        materialize(model, seed)
        return model
    if not 0 <= rank < world:
        raise TPError(f"tensor parallel: rank must be in [0, {world}), got {rank}")
    group = dist.group.WORLD if group is None else group
    group = getattr(group, "group_name", group)     # a name: the model stays deep-copyable
    if any(hasattr(m, "c_attn") and hasattr(m, "c_proj") for m in model.modules()):
        return _shard_gpt2(model, world, rank, group, shard_lm_head, seed)
    cfg = model.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or \
        cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    h, k = _div("the attention heads", heads, world), _div("the key/value heads", kv, world)
    inter = _div("the intermediate size", cfg.intermediate_size, world)
    layers = [m for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")]
    if not layers:
        raise TPError(f"tensor parallel: {type(model).__name__} has no decoder layers with "
                      f"self_attn and mlp (a Llama-family model is expected)")
    q = slice(rank * h * head_dim, (rank + 1) * h * head_dim)
    kvs = slice(rank * k * head_dim, (rank + 1) * k * head_dim)
    mid = slice(rank * inter, (rank + 1) * inter)
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        a.q_proj, a.k_proj, a.v_proj = _cols(a.q_proj, q), _cols(a.k_proj, kvs), _cols(a.v_proj, kvs)
        a.o_proj = RowParallel(_rows(a.o_proj, q), group)
        m.gate_proj, m.up_proj = _cols(m.gate_proj, mid), _cols(m.up_proj, mid)
        m.down_proj = RowParallel(_rows(m.down_proj, mid), group)
        if hasattr(a, "num_heads"):
            a.num_heads = h
        if hasattr(a, "num_key_value_heads"):
            a.num_key_value_heads = k
        if hasattr(m, "intermediate_size"):
            m.intermediate_size = inter
    if shard_lm_head:
        _shard_head(model, world, rank, group)
    cfg.head_dim = head_dim
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size = h, k, inter
    cfg.tensor_parallel = {"world": world, "rank": rank}
    materialize(model, seed + rank)
    return model


def _shard_gpt2(model: nn.Module, world: int, rank: int, group: str, shard_lm_head: bool,
                seed: int) -> nn.Module:
    """GPT-2's layers (``attn.c_attn`` fused q|k|v and ``attn.c_proj``, ``mlp.c_fc`` and
    ``mlp.c_proj``, all ``Conv1D``) as Megatron shards them: c_attn column-parallel with the
    rank's heads of q, k and v kept fused (rank r: features [r*E/N, (r+1)*E/N) of each third),
    c_proj row-parallel + all_reduce; c_fc column-, mlp.c_proj row-parallel + all_reduce; the
    (tied) lm_head vocabulary-parallel, padded to a multiple of the world."""
    cfg = model.config
    heads, E = cfg.num_attention_heads, cfg.hidden_size
    head_dim = E // heads
    h = _div("the attention heads", heads, world)
    layers = [m for m in model.modules() if hasattr(m, "attn") and hasattr(m, "mlp")
              and hasattr(m.attn, "c_attn")]
    if any(getattr(m.attn, "is_cross_attention", False) for m in layers):
        raise TPError("tensor parallel: GPT-2 cross-attention layers are not sharded")
    inner = layers[0].mlp.c_fc.nf
    mid = _div("the MLP's inner size", inner, world)
    e0, e1 = rank * h * head_dim, (rank + 1) * h * head_dim
    for layer in layers:
        a, m = layer.attn, layer.mlp
        qkv = _as_linear(a.c_attn)
        thirds = [slice(j * E + e0, j * E + e1) for j in range(3)]
        a.c_attn = _linear(qkv, torch.cat([qkv.weight[t] for t in thirds]),
                           None if qkv.bias is None else torch.cat([qkv.bias[t] for t in thirds]))
        a.c_proj = RowParallel(_rows(_as_linear(a.c_proj), slice(e0, e1)), group)
        a.split_size = a.embed_dim = h * head_dim
        a.num_heads = h
        m.c_fc = _cols(_as_linear(m.c_fc), slice(rank * mid, (rank + 1) * mid))
        m.c_proj = RowParallel(_rows(_as_linear(m.c_proj), slice(rank * mid, (rank + 1) * mid)),
                               group)
    if shard_lm_head:
        _shard_head(model, world, rank, group)
    cfg.head_dim = head_dim
    cfg.num_attention_heads = h
    cfg.n_inner = mid
    cfg.tensor_parallel = {"world": world, "rank": rank}
    materialize(model, seed + rank)
    return model
