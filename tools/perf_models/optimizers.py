"""Optimizer steps: the _foreach_* list ops and the fused Adam / AdamW / SGD kernels' ops."""
from __future__ import annotations

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_float, tensor_list


_FOREACH_FPE = {"add": 1, "sub": 1, "mul": 1, "div": 1, "maximum": 1, "minimum": 1, "clamp_min": 1, "clamp_max": 1,
                "neg": 1, "sqrt": 1, "rsqrt": 1, "exp": 1, "log": 1, "abs": 1, "reciprocal": 1, "sign": 1,
                "sigmoid": 1, "pow": 1, "addcmul": 3, "addcdiv": 3, "lerp": 3, "norm": 2, "copy": 0, "zero": 0}


def foreach(base: str, a: Args) -> OpModel:
    op = base[len("_foreach_"):]
    inplace = op.endswith("_")
    op = op.rstrip("_")
    if op not in _FOREACH_FPE:
        raise Unmodelled("foreach op")
    lists = [(i, tl) for i in range(a.n) if (tl := tensor_list(a, i)) is not None]
    if not lists or lists[0][0] != 0:
        raise Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    shapes0, dts0 = lists[0][1]
    numels = [numel(s) for s in shapes0]
    n = sum(numels)
    by = Bytes()

    def rw(kind, shapes, dts):
        for j, s in enumerate(shapes):
            dt = dts[j] if dts else "TensorList"
            (by.read if kind == "r" else by.write)(numel(s), dt)

    for k, (i, (shapes, dts)) in enumerate(lists):
        if op == "zero" or (op == "copy" and k == 0):
            continue
        rw("r", shapes, dts)
    if op == "norm":
        for _ in shapes0:
            by.write(1, (dts0 or ["float"])[0] if dts0 else "TensorList")
    else:
        rw("w", shapes0, dts0)
    fpe = _FOREACH_FPE[op]
    return OpModel("foreach", fpe * n, by.r, by.w,
                   f"{fpe}·Σnumel FLOPs over {len(numels)} tensors; bytes = Σ list tensors read + results written",
                   (("in-place",) if inplace else ()) + by.notes(), {"tensors": len(numels), "numel": n})


def _fused_optimizer(base: str, a: Args) -> OpModel:
    lists = [(i, tl) for i in range(a.n) if (tl := tensor_list(a, i)) is not None]
    if not lists or lists[0][0] != 0:
        raise Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    params, dts = lists[0][1]
    n = sum(numel(s) for s in params)
    by = Bytes()
    notes = []
    if base in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"):
        # (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2, weight_decay, ...)
        wd = parse_float(a.c(9), None)
        fpe = 13 + ((1 if "adamw" in base else 2) if wd else 0)
        written = [0, 2, 3]
        amsgrad_list = [tl for i, tl in lists if i == 4 and tl[0]]
        if amsgrad_list:
            written.append(4)
            fpe += 1
        for i, (shapes, dtl) in lists:
            if i == 5:   # state_steps: one element each
                for j, _ in enumerate(shapes):
                    by.read(1, dtl[j] if dtl else "TensorList"); by.write(1, dtl[j] if dtl else "TensorList")
                continue
            for j, s in enumerate(shapes):
                dt = dtl[j] if dtl else "TensorList"
                by.read(numel(s), dt)
                if i in written:
                    by.write(numel(s), dt)
        notes.append(f"≈{fpe} FLOPs/element (moment updates, bias correction, sqrt, divide, step"
                     f"{', weight decay' if wd else ''})")
        model = "fused_adam"
    else:  # _fused_sgd_(params, grads, momentum_buffer_list, weight_decay, momentum, lr, ...)
        wd, mom = parse_float(a.c(3), None), parse_float(a.c(4), None)
        fpe = 2 + (2 if wd else 0) + (3 if mom else 0)
        for i, (shapes, dtl) in lists:
            for j, s in enumerate(shapes):
                dt = dtl[j] if dtl else "TensorList"
                by.read(numel(s), dt)
                if i in (0, 2):
                    by.write(numel(s), dt)
        model = "fused_sgd"
    return OpModel(model, fpe * n, by.r, by.w,
                   f"{fpe}·Σnumel(params); bytes = Σ state lists read, params and optimizer state written",
                   tuple(notes) + by.notes(), {"tensors": len(params), "numel": n})


# aten base name -> its model, for models.py's registry
OPS = {b: _fused_optimizer for b in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw", "_fused_sgd_", "_fused_sgd")}

