"""A query result cell as JSON, the same way wherever gpuscope returns table rows."""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from pathlib import Path
from typing import Any


def jsonable(v: Any, max_cell: int) -> Any:
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, str):
        return v if len(v) <= max_cell else v[: max_cell - 1] + "…"
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v[: max_cell * 4]).decode("utf-8", errors="replace")[:max_cell]
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time, _dt.timedelta, uuid.UUID, Path)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x, max_cell) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x, max_cell) for k, x in v.items()}
    return str(v)[:max_cell]
