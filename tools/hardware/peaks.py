"""Datasheet peaks per GPU model: loading (built-in + user config + per-call overrides), matching the
device names profiles write, and the peaks of one profiled device.

Every figure keeps its source (datasheet / whitepaper and year), the formula when it is derived, and a
note when it is missing. Matching never guesses: a name that selects no model gives None ("unknown GPU:
no peaks"), and a name that fits several models gives confidence 'ambiguous' with only the figures the
candidates agree on.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..model.errors import ProfileError

BUILTIN_PATH = Path(__file__).with_name("peaks.json")
ENV_VAR = "GPUSCOPE_PEAKS"

# Numeric figures an entry carries (each {value, source[, derived][, note]}). The first group is required
# in every built-in entry; OPTIONAL_FIELDS appear where the datasheet states them.
REQUIRED_FIELDS = (
    "sm_count", "memory_bytes", "memory_bandwidth_bytes_per_s", "boost_clock_hz",
    "tflops_fp64", "tflops_fp64_matrix", "tflops_fp32", "tflops_fp32_matrix", "tflops_tf32_matrix",
    "tflops_fp16", "tflops_bf16", "tflops_fp16_matrix", "tflops_bf16_matrix", "tflops_fp8_matrix",
    "tops_int8_matrix", "host_link_gb_per_s_per_direction", "peer_link_gb_per_s_per_direction",
)
OPTIONAL_FIELDS = (
    "tflops_fp8_e4m3_matrix", "tflops_fp8_e5m2_matrix", "tflops_fp4_matrix",
    "tflops_fp16_matrix_fp16_accumulate", "cuda_cores",
)
VALUE_FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS
# Descriptive (text) attributes of an entry.
TEXT_FIELDS = ("name", "vendor", "family", "form", "memory_type", "device_scope", "host_link", "peer_link")
LIST_FIELDS = ("compute_capability",)
COMPUTE_PREFIXES = ("tflops_", "tops_")

CONFIDENCES = ("exact", "by properties", "ambiguous")

# Memory the driver reports vs the datasheet figure: ECC carve-outs and driver reservations take up to
# ~8% (T4/A10 with ECC on); 0.88 still separates H100 80 GB (79.2 GiB reported) from H100 NVL 94 GB.
MEM_LOW, MEM_HIGH = 0.88, 1.02
AGREE_TOLERANCE = 0.005  # ambiguous candidates "agree" on a figure within 0.5 %
BANDWIDTH_TOLERANCE = 0.01
CLOCK_TOLERANCE = 0.02


# ----------------------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class PeakValue:
    """One figure with its provenance. `source` is the document (name and year) it comes from."""

    value: float | int | None
    source: str | None = None
    derived: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value}
        for k in ("source", "derived", "note"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        return d


@dataclass(frozen=True)
class PeakEntry:
    """One GPU model (per device as the runtime enumerates it, e.g. one MI250X GCD)."""

    key: str
    name: str
    vendor: str | None
    family: str | None
    values: Mapping[str, PeakValue]
    compute_capability: tuple[str, ...] = ()
    form: str | None = None
    memory_type: str | None = None
    device_scope: str | None = None
    host_link: str | None = None
    peer_link: str | None = None
    origin: str = "built-in"

    def get(self, field_name: str) -> PeakValue | None:
        return self.values.get(field_name)

    def value(self, field_name: str) -> float | int | None:
        pv = self.values.get(field_name)
        return pv.value if pv is not None else None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "name": self.name, "vendor": self.vendor, "origin": self.origin}
        for k in ("family", "form", "memory_type", "device_scope", "host_link", "peer_link"):
            d[k] = getattr(self, k)
        d["compute_capability"] = list(self.compute_capability)
        d["peaks"] = {k: v.to_dict() for k, v in self.values.items()}
        return d


@dataclass(frozen=True)
class Match:
    """Result of matching a profile's device name: the entry, how it was chosen and how sure it is.

    confidence: 'exact' (the name alone selects the model), 'by properties' (the name gives the family
    and the profile's memory size / SM count / compute capability pick the variant), 'ambiguous'
    (several models fit: `entry` then holds only the figures all `candidates` agree on).
    """

    entry: PeakEntry
    rule: str
    confidence: str
    candidates: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()


@dataclass
class DevicePeaks:
    """Peaks of one profiled device: the datasheet figures (adjusted only where stated in `notes`)
    next to what the profile itself reports; `discrepancies` lists every disagreement."""

    device_id: int
    device_name: str | None
    match: Match
    entry: PeakEntry
    profile: dict[str, Any] = field(default_factory=dict)
    discrepancies: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def confidence(self) -> str:
        return self.match.confidence

    def get(self, field_name: str) -> PeakValue | None:
        return self.entry.get(field_name)

    def value(self, field_name: str) -> float | int | None:
        return self.entry.value(field_name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "device_name": self.device_name,
            "model": self.entry.key,
            "model_name": self.entry.name,
            "match_rule": self.match.rule,
            "confidence": self.match.confidence,
            "candidates": list(self.match.candidates),
            "flags": list(self.match.flags),
            "peaks": {k: v.to_dict() for k, v in self.entry.values.items()},
            "host_link": self.entry.host_link,
            "peer_link": self.entry.peer_link,
            "device_scope": self.entry.device_scope,
            "profile": dict(self.profile),
            "discrepancies": list(self.discrepancies),
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------------------- name parsing

_VENDOR_WORDS = {"nvidia", "amd", "ati", "tesla", "geforce", "instinct", "corporation", "corp", "inc", "quadro"}
# tokens that make a different product when they follow a family name ("rtx 4060 ti" is not "rtx 4060")
_MODIFIERS = {"ti", "super", "d", "xt", "xtx", "x", "s", "a", "g", "e", "l"}
_FORM_TOKENS = {"pcie": "pcie", "sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "pg509": "sxm",
                "hgx": "sxm", "nvl": "nvl"}
_MEMTYPE_TOKENS = {"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr5", "gddr5x", "gddr6", "gddr6x", "gddr7"}
_GENERIC_NAMES = {"", "radeon graphics", "radeon", "graphics", "gpu", "device", "unknown", "amd gpu"}


@dataclass
class _Parsed:
    norm: str
    tokens: list[str]
    flags: list[str]
    mem_gib: int | None = None
    form: str | None = None
    memtype: str | None = None
    gfx: str | None = None
    notebook: bool = False
    max_q: bool = False


def normalize_name(name: str | None) -> str:
    """Lower-case, vendor words and punctuation removed: 'NVIDIA A100-PCIE-40GB' -> 'a100 pcie 40gb'."""
    s = (name or "").lower()
    s = re.sub(r"\((tm|r|c)\)|[™®]", " ", s)
    s = re.sub(r"(\d+)\s*gb\b", r"\1gb", s)
    s = re.sub(r"[^a-z0-9.]+", " ", s)
    toks = [t for t in s.split() if t not in _VENDOR_WORDS]
    return " ".join(toks)


def _parse(name: str | None) -> _Parsed:
    norm = normalize_name(name)
    toks = norm.split()
    flags: list[str] = []
    if "vf" in toks:
        flags.append("virtual function")
        toks = [t for t in toks if t != "vf"]
    if "mig" in toks:  # 'A100-SXM4-40GB MIG 3g.20gb': a MIG instance, fewer SMs and less memory
        flags.append("MIG instance")
        toks = toks[: toks.index("mig")]
    for t in ("cpx", "dpx", "qpx", "tpx"):
        if t in toks:
            flags.append(f"{t.upper()} partition")
            toks = [x for x in toks if x != t]
    p = _Parsed(norm=" ".join(toks), tokens=toks, flags=flags)
    for i, t in enumerate(toks):
        m = re.fullmatch(r"(\d+)gb", t)
        if m:
            p.mem_gib = int(m.group(1))
        if t in _FORM_TOKENS:
            p.form = _FORM_TOKENS[t]
        if t in _MEMTYPE_TOKENS:
            p.memtype = t
        if re.fullmatch(r"gfx[0-9a-f]+", t):
            p.gfx = t
        if t in ("laptop", "mobile", "notebook"):
            p.notebook = True
        if t == "max" and i + 1 < len(toks) and toks[i + 1] == "q":
            p.max_q = True
    return p


def _family_in(family: str, tokens: list[str]) -> bool:
    ft = family.split()
    n = len(ft)
    for i in range(len(tokens) - n + 1):
        if tokens[i : i + n] == ft:
            nxt = tokens[i + n] if i + n < len(tokens) else None
            if nxt is None or nxt not in _MODIFIERS:
                return True
    return False


# ----------------------------------------------------------------------------------------- the table


class PeakTable:
    """The merged peaks (built-in, user config, per-call overrides) and the matcher over them."""

    def __init__(self, entries: dict[str, PeakEntry], name_overrides: dict[str, str], origins: list[str]):
        self.entries = entries
        self.name_overrides = name_overrides  # normalised profile device name -> entry key
        self.origins = origins
        self._family_forms: dict[str, set[str]] = {}
        for e in entries.values():
            if e.family:
                self._family_forms.setdefault(e.family, set()).add(e.form or "")

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __getitem__(self, key: str) -> PeakEntry:
        return self.entries[key]

    # -- matching ------------------------------------------------------------------------------------

    def match(self, name: str | None, *, memory_bytes: int | None = None, sm_count: int | None = None,
              vendor: str | None = None, compute_capability: str | None = None) -> Match | None:
        p = _parse(name)
        props = {"memory_bytes": _pos(memory_bytes), "sm_count": _pos(sm_count),
                 # rocpd may write the full target ('gfx90a:sramecc+:xnack-'): the feature flags do not matter here
                 "compute_capability": (str(compute_capability).split(":")[0].strip().lower() or None)
                 if compute_capability else None}
        if p.gfx and not props["compute_capability"]:
            props["compute_capability"] = p.gfx
        flags = tuple(p.flags)
        partition = bool(flags)

        key = self.name_overrides.get(p.norm) or self.name_overrides.get(normalize_name(name))
        if key:
            return Match(self.entries[key], f"user override for device name {name!r}", "exact", (key,), flags)

        fams = [e for e in self.entries.values() if e.family and _family_in(e.family, p.tokens)]
        if not fams:
            return self._match_generic(name, p, props, vendor, flags)

        # name hints: memory size, form factor, memory type, notebook/Max-Q
        survivors = [e for e in fams if self._name_consistent(e, p)]
        hinted = bool(p.mem_gib or p.form or p.memtype or p.max_q)
        if not survivors:
            return None
        if len(survivors) == 1:
            e = survivors[0]
            why = self._contradiction(e, props, lenient=True)
            if why:
                return None
            families = {x.family for x in fams}
            rule = (f"name {name!r} -> {e.key}"
                    + ("" if len(fams) == 1 else
                       " (the name's " + ", ".join(_hint_words(p)) + " selects the variant)" if hinted else
                       f" (the other {'/'.join(sorted(families))} variants always name their form factor)"))
            return Match(e, rule, "exact", (e.key,), flags)

        strict = [e for e in survivors if not self._contradiction(e, props, lenient=partition)]
        used = [k for k, v in props.items() if v is not None]
        if not used:
            return self._ambiguous(survivors, f"name {name!r} fits {len(survivors)} models and the profile states no "
                                   "memory size / SM count to choose", flags)
        if not strict:
            return None
        if len(strict) == 1:
            e = strict[0]
            return Match(e, f"name {name!r} gives family {e.family}; {_props_words(props)} select {e.key}",
                         "by properties", (e.key,), flags)
        return self._ambiguous(strict, f"name {name!r} and {_props_words(props)} fit {len(strict)} models", flags)

    def _match_generic(self, name, p: _Parsed, props, vendor, flags) -> Match | None:
        """Names that carry no model ('AMD Radeon Graphics', 'gfx90a', none): properties only."""
        generic = p.norm in _GENERIC_NAMES or bool(p.gfx and len(p.tokens) == 1)
        if not generic:
            return None
        v = (vendor or "").strip().lower() or ("amd" if "amd" in (name or "").lower() or p.gfx else "")
        if not v or props["memory_bytes"] is None or props["sm_count"] is None:
            return None  # a generic name needs the vendor, the memory size and the SM/CU count
        pool = [e for e in self.entries.values() if (e.vendor or "").lower() == v]
        fit = [e for e in pool if not self._contradiction(e, props, lenient=False)]
        if not fit:
            return None
        label = f"generic name {name!r}" if name else "no device name"
        if len(fit) == 1:
            return Match(fit[0], f"{label}; {_props_words(props)} select {fit[0].key}", "by properties", (fit[0].key,), flags)
        return self._ambiguous(fit, f"{label}; {_props_words(props)} fit {len(fit)} models", flags)

    def _name_consistent(self, e: PeakEntry, p: _Parsed) -> bool:
        forms = self._family_forms.get(e.family or "", set())
        if p.notebook and e.form != "notebook":
            return False
        if e.key.endswith("max-q") or (e.form == "notebook" and "max-q" in e.key):
            if not p.max_q:
                return False
        elif p.max_q:
            return False
        if p.form:
            if e.form and e.form != p.form:
                return False
        elif "sxm" in forms and e.form in ("pcie", "nvl"):
            return False  # next to an SXM variant, the PCIe / NVL variants always say so in their name
        if p.memtype and e.memory_type and e.memory_type.lower() != p.memtype:
            return False
        mem = e.value("memory_bytes")
        if p.mem_gib and mem:
            if abs(mem / 2**30 - p.mem_gib) > 0.05 * p.mem_gib:
                return False
        return True

    def _contradiction(self, e: PeakEntry, props, *, lenient: bool) -> str | None:
        """Why the profile's properties rule out `e` (None when they fit). `lenient` allows a partition
        (MIG / VF / CPX...): fewer SMs and less memory than the datasheet."""
        cc = props["compute_capability"]
        if cc and e.compute_capability and cc not in [c.lower() for c in e.compute_capability]:
            return f"compute capability {cc} is not {'/'.join(e.compute_capability)}"
        sm, esm = props["sm_count"], e.value("sm_count")
        if sm is not None and esm:
            if sm > esm or (sm < esm and not lenient):
                return f"{sm} SMs/CUs, datasheet {esm}"
        mem, emem = props["memory_bytes"], e.value("memory_bytes")
        if mem is not None and emem:
            partition = lenient or (sm is not None and esm and sm < esm)
            if mem > emem * MEM_HIGH or (mem < emem * MEM_LOW and not partition):
                return f"{mem / 2**30:.1f} GiB, datasheet {emem / 2**30:.0f} GiB"
        return None

    def _ambiguous(self, cands: list[PeakEntry], rule: str, flags) -> Match:
        return Match(agreed_entry(cands), rule + ": figures shown only where all candidates agree", "ambiguous",
                     tuple(e.key for e in cands), flags)


def _pos(x):
    try:
        return int(x) if x is not None and int(x) > 0 else None
    except (TypeError, ValueError):
        return None


def _hint_words(p: _Parsed) -> list[str]:
    out = []
    if p.mem_gib:
        out.append(f"memory size {p.mem_gib}GB")
    if p.form:
        out.append(f"form factor {p.form}")
    if p.memtype:
        out.append(f"memory type {p.memtype.upper()}")
    if p.max_q:
        out.append("Max-Q")
    return out


def _props_words(props) -> str:
    parts = []
    if props["memory_bytes"] is not None:
        parts.append(f"memory {props['memory_bytes'] / 2**30:.1f} GiB")
    if props["sm_count"] is not None:
        parts.append(f"{props['sm_count']} SMs/CUs")
    if props["compute_capability"]:
        parts.append(f"compute capability {props['compute_capability']}")
    return ", ".join(parts) or "no properties"


def agreed_entry(cands: list[PeakEntry]) -> PeakEntry:
    """An entry holding only the figures every candidate agrees on (within 0.5 %; the smallest is shown)."""
    keys = [e.key for e in cands]
    values: dict[str, PeakValue] = {}
    names = sorted({f for e in cands for f in e.values})
    for f in names:
        vals = [e.values.get(f) for e in cands]
        nums = [pv.value if pv else None for pv in vals]
        if all(n is None for n in nums):
            values[f] = PeakValue(None, note="no candidate states it")
        elif any(n is None for n in nums):
            values[f] = PeakValue(None, note="differs between candidates: " + _list(keys, nums))
        elif max(nums) <= min(nums) * (1 + AGREE_TOLERANCE):
            i = nums.index(min(nums))
            base = vals[i]
            note = None if max(nums) == min(nums) else "candidates agree within 0.5%, smallest shown: " + _list(keys, nums)
            srcs = sorted({pv.source for pv in vals if pv and pv.source})
            values[f] = PeakValue(base.value, "; ".join(srcs) or None, base.derived, note)
        else:
            values[f] = PeakValue(None, note="differs between candidates: " + _list(keys, nums))
    same = lambda attr: (lambda s: s.pop() if len(s) == 1 else None)({getattr(e, attr) for e in cands})
    ccs = tuple(dict.fromkeys(c for e in cands for c in e.compute_capability))
    return PeakEntry(key="ambiguous:" + "|".join(keys), name=" or ".join(e.name for e in cands), vendor=same("vendor"),
                     family=same("family"), values=values, compute_capability=ccs, form=same("form"),
                     memory_type=same("memory_type"), device_scope=same("device_scope"), host_link=same("host_link"),
                     peer_link=same("peer_link"), origin="agreement of " + ", ".join(keys))


def _list(keys, nums) -> str:
    return ", ".join(f"{k}={'n/a' if n is None else f'{n:g}'}" for k, n in zip(keys, nums))


# ----------------------------------------------------------------------------------------- loading


@lru_cache(maxsize=1)
def _builtin() -> tuple[dict[str, dict], dict[str, str]]:
    try:
        doc = json.loads(BUILTIN_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # a packaging error, not a user error
        raise ProfileError(f"Built-in GPU peaks file {BUILTIN_PATH} cannot be read: {err}. Reinstall gpuscope.") from err
    return doc["devices"], doc["sources"]


def builtin_document() -> dict[str, Any]:
    """The raw built-in peaks.json (for tests and docs)."""
    return json.loads(BUILTIN_PATH.read_text(encoding="utf-8"))


def _entry_from_raw(key: str, raw: Mapping[str, Any], sources: Mapping[str, str], origin: str) -> PeakEntry:
    values = {}
    for f in VALUE_FIELDS:
        if f in raw:
            d = raw[f]
            src = d.get("source")
            values[f] = PeakValue(d.get("value"), sources.get(src, src) if src else None, d.get("derived"), d.get("note"))
    cc = raw.get("compute_capability") or ()
    return PeakEntry(key=key, name=raw.get("name") or key, vendor=raw.get("vendor"), family=raw.get("family"),
                     values=values, compute_capability=tuple(str(c) for c in ([cc] if isinstance(cc, str) else cc)),
                     form=raw.get("form"), memory_type=raw.get("memory_type"), device_scope=raw.get("device_scope"),
                     host_link=raw.get("host_link"), peer_link=raw.get("peer_link"), origin=origin)


def default_config_path() -> Path | None:
    """$GPUSCOPE_PEAKS, else $XDG_CONFIG_HOME/gpuscope/peaks.json (default ~/.config/gpuscope/peaks.json)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpuscope" / "peaks.json"


def load_peaks(extra: Mapping[str, Any] | None = None, config_path: Path | str | None = None) -> PeakTable:
    """Built-in peaks, then the user config, then `extra` (per-call), each overriding the previous.

    Config / `extra` format: a JSON object keyed either by a model key of the built-in table
    ('h100-sxm5', ...; the given figures replace the built-in ones) or by a device name as profiles
    write it ('NVIDIA H100 80GB HBM3'; that name then matches this entry first, confidence 'exact').
    A name entry either names `"base": "<model key>"` and overrides some figures, or states its own
    figures (missing ones stay null). A figure is a number, null, or {"value", "source", "note",
    "derived"}; text attributes (name, vendor, host_link, ...) are strings. Keys starting with '_' are
    comments. The config file is `config_path`, else $GPUSCOPE_PEAKS, else ~/.config/gpuscope/peaks.json
    (optional unless named explicitly); any problem raises ProfileError naming the file.
    """
    raw_entries, sources = _builtin()
    entries = {k: _entry_from_raw(k, r, sources, "built-in") for k, r in raw_entries.items()}
    names: dict[str, str] = {}
    origins = [f"built-in {BUILTIN_PATH.name}"]

    explicit = config_path is not None or bool(os.environ.get(ENV_VAR))
    path = Path(config_path).expanduser() if config_path is not None else default_config_path()
    if path is not None and (explicit or path.exists()):
        doc = _read_config(path)
        _apply(doc, entries, names, f"user config {path}", f"GPU peaks config {path}")
        origins.append(f"user config {path}")
    if extra:
        _apply(extra, entries, names, "per-call override", "GPU peaks override")
        origins.append("per-call override")
    return PeakTable(entries, names, origins)


def _read_config(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        how = f"(named by ${ENV_VAR})" if os.environ.get(ENV_VAR) and Path(os.environ[ENV_VAR]).expanduser() == path else ""
        raise ProfileError(f"GPU peaks config {path} {how} does not exist. Create it or point ${ENV_VAR} at the right file."
                           .replace("  ", " ")) from None
    except OSError as err:
        raise ProfileError(f"GPU peaks config {path} cannot be read: {err}.") from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise ProfileError(f"GPU peaks config {path} is not valid JSON: {err}. Fix the file "
                           f"(format: {{\"<model key or device name>\": {{\"tflops_bf16_matrix\": 989.5, ...}}}}).") from None


def _apply(doc: Any, entries: dict[str, PeakEntry], names: dict[str, str], origin: str, where: str) -> None:
    def bad(problem: str) -> ProfileError:
        return ProfileError(f"{where}: {problem}. Known model keys: {', '.join(sorted(k for k in entries if ':' not in k))}; "
                            f"known figures: {', '.join(VALUE_FIELDS)}.")

    if not isinstance(doc, Mapping):
        raise bad(f"the top level must be an object keyed by model key or device name, not {type(doc).__name__}")
    for key, spec in doc.items():
        if not isinstance(key, str) or not key.strip():
            raise bad(f"empty key {key!r}")
        if key.startswith("_"):
            continue
        if not isinstance(spec, Mapping):
            raise bad(f"{key!r} must map to an object of figures, not {type(spec).__name__}")
        patch_values, patch_attrs = _validate_spec(key, spec, bad, origin)
        if key in entries:
            base = entries[key]
            entries[key] = _patched(base, patch_values, patch_attrs, f"{base.origin} + {origin}")
            continue
        base_key = spec.get("base")
        if base_key is not None:
            if base_key not in entries:
                raise bad(f"{key!r}: base {base_key!r} is not a model key")
            base = entries[base_key]
            new_key = f"user:{key}"
            entry = _patched(base, patch_values, patch_attrs, f"{origin} (based on {base_key})")
            entry = _replace(entry, key=new_key, name=patch_attrs.get("name") or f"{key} (based on {base.name})")
        else:
            if not patch_values:
                raise bad(f"{key!r} is neither a model key nor a device name with figures or a \"base\" model")
            vals = {f: PeakValue(None, note=f"not given in {origin}") for f in REQUIRED_FIELDS}
            vals.update(patch_values)
            cc = patch_attrs.pop("compute_capability", ())
            entry = PeakEntry(key=f"user:{key}", name=patch_attrs.pop("name", key), vendor=patch_attrs.pop("vendor", None),
                              family=None, values=vals, compute_capability=tuple(cc), origin=origin, **patch_attrs)
        norm = normalize_name(key)
        if not norm:
            raise bad(f"{key!r} normalises to an empty device name")
        entries[entry.key] = entry
        names[norm] = entry.key


def _validate_spec(key: str, spec: Mapping[str, Any], bad, origin: str):
    values: dict[str, PeakValue] = {}
    attrs: dict[str, Any] = {}
    for f, val in spec.items():
        if f == "base" or f.startswith("_"):
            continue
        if f in VALUE_FIELDS:
            if isinstance(val, Mapping):
                unknown = set(val) - {"value", "source", "derived", "note"}
                if unknown:
                    raise bad(f"{key}.{f}: unknown keys {sorted(unknown)} (allowed: value, source, derived, note)")
                number, src = val.get("value"), val.get("source") or origin
                note, derived = val.get("note"), val.get("derived")
            else:
                number, src, note, derived = val, origin, None, None
            if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float))
                                       or not math.isfinite(number) or number < 0):
                raise bad(f"{key}.{f}: {number!r} is not a non-negative number or null")
            for name_, s in (("source", src), ("note", note), ("derived", derived)):
                if s is not None and not isinstance(s, str):
                    raise bad(f"{key}.{f}.{name_} must be text")
            values[f] = PeakValue(number, src, derived, note if number is not None or note else f"set to null by {origin}")
        elif f in TEXT_FIELDS:
            if val is not None and not isinstance(val, str):
                raise bad(f"{key}.{f} must be text or null")
            attrs[f] = val
        elif f in LIST_FIELDS:
            vals = [val] if isinstance(val, str) else val
            if not isinstance(vals, list) or not all(isinstance(x, str) for x in vals):
                raise bad(f"{key}.{f} must be a string or a list of strings")
            attrs[f] = tuple(vals)
        else:
            close = [x for x in VALUE_FIELDS + TEXT_FIELDS if x.split("_")[-1] == f.split("_")[-1]][:3]
            raise bad(f"{key}: unknown figure {f!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return values, attrs


def _patched(base: PeakEntry, values: dict[str, PeakValue], attrs: dict[str, Any], origin: str) -> PeakEntry:
    merged = dict(base.values)
    merged.update(values)
    return _replace(base, values=merged, origin=origin, **attrs)


def _replace(e: PeakEntry, **kw) -> PeakEntry:
    d = {k: getattr(e, k) for k in PeakEntry.__dataclass_fields__}
    d.update(kw)
    return PeakEntry(**d)


_default_lock = threading.Lock()
_default_cache: dict[tuple, PeakTable] = {}


def default_table() -> PeakTable:
    """load_peaks() with no per-call overrides, reloaded when the user config file changes."""
    path = default_config_path()
    try:
        stamp = path.stat().st_mtime_ns if path else None
    except OSError:
        stamp = None
    key = (str(path), stamp, os.environ.get(ENV_VAR))
    with _default_lock:
        hit = _default_cache.get(key)
    if hit is None:
        hit = load_peaks()
        with _default_lock:
            _default_cache.clear()
            _default_cache[key] = hit
    return hit


# ----------------------------------------------------------------------------------------- public API


def match_device(name: str | None, *, memory_bytes: int | None = None, sm_count: int | None = None,
                 vendor: str | None = None, compute_capability: str | None = None,
                 table: PeakTable | None = None) -> Match | None:
    """The peaks entry for a device name as a profile writes it, or None for an unknown GPU."""
    return (table or default_table()).match(name, memory_bytes=memory_bytes, sm_count=sm_count, vendor=vendor,
                                             compute_capability=compute_capability)


def peaks_for_device(trace, device_id: int, overrides: Mapping[str, Any] | None = None, *,
                     table: PeakTable | None = None) -> DevicePeaks | None:
    """Peaks of `device_id` in `trace` (its `devices` row), or None when the device is not in the
    profile, is not a compute device, or is an unknown GPU (say 'unknown GPU: no peaks')."""
    rows = trace.sql_dicts("SELECT * FROM devices WHERE device_id = ? LIMIT 1", [int(device_id)])
    if not rows:
        return None
    row = rows[0]
    if row.get("is_compute") is False:
        return None
    if table is None:
        table = load_peaks(extra=overrides) if overrides else default_table()
    elif overrides:
        raise ValueError("pass either table or overrides")
    m = table.match(row.get("name"), memory_bytes=row.get("memory_bytes"), sm_count=row.get("sm_count"),
                    vendor=row.get("vendor"), compute_capability=row.get("compute_capability"))
    if m is None:
        return None
    return device_peaks(m, row)


def device_peaks(m: Match, row: Mapping[str, Any]) -> DevicePeaks:
    """Combine a match with the profile's devices row: report both figures where they disagree, scale
    compute peaks to a partition's SM/CU count, derive FP32 from the profile clock where the datasheet
    gives none."""
    e = m.entry
    profile = {k: row.get(k) for k in ("name", "vendor", "sm_count", "memory_bytes", "memory_bandwidth_bytes_per_s",
                                       "clock_hz", "compute_capability")}
    out = DevicePeaks(device_id=row.get("device_id"), device_name=row.get("name"), match=m, entry=e, profile=profile)
    values = dict(e.values)
    if m.flags:
        out.notes.append("device is a " + " / ".join(m.flags) + " of the model")
    if m.confidence == "ambiguous":
        out.notes.append("ambiguous model (" + ", ".join(m.candidates) + "): only the figures all candidates agree on are given")

    psm, esm = _pos(row.get("sm_count")), _pos(e.value("sm_count"))
    if psm and esm and psm != esm:
        out.discrepancies.append(f"profile reports {psm} SMs/CUs, datasheet {esm}")
        if psm < esm:
            ratio = psm / esm
            for f, pv in list(values.items()):
                if f.startswith(COMPUTE_PREFIXES) and pv.value is not None:
                    values[f] = PeakValue(round(pv.value * ratio, 4), pv.source,
                                          f"datasheet {pv.value:g} x {psm}/{esm} SMs/CUs (partition)", pv.note)
            out.notes.append(f"compute peaks scaled by {psm}/{esm}: the device exposes a part of the GPU; "
                             "memory bandwidth is left at the whole-GPU datasheet figure")

    pbw, ebw = _pos(row.get("memory_bandwidth_bytes_per_s")), e.value("memory_bandwidth_bytes_per_s")
    if pbw and ebw and abs(pbw - ebw) > BANDWIDTH_TOLERANCE * ebw:
        out.discrepancies.append(f"profile reports memory bandwidth {pbw / 1e9:.1f} GB/s, datasheet {ebw / 1e9:.1f} GB/s "
                                 "(the profile's figure is what this board reports)")
    pclk, eclk = _pos(row.get("clock_hz")), e.value("boost_clock_hz")
    if pclk and eclk and abs(pclk - eclk) > CLOCK_TOLERANCE * eclk:
        out.discrepancies.append(f"profile reports clock {pclk / 1e6:.0f} MHz, datasheet boost {eclk / 1e6:.0f} MHz "
                                 "(datasheet peaks assume the datasheet clock)")
    pmem, emem = _pos(row.get("memory_bytes")), e.value("memory_bytes")
    if pmem and emem and (pmem > emem * MEM_HIGH or pmem < emem * MEM_LOW):
        out.discrepancies.append(f"profile reports {pmem / 2**30:.1f} GiB of memory, datasheet {emem / 2**30:.0f} GiB")

    cores = e.value("cuda_cores")
    fp32 = values.get("tflops_fp32")
    if (fp32 is None or fp32.value is None) and cores and pclk:
        values["tflops_fp32"] = PeakValue(round(2 * cores * pclk / 1e12, 3), e.get("cuda_cores").source,
                                          f"2 x {cores} CUDA cores x profile clock {pclk / 1e6:g} MHz",
                                          "the datasheet gives no single boost clock; derived from the profile's clock")
        out.notes.append("tflops_fp32 derived from the profile's clock")
    if values != dict(e.values):
        out.entry = _replace(e, values=values)
    return out


__all__ = [
    "PeakValue", "PeakEntry", "Match", "DevicePeaks", "PeakTable", "load_peaks", "match_device",
    "peaks_for_device", "device_peaks", "normalize_name", "default_config_path", "default_table",
    "builtin_document", "agreed_entry", "REQUIRED_FIELDS", "OPTIONAL_FIELDS", "VALUE_FIELDS", "CONFIDENCES",
]
