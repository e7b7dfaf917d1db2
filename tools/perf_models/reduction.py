"""Reductions and scans (sum, mean, max, norm, cumsum, ...), softmax and MSE loss."""
from __future__ import annotations

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_int_list, broadcast, category, promote
from .dtypes import dtype_from_concrete
from .elementwise import elementwise


# name → (dim index, keepdim index, dtype index, flops/elem, number of outputs, output dtype rule)
_REDUCE = {
    "sum": (1, 2, 3, 1, 1, "sum"), "nansum": (1, 2, 3, 1, 1, "sum"), "mean": (1, 2, 3, 1, 1, "same"),
    "nanmean": (1, 2, 3, 1, 1, "same"), "prod": (1, 2, 3, 1, 1, "sum"),
    "amax": (1, 2, None, 1, 1, "same"), "amin": (1, 2, None, 1, 1, "same"),
    "max": (1, 2, None, 1, 2, "values_indices"), "min": (1, 2, None, 1, 2, "values_indices"),
    "argmax": (1, 2, None, 1, 1, "long"), "argmin": (1, 2, None, 1, 1, "long"),
    "any": (1, 2, None, 1, 1, "bool"), "all": (1, 2, None, 1, 1, "bool"),
    "logsumexp": (1, 2, None, 3, 1, "same"),
    "norm": (2, 3, 4, 2, 1, "same"), "linalg_vector_norm": (2, 3, 4, 2, 1, "same"),
    "std": (1, 3, None, 3, 1, "same"), "var": (1, 3, None, 3, 1, "same"),
    "std_mean": (1, 3, None, 3, 2, "same"), "var_mean": (1, 3, None, 3, 2, "same"),
    "cumsum": (1, None, 2, 1, 1, "scan"), "cumprod": (1, None, 2, 1, 1, "scan"),
}


def _reduce(base: str, a: Args) -> OpModel:
    di, ki, ti, fpe, n_outs, rule = _REDUCE[base]
    x = a.tensor(0, "self")
    if base in ("max", "min") and a.is_tensor(1):
        return elementwise("maximum" if base == "max" else "minimum", False, a)
    n_in = numel(x)
    notes = []
    if rule == "scan":
        dim = parse_int_list(a.c(1))
        if not dim or len(dim) != 1:
            raise Unmodelled("scan dim")
        out_shape = list(x)
    else:
        full = a.n <= di or (a.type(di) in ("", "Scalar") and base in ("sum", "mean", "prod", "nansum") and a.n == 2)
        if base in ("norm",) and a.n == 2:
            full = True
        dims = None if full else parse_int_list(a.c(di))
        if full and base in ("max", "min"):
            n_outs = 1
        if full or dims is None or dims == []:
            if not full and dims is None and base in ("max", "min"):
                raise Unmodelled("max/min dim not recorded")
            dims = list(range(len(x)))
            notes.append("full reduction (no dim)")
        keep = bool(parse_bool(a.c(ki), False)) if (ki is not None and not full) else False
        nd = max(len(x), 1)
        red = set()
        for d in dims:
            if not -nd <= d < nd:
                raise Unmodelled("dim out of range")
            red.add(d % nd)
        out_shape = [1 if i in red else s for i, s in enumerate(x)] if keep else \
            [s for i, s in enumerate(x) if i not in red]
        notes.append(f"reduced dims {sorted(red)}, keepdim={keep}")
    n_out = numel(out_shape)
    dt_in = a.type(0)
    dt_out = dtype_from_concrete(a.c(ti)) if ti is not None and a.n > ti else None
    if dt_out is None:
        if rule in ("sum", "scan") and category(dt_in) < 2:
            dt_out = "long int"
        elif rule == "long":
            dt_out = "long int"
        elif rule == "bool":
            dt_out = "bool"
        else:
            dt_out = dt_in
    by = Bytes()
    by.read(n_in, dt_in)
    by.write(n_out, dt_out)
    if rule == "values_indices" and n_outs == 2:
        by.write(n_out, "long int")
        notes.append("values and int64 indices written")
    elif n_outs == 2:
        by.write(n_out, dt_out)
    return OpModel("reduce", fpe * n_in, by.r, by.w,
                   f"{fpe}·n_in FLOPs; bytes = n_in·bpe_in + n_out·bpe_out (n_out from dim/keepdim)",
                   tuple(notes) + by.notes(),
                   {"n_in": n_in, "n_out": n_out, "shape_out": out_shape, "dtype_in": dt_in, "dtype_out": dt_out})


def _softmax(base: str, a: Args) -> OpModel:
    if base.endswith("_backward_data"):
        # (grad_output, output, dim, input_dtype)
        gy, y = a.tensor(0, "grad_output"), a.tensor(1, "output")
        n = numel(gy)
        dt_out = dtype_from_concrete(a.c(3)) or a.type(0)
        by = Bytes()
        by.read(n, a.type(0)); by.read(numel(y), a.type(1)); by.write(n, dt_out)
        return OpModel("softmax_bwd", 4 * n, by.r, by.w,
                       "4·n FLOPs (dY·Y, row sum, sub, mul); bytes = dY + Y read, dX written", by.notes(),
                       {"n": n, "dtype_out": dt_out})
    x = a.tensor(0, "self")
    n = numel(x)
    dt_out = None
    if base in ("_softmax", "_log_softmax"):
        if parse_bool(a.c(2), False):
            dt_out = "float"
    else:
        dt_out = dtype_from_concrete(a.c(2))
    dt_out = dt_out or a.type(0)
    by = Bytes()
    by.read(n, a.type(0)); by.write(n, dt_out)
    return OpModel("softmax", 5 * n, by.r, by.w,
                   "5·n FLOPs (max, sub, exp, sum, div/log-sub per element); bytes = n·bpe_in + n·bpe_out",
                   by.notes(), {"n": n, "dtype_in": a.type(0), "dtype_out": dt_out})


def _mse_loss(base: str, a: Args) -> OpModel:
    if base == "mse_loss_backward":
        # mse_loss_backward(grad_output, self, target, reduction[, grad_input out]): dX = norm·(x − t)·dy
        gy, x, t = a.tensor(0, "grad_output"), a.tensor(1, "self"), a.tensor(2, "target")
        out = broadcast([gy, x, t])
        n = numel(out)
        dt = a.type(4) if a.is_tensor(4) and a.shape(4) == out else promote([(a.type(1), len(x)), (a.type(2), len(t))], [])
        by = Bytes()
        by.read(numel(gy), a.type(0)); by.read(numel(x), a.type(1)); by.read(numel(t), a.type(2))
        by.write(n, dt)
        # 3·n FLOPs (sub, ·norm, ·dy); bytes = dy + x + target read, dX written
        return OpModel("elementwise_ternary", 3 * n, by.r, by.w,
                       "3·n FLOPs (sub, ·norm, ·dY); bytes = dY + self + target read, dX written", by.notes(),
                       {"shape_out": out, "dtype_out": dt})
    # mse_loss(self, target, reduction): 2·n FLOPs (sub, square) + n (sum) unless reduction='none';
    # bytes = self + target read, n (none) or 1 (mean/sum) element written
    x, t = a.tensor(0, "self"), a.tensor(1, "target")
    red = a.c(2).strip()
    if red not in ("0", "1", "2"):
        raise Unmodelled("mse_loss reduction not recorded")
    out = broadcast([x, t])
    n = numel(out)
    dt = promote([(a.type(0), len(x)), (a.type(1), len(t))], [])
    by = Bytes()
    by.read(numel(x), a.type(0)); by.read(numel(t), a.type(1))
    by.write(n if red == "0" else 1, dt)
    fl = 2 * n + (0 if red == "0" else n)
    return OpModel("elementwise_binary" if red == "0" else "reduce", fl, by.r, by.w,
                   f"{'2' if red == '0' else '3'}·n FLOPs (sub, square{'' if red == '0' else ', sum'}); "
                   f"bytes = self + target read, {'n' if red == '0' else '1'} element(s) written",
                   (f"reduction = {({'0': 'none', '1': 'mean', '2': 'sum'})[red]}",) + by.notes(),
                   {"n": n, "reduction": red, "dtype_out": dt})


# aten base name -> its model, for models.py's registry
OPS = {**{b: _reduce for b in _REDUCE},
       **{b: _softmax for b in ("softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
                                "_log_softmax_backward_data")},
       **{b: _mse_loss for b in ("mse_loss", "mse_loss_backward")}}
