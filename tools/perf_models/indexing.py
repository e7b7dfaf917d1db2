"""Data movement by index: embedding, index_select, gather / scatter, cat and embedding backward."""
from __future__ import annotations

import re

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_int_list, promote, tensor_list


def _gather(base: str, a: Args) -> OpModel:
    by = Bytes()
    if base == "embedding":
        W, idx = a.tensor(0, "weight"), a.tensor(1, "indices")
        if len(W) != 2:
            raise Unmodelled("embedding weight rank")
        n_out = numel(idx) * W[1]
        by.read(numel(idx), a.type(1)); by.read(n_out, a.type(0)); by.write(n_out, a.type(0))
        return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = indices + gathered rows read, rows written",
                       ("only the gathered rows of the table are read",) + by.notes(),
                       {"n_out": n_out, "dtype": a.type(0)})
    # index_select(self, dim, index)
    x, idx = a.tensor(0, "self"), a.tensor(2, "index")
    d = parse_int_list(a.c(1))
    if not d or len(d) != 1:
        raise Unmodelled("index_select dim")
    nd = max(len(x), 1)
    dim = d[0] % nd
    out = list(x)
    if out:
        out[dim] = numel(idx)
    n_out = numel(out)
    by.read(numel(idx), a.type(2)); by.read(n_out, a.type(0)); by.write(n_out, a.type(0))
    return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = index + selected slices read, output written",
                   by.notes(), {"n_out": n_out, "dtype": a.type(0)})


def _cat(a: Args) -> OpModel:
    # cat(Tensor[] tensors, int dim=0) / cat.out(tensors, dim, out): 0 FLOPs; bytes = Σ inputs read + output written
    tl = tensor_list(a, 0)
    if tl is None:
        raise Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    shapes, dts = tl
    if dts is None:
        # Kineto records the list's type as 'TensorList' without element dtypes: bytes (the whole model) unknown
        raise Unmodelled("tensor-list element dtypes not recorded")
    live = [(s, dt) for s, dt in zip(shapes, dts) if s != [0]]      # legacy: 1-D empty tensors are skipped
    if not live or any(len(s) != len(live[0][0]) or not s for s, _ in live):
        raise Unmodelled("cat shapes")
    nd = len(live[0][0])
    d = parse_int_list(a.c(1))
    if d is not None:
        if len(d) != 1 or not -nd <= d[0] < nd:
            raise Unmodelled("cat dim")
        dim = d[0] % nd
        if any(s[i] != live[0][0][i] for s, _ in live for i in range(nd) if i != dim):
            raise Unmodelled("cat shapes do not match outside dim")
    n = sum(numel(s) for s, _ in live)
    dt_out = a.type(2) if a.is_tensor(2) else promote([(dt, nd) for _, dt in live], [])
    by = Bytes()
    for s, dt in live:
        by.read(numel(s), dt)
    by.write(n, dt_out)
    return OpModel("copy", 0, by.r, by.w, "0 FLOPs; bytes = Σ inputs·bpe_i + Σ numel·bpe_out",
                   ("data movement: 0 FLOPs",) + by.notes(),
                   {"tensors": len(live), "n": n, "dtypes_in": [dt for _, dt in live], "dtype_out": dt_out})


def _scatter_gather(base: str, a: Args) -> OpModel:
    by = Bytes()
    if base == "gather":
        # gather(self, dim, index, sparse_grad): 0 FLOPs; bytes = index + gathered elements read, out (= index shape) written
        a.tensor(0, "self")
        idx = a.tensor(2, "index")
        n = numel(idx)
        by.read(n, a.type(2)); by.read(n, a.type(0)); by.write(n, a.type(0))
        return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = index + gathered elements read, output written",
                       ("only the gathered elements of self are read",) + by.notes(), {"n_out": n, "dtype": a.type(0)})
    # scatter_add(self, dim, index, src) / scatter(self, dim, index, src|value[, reduce]):
    # FLOPs = numel(index) for add/reduce, 0 for plain scatter; bytes = self read + index + src (index-shaped) read, self written
    x, idx = a.tensor(0, "self"), a.tensor(2, "index")
    n_idx = numel(idx)
    reduce = base.startswith("scatter_add") or a.n > 4
    if a.n > 4 and not a.c(4).strip():
        raise Unmodelled("scatter reduce argument not recorded")
    by.read(numel(x), a.type(0))
    by.read(n_idx, a.type(2))
    if a.is_tensor(3):
        if numel(a.shape(3)) < n_idx:
            raise Unmodelled("scatter src smaller than index")
        by.read(n_idx, a.type(3))
    by.write(numel(x), a.type(0))
    return OpModel("scatter", n_idx if reduce else 0, by.r, by.w,
                   f"{'numel(index)' if reduce else '0'} FLOPs; bytes = self + index + src (index-shaped) read, self written",
                   (("in-place: self read and written",) if base.endswith("_") else ("output = copy of self, scattered into",))
                   + by.notes(), {"n_index": n_idx, "n_self": numel(x), "dtype": a.type(0)})


def _embedding_bwd(a: Args) -> OpModel:
    # embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    gy, idx = a.tensor(0, "grad_output"), a.tensor(1, "indices")
    nw = a.c(2).strip()
    if not re.fullmatch(r"\d+", nw or "x"):
        raise Unmodelled("num_weights not recorded")
    pad = parse_int_list(a.c(3))
    scale = parse_bool(a.c(4))
    if pad is None or len(pad) != 1 or scale is None:
        raise Unmodelled("padding_idx / scale_grad_by_freq not recorded")
    if pad[0] >= 0:
        raise Unmodelled("padding_idx set: the rows skipped depend on the index values")
    n_idx = numel(idx)
    if not gy or numel(gy) != n_idx * gy[-1]:
        raise Unmodelled("grad_output does not match indices")
    D, V = gy[-1], int(nw)
    # FLOPs = n_idx·D adds (each dY row accumulated into its weight row) (+ n_idx·D scale by 1/freq);
    # bytes = dY + indices read, the full V×D weight gradient written
    flops = n_idx * D * (2 if scale else 1)
    by = Bytes()
    by.read(n_idx * D, a.type(0)); by.read(n_idx, a.type(1)); by.write(V * D, a.type(0))
    return OpModel("embedding_bwd", flops, by.r, by.w,
                   f"{'2' if scale else ''}{'·' if scale else ''}n_idx·D FLOPs; bytes = dY + indices read, V·D weight gradient written",
                   ("index sort / de-duplication work not counted",) + (("scale_grad_by_freq: 1 multiply per element",) if scale else ())
                   + by.notes(), {"n_idx": n_idx, "D": D, "num_weights": V, "dtype": a.type(0)})


# aten base name -> its model, for models.py's registry
OPS = {**{b: _gather for b in ("embedding", "index_select")}, "embedding_dense_backward": lambda base, a: _embedding_bwd(a),
       **{b: lambda base, a: _cat(a) for b in ("cat", "_cat")},
       **{b: _scatter_gather for b in ("gather", "scatter", "scatter_", "scatter_add", "scatter_add_")}}
