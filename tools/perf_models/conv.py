"""Convolution, forward (plain, transposed, grouped) and backward."""
from __future__ import annotations

import re

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_int_list


def _conv_out(x: list[int], w: list[int], stride, padding, dilation, transposed, out_pad, groups) -> list[int]:
    sp = len(x) - 2
    if sp < 1 or len(w) != len(x):
        raise Unmodelled("conv ranks")

    def rep(v, name):
        if v is None:
            raise Unmodelled(f"conv {name} not recorded")
        if len(v) == 1:
            return v * sp
        if len(v) != sp:
            raise Unmodelled(f"conv {name} length")
        return v

    stride, dilation = rep(stride, "stride"), rep(dilation, "dilation")
    out_pad = rep(out_pad, "output_padding") if transposed else [0] * sp
    if padding == "same":
        return [x[0], w[0]] + list(x[2:])
    padding = [0] * sp if padding == "valid" else rep(padding, "padding")
    ks = w[2:]
    if transposed:
        sp_out = [(x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ks[i] - 1) + out_pad[i] + 1
                  for i in range(sp)]
        c_out = w[1] * groups
    else:
        sp_out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(sp)]
        c_out = w[0]
    return [x[0], c_out] + sp_out


def _pad_arg(s: str):
    s = (s or "").strip().strip("'\"")
    if s in ("same", "valid"):
        return s
    return parse_int_list(s)


def _conv_fwd(name: str, a: Args) -> OpModel:
    # (x, w, bias?, stride, padding, dilation, transposed, output_padding, groups) for convolution/_convolution;
    # conv{1,2,3}d: (x, w, bias, stride, padding, dilation, groups);
    # cudnn_convolution: (x, w, padding, stride, dilation, groups, ...);
    # miopen_convolution: (x, w, bias, padding, stride, dilation, groups, ...)
    x, w = a.tensor(0, "input"), a.tensor(1, "weight")
    if name in ("convolution", "_convolution"):
        has_b, st, pd, dl = True, a.c(3), a.c(4), a.c(5)
        tr = bool(parse_bool(a.c(6), False))
        op, groups = a.c(7), a.c(8)
    elif name in ("conv1d", "conv2d", "conv3d"):
        has_b, st, pd, dl, tr, op, groups = True, a.c(3), a.c(4), a.c(5), False, "", a.c(6)
    elif name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        # (input, weight, bias, stride, padding, output_padding, groups, dilation)
        has_b, st, pd, op, groups, dl, tr = True, a.c(3), a.c(4), a.c(5), a.c(6), a.c(7), True
    elif name == "cudnn_convolution":
        has_b, pd, st, dl, groups, tr, op = False, a.c(2), a.c(3), a.c(4), a.c(5), False, ""
    elif name == "cudnn_convolution_transpose":
        # (self, weight, padding, output_padding, stride, dilation, groups, ...)
        has_b, pd, op, st, dl, groups, tr = False, a.c(2), a.c(3), a.c(4), a.c(5), a.c(6), True
    else:  # miopen_convolution
        has_b, pd, st, dl, groups, tr, op = True, a.c(3), a.c(4), a.c(5), a.c(6), False, ""
    g = int(groups) if re.fullmatch(r"\s*\d+\s*", groups or "") else None
    if g is None:
        raise Unmodelled("conv groups not recorded")
    dil = parse_int_list(dl) if dl.strip() else [1]
    out = _conv_out(x, w, parse_int_list(st), _pad_arg(pd), dil, tr, parse_int_list(op) if tr else None, g)
    if any(d <= 0 for d in out):
        raise Unmodelled("non-positive conv output size")
    bias = has_b and a.is_tensor(2) and len(a.shape(2)) == 1
    macs = (numel(x) if tr else numel(out)) * numel(w[1:])
    flops = 2 * macs + (numel(out) if bias else 0)
    by = Bytes()
    by.read(numel(x), a.type(0))
    by.read(numel(w), a.type(1))
    if bias:
        by.read(numel(a.shape(2)), a.type(2))
    by.write(numel(out), a.type(0))
    notes = ["bias detected from the recorded bias tensor" if bias else "no bias tensor recorded"]
    return OpModel("conv_fwd", flops, by.r, by.w,
                   ("2·prod(x)·prod(w[1:])" if tr else "2·prod(out)·prod(w[1:])") + (" + prod(out) (bias)" if bias else "")
                   + "; bytes = x + w (+ bias) read, out written",
                   tuple(notes) + by.notes(),
                   {"input": x, "weight": w, "output": out, "bias": bias, "transposed": tr, "groups": g})


def _conv_bwd(a: Args) -> OpModel:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #                      output_padding, groups, output_mask)
    dy, x, w = a.tensor(0, "grad_output"), a.tensor(1, "input"), a.tensor(2, "weight")
    tr = bool(parse_bool(a.c(7), False))
    mask = [parse_bool(t) for t in re.findall(r"True|False|1|0", a.c(10))] or [True, True, True]
    if len(mask) != 3 or None in mask:
        raise Unmodelled("output_mask")
    macs = (numel(x) if tr else numel(dy)) * numel(w[1:])
    flops = 0
    by = Bytes()
    parts = []
    if mask[0]:
        flops += 2 * macs
        by.read(numel(dy), a.type(0)); by.read(numel(w), a.type(2)); by.write(numel(x), a.type(1))
        parts.append("dX")
    if mask[1]:
        flops += 2 * macs
        by.read(numel(dy), a.type(0)); by.read(numel(x), a.type(1)); by.write(numel(w), a.type(2))
        parts.append("dW")
    if mask[2]:
        flops += numel(dy)
        by.read(numel(dy), a.type(0)); by.write(dy[1], a.type(0))
        parts.append("dBias")
    return OpModel("conv_bwd", flops, by.r, by.w,
                   "2·MACs per computed dX/dW + prod(dY) for dBias; each gradient reads dY once",
                   (f"gradients computed (output_mask): {', '.join(parts) or 'none'}",) + by.notes(),
                   {"grad_output": dy, "input": x, "weight": w, "output_mask": mask, "transposed": tr})


# aten base name -> its model, for models.py's registry
OPS = {**{b: _conv_fwd for b in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
                                  "miopen_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                                  "cudnn_convolution_transpose")},
       "convolution_backward": lambda base, a: _conv_bwd(a)}
