"""Normalisation: layer / RMS / batch / group norm forward, batch and layer norm backward."""
from __future__ import annotations

import re

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_int_list
from .dtypes import accumulate_dtype


def _norm(base: str, a: Args) -> OpModel:
    x = a.tensor(0, "input")
    N = numel(x)
    dt = a.type(0)
    acc = accumulate_dtype(dt)
    by = Bytes()
    notes = []
    if base in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
        ns = parse_int_list(a.c(1))
        if ns is None:
            wi = 2
            if not a.is_tensor(wi):
                raise Unmodelled("normalized_shape not recorded")
            ns = a.shape(wi)
        C = numel(ns)
        if C == 0 or N % C:
            raise Unmodelled("normalized_shape")
        rows = N // C
        w = a.is_tensor(2)
        b = base in ("layer_norm", "native_layer_norm") and a.is_tensor(3)
        by.read(N, dt)
        if w:
            by.read(C, a.type(2))
        if b:
            by.read(C, a.type(3))
        by.write(N, dt)
        if base.startswith("rms") or base == "_fused_rms_norm":
            fpe = 3 + int(w)
            formula = f"{fpe}·N (square+accumulate, scale by rstd{', γ' if w else ''})"
            if base == "_fused_rms_norm":
                by.write(rows, acc)
                notes.append("rstd per row written in the accumulation dtype")
            model = "rms_norm"
        else:
            fpe = 6 + int(w) + int(b)
            formula = f"{fpe}·N (mean 1, variance 3, normalise 2{', γ 1' if w else ''}{', β 1' if b else ''})"
            by.write(2 * rows, acc)
            notes.append(f"mean and rstd per row ({rows} rows) written in {acc}")
            model = "layer_norm"
        return OpModel(model, fpe * N, by.r, by.w, formula + "; bytes = x + γ/β read, y (+ row stats) written",
                       tuple(notes) + by.notes(), {"N": N, "C": C, "rows": rows, "affine": w, "bias": b, "dtype": dt})
    if base == "native_group_norm" or base == "group_norm":
        if base == "group_norm":
            # (input, num_groups, weight, bias, eps, cudnn_enabled)
            G = int(a.c(1)) if re.fullmatch(r"\d+", a.c(1).strip() or "x") else None
            wi, bi = 2, 3
        else:
            # (input, weight, bias, N, C, HxW, group, eps)
            G = int(a.c(6)) if re.fullmatch(r"\d+", a.c(6).strip() or "x") else None
            wi, bi = 1, 2
        if G is None or len(x) < 2:
            raise Unmodelled("group_norm groups")
        C = x[1]
        w, b = a.is_tensor(wi), a.is_tensor(bi)
        by.read(N, dt)
        if w:
            by.read(C, a.type(wi))
        if b:
            by.read(C, a.type(bi))
        by.write(N, dt)
        by.write(2 * x[0] * G, acc)
        fpe = 6 + int(w) + int(b)
        return OpModel("group_norm", fpe * N, by.r, by.w,
                       f"{fpe}·N (mean 1, variance 3, normalise 2, affine); bytes = x + γ/β read, y + mean/rstd (N·G) written",
                       by.notes(), {"N": N, "C": C, "groups": G, "dtype": dt})
    # batch norm family: (input, weight, bias, running_mean, running_var, training, momentum, eps[, cudnn])
    if len(x) < 2:
        raise Unmodelled("batch_norm input rank")
    C = x[1]
    training = False if base == "_native_batch_norm_legit_no_training" else parse_bool(a.c(5))
    if base == "_native_batch_norm_legit" and a.n == 6:   # no-stats overload (input, w, b, training, momentum, eps)
        training = parse_bool(a.c(3))
    if training is None:
        raise Unmodelled("batch_norm training flag")
    w, b = a.is_tensor(1), a.is_tensor(2)
    rm = a.is_tensor(3) and a.n > 6
    by.read(N, dt)
    if w:
        by.read(C, a.type(1))
    if b:
        by.read(C, a.type(2))
    if training:
        fpe = 6 + int(w) + int(b)
        by.write(2 * C, acc)
        notes.append("training: batch statistics (save_mean/save_invstd) written")
        if rm:
            by.read(C, a.type(3)); by.read(C, a.type(4)); by.write(C, a.type(3)); by.write(C, a.type(4))
            notes.append("running mean/var read and updated")
    else:
        fpe = 2 + int(w) + int(b)
        if rm:
            by.read(C, a.type(3)); by.read(C, a.type(4))
        notes.append("inference: uses running statistics")
    by.write(N, dt)
    return OpModel("batch_norm", fpe * N, by.r, by.w,
                   f"{fpe}·N ({'mean 1, variance 3, ' if training else ''}normalise 2, affine); bytes = x + γ/β/stats read, y (+stats) written",
                   tuple(notes) + by.notes(), {"N": N, "C": C, "training": training, "dtype": dt})


def _mask3(s: str) -> list[bool]:
    """output_mask '[True, True, False]' → 3 bools; not recorded / unparsable → unmodelled (never a default)."""
    mask = [parse_bool(t) for t in re.findall(r"True|False|1|0", s or "")]
    if len(mask) != 3 or None in mask:
        raise Unmodelled("output_mask not recorded")
    return mask


def _batch_norm_bwd(base: str, a: Args) -> OpModel:
    if base in ("native_batch_norm_backward", "batch_norm_backward"):
        # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
        #                            train, eps, output_mask); batch_norm_backward(..., update, eps, output_mask, reserve)
        dyi, xi = 0, 1
        train = parse_bool(a.c(7))
        if train is None:
            raise Unmodelled("batch_norm_backward training flag not recorded")
        mask = _mask3(a.c(9))
        ri = 10 if base == "batch_norm_backward" else None
    else:
        # cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean, save_var,
        #                           epsilon, reserveSpace); miopen_batch_norm_backward(... epsilon): training-mode
        # gradients from the saved batch statistics, all three gradients computed
        dyi, xi, train, mask = 1, 0, True, [True, True, True]
        ri = 8 if base == "cudnn_batch_norm_backward" else None
    dy, x = a.tensor(dyi, "grad_output"), a.tensor(xi, "input")
    if len(x) < 2 or dy != x:
        raise Unmodelled("batch_norm_backward shapes")
    N, C = numel(x), x[1]
    dX, dW, dB = mask
    w = a.is_tensor(2)
    if (dW or dB) and not w:
        raise Unmodelled("weight/bias gradient requested without a recorded weight")
    # FLOPs/element: x−μ 1 (dX in training, or dW); Σdy 1 (dB, or dX in training); Σdy·(x−μ) 2 (same as x−μ);
    # dX = (dy − mean(dy) − (x−μ)·k)·(invstd·γ) 4 in training, dy·(invstd·γ) 1 in inference; per-channel O(C) not counted
    need_xmu = dW or (train and dX)
    need_sdy = dB or (train and dX)
    fpe = int(need_xmu) + int(need_sdy) + 2 * int(need_xmu) + ((4 if train else 1) if dX else 0)
    by = Bytes()
    notes = []
    if dX or dW or dB:
        by.read(N, a.type(dyi))
    if need_xmu:
        by.read(N, a.type(xi))
    if dX and w:
        by.read(C, a.type(2))
    if train:
        si, ii = 5, 6
        if need_xmu:
            for i, what in ((si, "save_mean"), (ii, "save_invstd")):
                if not a.is_tensor(i) or numel(a.shape(i)) != C:
                    raise Unmodelled(f"{what} not recorded")
                by.read(C, a.type(i))
        notes.append("training: gradients through the batch statistics (saved mean / invstd read)")
    else:
        if dX or dW:
            if not a.is_tensor(4) or (dW and not a.is_tensor(3)):
                raise Unmodelled("running statistics not recorded")
            by.read(C, a.type(4))
            if dW:
                by.read(C, a.type(3))
        notes.append("inference: running statistics are constants (dX = dy·γ·invstd)")
    if ri is not None and a.is_tensor(ri):
        by.read(numel(a.shape(ri)), a.type(ri))
        notes.append(f"reserve space {a.shape(ri)} read")
    if dX:
        by.write(N, a.type(xi))
    if dW:
        by.write(C, a.type(2))
    if dB:
        by.write(C, a.type(2))
    parts = [p for p, on in (("dX", dX), ("dγ", dW), ("dβ", dB)) if on]
    notes.append(f"gradients computed (output_mask): {', '.join(parts) or 'none'}")
    return OpModel("batch_norm_bwd", fpe * N, by.r, by.w,
                   f"{fpe}·N (x−μ 1, Σdy 1, Σdy·(x−μ) 2, dX {4 if train else 1} per element, each if needed); "
                   "bytes = dy (+ x, γ, stats) read, dX (+ dγ, dβ) written",
                   tuple(notes) + by.notes(), {"N": N, "C": C, "training": train, "output_mask": mask,
                                               "dtype": a.type(xi)})


def _layer_norm_bwd(a: Args) -> OpModel:
    # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
    dy, x = a.tensor(0, "grad_out"), a.tensor(1, "input")
    mean, rstd = a.tensor(3, "mean"), a.tensor(4, "rstd")
    if dy != x:
        raise Unmodelled("layer_norm_backward shapes")
    mask = _mask3(a.c(7))
    N, rows = numel(x), numel(mean)
    if rows == 0 or N % rows or numel(rstd) != rows:
        raise Unmodelled("layer_norm_backward statistics shape")
    C = N // rows
    ns = parse_int_list(a.c(2))
    if ns is not None and numel(ns) != C:
        raise Unmodelled("normalized_shape inconsistent with mean/rstd")
    dX, dW, dB = mask
    w, b = a.is_tensor(5), a.is_tensor(6)
    if (dW and not w) or (dB and not (b or w)):
        raise Unmodelled("weight/bias gradient requested without a recorded weight/bias")
    # FLOPs/element: x̂ = (x−μ)·rstd 2 (dX or dγ); g = dy·γ 1 (dX with γ); Σg, Σg·x̂ 3 (dX);
    # dX = rstd·(g − mean(g) − x̂·mean(g·x̂)) 4; dγ = Σdy·x̂ 2; dβ = Σdy 1
    fpe = 2 * int(dX or dW) + (int(w) + 3 + 4) * int(dX) + 2 * int(dW) + int(dB)
    by = Bytes()
    if dX or dW or dB:
        by.read(N, a.type(0))
    if dX or dW:
        by.read(N, a.type(1)); by.read(rows, a.type(3)); by.read(rows, a.type(4))
    if dX and w:
        by.read(C, a.type(5))
    if dX:
        by.write(N, a.type(1))
    if dW:
        by.write(C, a.type(5))
    if dB:
        by.write(C, a.type(6) if b else a.type(5))
    parts = [p for p, on in (("dX", dX), ("dγ", dW), ("dβ", dB)) if on]
    return OpModel("layer_norm_bwd", fpe * N, by.r, by.w,
                   f"{fpe}·N (x̂ 2, γ·dy 1, row sums 3, dX 4, dγ 2, dβ 1 per element, each if computed); "
                   "bytes = dy (+ x, mean/rstd per row, γ) read, dX (+ dγ, dβ) written",
                   (f"gradients computed (output_mask): {', '.join(parts) or 'none'}",) + by.notes(),
                   {"N": N, "C": C, "rows": rows, "affine": w, "output_mask": mask, "dtype": a.type(1)})


# aten base name -> its model, for models.py's registry
OPS = {**{b: _norm for b in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "batch_norm",
                             "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
                             "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm")},
       **{b: _batch_norm_bwd for b in ("native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward",
                                       "miopen_batch_norm_backward")},
       "native_layer_norm_backward": lambda base, a: _layer_norm_bwd(a)}
