"""Pooling: max / average / adaptive, 2-D and 3-D, forward and backward."""
from __future__ import annotations

import math

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_int_list


def _pool_ints(s: str, sp: int, what: str, empty_ok: bool = False) -> list[int] | None:
    v = parse_int_list(s)
    if v is None:
        raise Unmodelled(f"pool {what} not recorded")
    if not v:
        if empty_ok:
            return None
        raise Unmodelled(f"pool {what} empty")
    if len(v) == 1:
        v = v * sp
    if len(v) != sp:
        raise Unmodelled(f"pool {what} length")
    return v


def _pool_out(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch pooling_output_shape (ceil mode: the last window must start inside the input or left padding)."""
    o = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def _window_taps(n: int, o_n: int, k: int, s: int, p: int, d: int) -> int:
    """Σ over outputs of the window positions that fall inside the input (padding taps are skipped)."""
    return sum(1 for o in range(o_n) for j in range(k) if 0 <= o * s - p + j * d < n)


def _adaptive_taps(n: int, o_n: int) -> int:
    """Σ over outputs of the adaptive window length: [⌊o·n/o_n⌋, ⌈(o+1)·n/o_n⌉)."""
    return sum(-(-((o + 1) * n) // o_n) - (o * n) // o_n for o in range(o_n))


_POOL_SP = {"max_pool2d": 2, "max_pool2d_with_indices": 2, "max_pool3d_with_indices": 3,
            "max_pool2d_with_indices_backward": 2, "max_pool3d_with_indices_backward": 3,
            "avg_pool2d": 2, "avg_pool3d": 3, "avg_pool2d_backward": 2, "avg_pool3d_backward": 3,
            "adaptive_avg_pool2d": 2, "_adaptive_avg_pool2d": 2, "adaptive_avg_pool3d": 3, "_adaptive_avg_pool3d": 3,
            "_adaptive_avg_pool2d_backward": 2, "_adaptive_avg_pool3d_backward": 3,
            "adaptive_max_pool2d": 2, "adaptive_max_pool3d": 3,
            "adaptive_max_pool2d_backward": 2, "adaptive_max_pool3d_backward": 3}


def _pool(base: str, a: Args) -> OpModel:
    sp = _POOL_SP[base]
    bwd = base.endswith("_backward")
    xi = 1 if bwd else 0
    x = a.tensor(xi, "self")
    if len(x) not in (sp + 1, sp + 2):
        raise Unmodelled("pool input rank")
    planes, ins = numel(x[:-sp]), x[-sp:]
    adaptive = "adaptive" in base
    is_max = "max" in base
    notes = []
    if adaptive:
        if bwd:
            outs = a.tensor(0, "grad_output")[-sp:]
        else:
            outs = _pool_ints(a.c(1), sp, "output_size")
        if len(outs) != sp or any(o <= 0 for o in outs):
            raise Unmodelled("adaptive pool output size")
        taps = [_adaptive_taps(n, o) for n, o in zip(ins, outs)]
        params = {"output_size": outs}
    else:
        # max: (self, kernel_size, stride, padding, dilation, ceil_mode) — backward: (grad_output, self, ...same)
        # avg: (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        o = xi + 1
        ks = _pool_ints(a.c(o), sp, "kernel_size")
        st = _pool_ints(a.c(o + 1), sp, "stride", empty_ok=True) or ks
        pd = _pool_ints(a.c(o + 2), sp, "padding")
        dl = _pool_ints(a.c(o + 3), sp, "dilation") if is_max else [1] * sp
        ceil = parse_bool(a.c(o + 4 if is_max else o + 3))
        if ceil is None:
            raise Unmodelled("pool ceil_mode not recorded")
        outs = [_pool_out(n, k, s, p, d, ceil) for n, k, s, p, d in zip(ins, ks, st, pd, dl)]
        if any(v <= 0 for v in outs):
            raise Unmodelled("non-positive pool output size")
        taps = [_window_taps(n, on, k, s, p, d) for n, on, k, s, p, d in zip(ins, outs, ks, st, pd, dl)]
        params = {"kernel_size": ks, "stride": st, "padding": pd, "dilation": dl, "ceil_mode": ceil, "output": outs}
    n_in, n_out = planes * numel(ins), planes * numel(outs)
    visited = planes * math.prod(taps)
    by = Bytes()
    dt = a.type(xi)
    if bwd:
        dy = a.tensor(0, "grad_output")
        if numel(dy) != n_out:
            raise Unmodelled("grad_output does not match the pooled output shape")
        by.read(n_out, a.type(0))
        if is_max:
            ii = 2 if adaptive else 7
            by.read(n_out, a.type(ii) if a.is_tensor(ii) else "long int")
            # max backward: every dY element is added once at its argmax (self is read for its shape only)
            flops, formula = n_out, "n_out FLOPs (dY added at the argmax); bytes = dY + int64 indices read, dX written"
        else:
            # avg backward: dY/divisor spread over each window (same taps as forward)
            flops, formula = visited + n_out, ("Σ window taps + n_out FLOPs (divide, spread over the window); "
                                               "bytes = dY read, dX written")
        by.write(n_in, dt)
        notes.append("self is read for its shape only")
    else:
        by.read(n_in, dt)
        by.write(n_out, dt)
        if is_max:
            # max: one compare per in-bounds window tap; indices written (int64) except by max_pool2d
            flops = visited
            formula = "Σ in-bounds window taps FLOPs (compare); bytes = x read, y (+ int64 indices) written"
            if base != "max_pool2d":
                by.write(n_out, "long int")
                notes.append("int64 indices written")
        else:
            # avg: one add per in-bounds window tap + one divide per output
            flops = visited + n_out
            formula = "Σ in-bounds window taps (add) + n_out (divide) FLOPs; bytes = x read, y written"
    notes.append(f"{visited} in-bounds window taps over {n_out} outputs (padding taps skipped)")
    return OpModel("pool_bwd" if bwd else "pool", flops, by.r, by.w, formula, tuple(notes) + by.notes(),
                   {"input": x, "n_in": n_in, "n_out": n_out, "taps": visited, "dtype": dt, **params})


# aten base name -> its model, for models.py's registry
OPS = {b: _pool for b in _POOL_SP}
