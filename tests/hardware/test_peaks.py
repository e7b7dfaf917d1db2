"""Hardware peaks: the data file (fields, sources, internal consistency), device-name matching (real
profile names and synthetic variants), overrides / user config, and peaks_for_device."""

from __future__ import annotations

import json
import math

import pytest

from conftest import needs_data, real_files
from gpuscope.tools.hardware import (
    REQUIRED_FIELDS,
    VALUE_FIELDS,
    load_peaks,
    match_device,
    normalize_name,
    peaks_for_device,
)
from gpuscope.tools.hardware.peaks import builtin_document
from gpuscope.tools.model.errors import ProfileError

GiB = 2**30


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch, tmp_path):
    """Tests never read the developer's own ~/.config/gpuscope/peaks.json."""
    monkeypatch.delenv("GPUSCOPE_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="module")
def doc():
    return builtin_document()


# ----------------------------------------------------------------------------------------- the data

REQUIRED_MODELS = [
    "h100-sxm5", "h100-pcie", "h100-nvl", "h200-sxm", "b200", "gb200", "a100-sxm4-40gb", "a100-sxm4-80gb",
    "a100-pcie-40gb", "a100-pcie-80gb", "l40s", "l4", "a10", "t4", "v100-sxm2-16gb", "v100-sxm2-32gb",
    "v100-pcie-16gb", "v100-pcie-32gb", "rtx-4090", "rtx-3090", "rtx-3080-10gb", "rtx-4060-ti-8gb",
    "rtx-4060-ti-16gb", "rtx-4060", "gtx-1060-6gb", "gtx-1060-max-q", "mi300x", "mi325x", "mi355x",
    "mi250x-gcd", "mi250-gcd", "mi210",
]


def test_required_models_present(doc):
    missing = set(REQUIRED_MODELS) - set(doc["devices"])
    assert not missing


def test_every_entry_has_every_field_with_a_source_or_a_note(doc):
    sources = doc["sources"]
    for key, e in doc["devices"].items():
        for attr in ("name", "vendor", "family", "compute_capability", "device_scope"):
            assert e.get(attr), (key, attr)
        assert "host_link" in e and "peer_link" in e, key
        for f in REQUIRED_FIELDS:
            assert f in e, (key, f)
        for f in VALUE_FIELDS:
            if f not in e:
                continue
            d = e[f]
            assert set(d) <= {"value", "source", "derived", "note"}, (key, f)
            if d["value"] is None:
                assert d.get("note"), f"{key}.{f} is null without a note"
            else:
                assert isinstance(d["value"], (int, float)) and d["value"] >= 0, (key, f)
                assert d.get("source") in sources, f"{key}.{f} has no known source"
            if "derived" in d:
                assert isinstance(d["derived"], str) and d["derived"], (key, f)
        for f in e:
            if f.startswith(("tflops_", "tops_")) or f.endswith(("_bytes", "_hz", "_per_s", "_per_direction")):
                assert f in VALUE_FIELDS, f"{key}: unexpected figure {f}"


def test_sources_name_a_document_and_year(doc):
    used = {d["source"] for e in doc["devices"].values() for d in e.values() if isinstance(d, dict) and "source" in d}
    assert used == set(doc["sources"])
    for key, text in doc["sources"].items():
        assert any(str(y) in text for y in range(2010, 2031)), key


def test_core_figures_are_stated(doc):
    """Memory size and bandwidth, FP32 and a matrix peak are known for every model (the Max-Q GTX 1060
    derives FP32 from the profile clock; it has no tensor cores)."""
    for key, e in doc["devices"].items():
        assert e["memory_bytes"]["value"] and e["memory_bandwidth_bytes_per_s"]["value"], key
        if key != "gtx-1060-max-q":
            assert e["tflops_fp32"]["value"], key
        if not key.startswith("gtx-1060"):
            assert e["tflops_fp16_matrix"]["value"], key


def test_sparsity_figures_are_halved(doc):
    for key, e in doc["devices"].items():
        for f in VALUE_FIELDS:
            d = e.get(f) or {}
            der = d.get("derived", "")
            if "sparsity" in der and "GPUs" not in der:
                sparse = float(der.split("figure ")[1].split(" /")[0])
                assert d["value"] == pytest.approx(sparse / 2, abs=0.01), (key, f)


def test_fp32_matches_lanes_times_clock(doc):
    """FP32 = 2 x SMs x lanes/SM x clock with 64 or 128 lanes per SM/CU: catches typos in SM count,
    clock or TFLOP/s (AMD CDNA 3/4 dual-issue FP32 shows as 128)."""
    for key, e in doc["devices"].items():
        sm, clk, fp32 = (e[f]["value"] for f in ("sm_count", "boost_clock_hz", "tflops_fp32"))
        if not (sm and clk and fp32):
            continue
        lanes = fp32 * 1e12 / (2 * sm * clk)
        assert min(abs(lanes / 64 - 1), abs(lanes / 128 - 1)) < 0.015, (key, lanes)


def test_matrix_rate_is_a_power_of_two_per_sm_clock(doc):
    """Tensor FP16 per SM per clock is a power of two at the boost clock, except Hopper, whose
    datasheet tensor figures assume a lower sustained clock (noted on boost_clock_hz)."""
    for key, e in doc["devices"].items():
        sm, clk, f16 = (e[f]["value"] for f in ("sm_count", "boost_clock_hz", "tflops_fp16_matrix"))
        if not (sm and clk and f16):
            continue
        if e["family"] in ("h100", "h200"):
            assert "sustained" not in e["boost_clock_hz"]["note"] and "under load" in e["boost_clock_hz"]["note"], key
            continue
        per = f16 * 1e12 / (sm * clk)
        assert abs(per / 2 ** round(math.log2(per)) - 1) < 0.015, (key, per)


def test_dense_ordering(doc):
    """Lower precision never has a lower matrix peak than higher precision on the same model."""
    order = ["tflops_tf32_matrix", "tflops_bf16_matrix", "tflops_fp8_matrix", "tflops_fp4_matrix"]
    for key, e in doc["devices"].items():
        vals = [e[f]["value"] for f in order if f in e and e[f]["value"]]
        assert vals == sorted(vals), key
        if e["tflops_fp16_matrix"]["value"] and e["tflops_bf16_matrix"]["value"]:
            assert e["tflops_fp16_matrix"]["value"] == e["tflops_bf16_matrix"]["value"], key


def test_memory_is_gib_of_the_datasheet_size(doc):
    for key, e in doc["devices"].items():
        assert e["memory_bytes"]["value"] % GiB == 0, key


def test_selected_datasheet_values(doc):
    d = doc["devices"]
    assert d["h100-sxm5"]["tflops_bf16_matrix"]["value"] == pytest.approx(989.5)
    assert d["h100-sxm5"]["memory_bandwidth_bytes_per_s"]["value"] == 3.35e12
    assert d["a100-sxm4-80gb"]["memory_bandwidth_bytes_per_s"]["value"] == 2039e9
    assert d["a100-pcie-80gb"]["memory_bandwidth_bytes_per_s"]["value"] == 1935e9
    assert d["mi300x"]["tflops_bf16_matrix"]["value"] == 1307.4
    assert d["mi250x-gcd"]["tflops_fp16_matrix"]["value"] == pytest.approx(383.0 / 2)
    assert d["b200"]["tflops_fp8_matrix"]["value"] == 4500
    assert d["gb200"]["tflops_bf16_matrix"]["value"] == 2500
    assert d["t4"]["tflops_bf16_matrix"]["value"] is None
    assert d["h100-sxm5"]["host_link_gb_per_s_per_direction"]["value"] == 64
    assert d["h100-sxm5"]["peer_link_gb_per_s_per_direction"]["value"] == 450
    assert d["rtx-4060-ti-8gb"]["host_link_gb_per_s_per_direction"]["value"] == 16  # PCIe Gen4 x8


# ----------------------------------------------------------------------------------------- matching


@pytest.mark.parametrize("name, kw, key, confidence", [
    # names profiles write (Kineto deviceProperties, Nsight TARGET_INFO_GPU, rocpd / rocm-smi)
    ("NVIDIA H100 80GB HBM3", dict(memory_bytes=85018279936, sm_count=132), "h100-sxm5", "exact"),
    ("NVIDIA H100 80GB HBM3", {}, "h100-sxm5", "exact"),
    ("NVIDIA A100-PG509-200", dict(memory_bytes=42297524224, sm_count=108), "a100-sxm4-40gb", "by properties"),
    ("NVIDIA A100-PG509-200", dict(memory_bytes=85197848576, sm_count=108), "a100-sxm4-80gb", "by properties"),
    ("A100-PCIE-40GB", dict(memory_bytes=42505273344, sm_count=108), "a100-pcie-40gb", "exact"),
    ("AMD Instinct MI300X VF", dict(memory_bytes=205571227648, sm_count=304), "mi300x", "exact"),
    ("AMD Instinct MI300X", dict(memory_bytes=206141652992, sm_count=304), "mi300x", "exact"),
    ("NVIDIA GeForce RTX 3080", dict(memory_bytes=10736893952, sm_count=68), "rtx-3080-10gb", "exact"),
    ("NVIDIA GeForce RTX 4060 Ti", dict(memory_bytes=8585216000, sm_count=34), "rtx-4060-ti-8gb", "by properties"),
    ("NVIDIA GeForce RTX 4060 Ti", dict(memory_bytes=17171480576, sm_count=34), "rtx-4060-ti-16gb", "by properties"),
    ("GeForce GTX 1060 with Max-Q Design", dict(memory_bytes=6442450944, sm_count=10), "gtx-1060-max-q", "exact"),
    # synthetic variants
    ("NVIDIA H100 PCIe", dict(memory_bytes=85520809984, sm_count=114), "h100-pcie", "exact"),
    ("NVIDIA H100 NVL", dict(memory_bytes=95830 * 2**20, sm_count=132), "h100-nvl", "exact"),
    ("NVIDIA H200", dict(memory_bytes=143771 * 2**20, sm_count=132), "h200-sxm", "exact"),
    ("NVIDIA H200 NVL", {}, "h200-nvl", "exact"),
    ("NVIDIA B200", dict(memory_bytes=183359 * 2**20, sm_count=148), "b200", "exact"),
    ("NVIDIA GB200", {}, "gb200", "exact"),
    ("NVIDIA A100-SXM4-40GB", {}, "a100-sxm4-40gb", "exact"),
    ("NVIDIA A100-SXM4-80GB", {}, "a100-sxm4-80gb", "exact"),
    ("NVIDIA A100-SXM-80GB", {}, "a100-sxm4-80gb", "exact"),
    ("NVIDIA A100 80GB PCIe", {}, "a100-pcie-80gb", "exact"),
    ("NVIDIA L40S", {}, "l40s", "exact"),
    ("NVIDIA L4", dict(memory_bytes=23034 * 2**20, sm_count=58), "l4", "exact"),
    ("NVIDIA A10", dict(memory_bytes=22731 * 2**20, sm_count=72), "a10", "exact"),
    ("Tesla T4", dict(memory_bytes=15109 * 2**20, sm_count=40), "t4", "exact"),
    ("Tesla V100-SXM2-16GB", {}, "v100-sxm2-16gb", "exact"),
    ("Tesla V100-SXM2-32GB", {}, "v100-sxm2-32gb", "exact"),
    ("Tesla V100-PCIE-16GB", {}, "v100-pcie-16gb", "exact"),
    ("Tesla V100-PCIE-32GB", {}, "v100-pcie-32gb", "exact"),
    ("NVIDIA GeForce RTX 4090", dict(sm_count=128), "rtx-4090", "exact"),
    ("NVIDIA GeForce RTX 3090", {}, "rtx-3090", "exact"),
    ("NVIDIA GeForce RTX 4060", dict(sm_count=24), "rtx-4060", "exact"),
    ("NVIDIA GeForce GTX 1060 6GB", {}, "gtx-1060-6gb", "exact"),
    ("GeForce GTX 1060 3GB", {}, "gtx-1060-3gb", "exact"),
    ("GeForce GTX 1060", dict(memory_bytes=6 * GiB, sm_count=10), "gtx-1060-6gb", "by properties"),
    ("AMD Instinct MI325X", {}, "mi325x", "exact"),
    ("AMD Instinct MI355X", {}, "mi355x", "exact"),
    ("AMD Instinct MI210", dict(memory_bytes=64 * GiB, sm_count=104), "mi210", "exact"),
    ("AMD Instinct MI250X", dict(memory_bytes=64 * GiB, sm_count=110), "mi250x-gcd", "exact"),
    ("AMD Instinct MI250X/MI250", dict(memory_bytes=64 * GiB, sm_count=110), "mi250x-gcd", "by properties"),
    ("AMD Instinct MI250X/MI250", dict(memory_bytes=64 * GiB, sm_count=104), "mi250-gcd", "by properties"),
    ("AMD Radeon Graphics", dict(memory_bytes=68702699520, sm_count=110, vendor="AMD"), "mi250x-gcd", "by properties"),
    # MI300X and MI325X share gfx942 and 304 CUs: the memory size tells them apart
    ("AMD Radeon Graphics", dict(memory_bytes=192 * GiB, sm_count=304, vendor="AMD", compute_capability="gfx942"),
     "mi300x", "by properties"),
    ("gfx942", dict(memory_bytes=256 * GiB, sm_count=304, vendor="AMD"), "mi325x", "by properties"),
    ("amd instinct  mi300x", {}, "mi300x", "exact"),
    ("AMD Instinct MI210", dict(compute_capability="gfx90a:sramecc+:xnack-"), "mi210", "exact"),
])
def test_match_names(name, kw, key, confidence):
    m = match_device(name, **kw)
    assert m is not None, name
    assert (m.entry.key, m.confidence) == (key, confidence), m.rule
    assert m.rule and key in m.candidates


def test_vf_and_mig_flags():
    m = match_device("AMD Instinct MI300X VF", memory_bytes=205571227648, sm_count=304)
    assert m.flags == ("virtual function",)
    m = match_device("NVIDIA A100-SXM4-40GB MIG 1g.5gb", memory_bytes=4864 * 2**20, sm_count=14)
    assert m.entry.key == "a100-sxm4-40gb" and "MIG instance" in m.flags


def test_generic_amd_name_is_ambiguous_between_mi250_gcd_and_mi210():
    """The HTA MI250 trace names its GCDs 'AMD Radeon Graphics' (gfx90a, 104 CUs, 64 GiB): an MI250
    GCD and an MI210 look the same; per device their peaks agree (within 0.5%), their links do not."""
    m = match_device("AMD Radeon Graphics", memory_bytes=68702699520, sm_count=104, vendor="AMD", compute_capability="9.0")
    assert m.confidence == "ambiguous"
    assert set(m.candidates) == {"mi250-gcd", "mi210"}
    e = m.entry
    assert e.value("tflops_fp16_matrix") == 181.0  # the smaller of 181.05 / 181.0
    assert "agree within" in e.get("tflops_fp16_matrix").note
    assert e.value("memory_bandwidth_bytes_per_s") == 1.6384e12
    assert e.value("host_link_gb_per_s_per_direction") == 32
    assert e.host_link is None  # 'PCIe Gen4 x16 (per package)' vs 'PCIe Gen4 x16'


def test_ambiguous_without_properties_keeps_only_agreed_figures():
    m = match_device("NVIDIA GeForce RTX 4060 Ti")
    assert m.confidence == "ambiguous"
    assert m.entry.value("tflops_bf16_matrix") == pytest.approx(44.13)
    assert m.entry.value("memory_bytes") is None and "differs" in m.entry.get("memory_bytes").note


@pytest.mark.parametrize("name, kw", [
    ("NVIDIA H800", {}),
    ("NVIDIA A10G", {}),
    ("NVIDIA GeForce RTX 4060 Laptop GPU", {}),
    ("NVIDIA GeForce RTX 3080 Ti", {}),
    ("NVIDIA GeForce RTX 4090 D", {}),
    ("Tesla V100S-PCIE-32GB", {}),
    ("NVIDIA L40", {}),
    ("NVIDIA GH200 480GB", {}),
    ("Intel(R) HD Graphics 630", {}),
    ("Microsoft Basic Render Driver", {}),
    ("AMD Radeon RX 7900 XTX", dict(memory_bytes=24 * GiB, sm_count=96)),
    ("AMD Radeon Graphics", {}),                   # generic name, no properties
    ("AMD Radeon Graphics", dict(sm_count=104)),   # generic name, memory unknown
    (None, dict(vendor="AMD")),
    ("", {}),
    ("NVIDIA GeForce RTX 3080", dict(memory_bytes=12 * GiB, sm_count=70)),  # the 12 GB RTX 3080: not in the table
    ("NVIDIA H100 80GB HBM3", dict(compute_capability="8.0")),
])
def test_unknown_devices_return_none(name, kw):
    assert match_device(name, **kw) is None


def test_normalize_name():
    assert normalize_name("NVIDIA A100-PCIE-40GB") == "a100 pcie 40gb"
    assert normalize_name("AMD Instinct(TM) MI300X VF") == "mi300x vf"
    assert normalize_name("Tesla V100-SXM2-32 GB") == "v100 sxm2 32gb"


# ----------------------------------------------------------------------------------------- real data


EXPECTED_REAL = {
    "gtx1060": "gtx-1060-max-q", "rtx3080": "rtx-3080-10gb", "rtx4060ti": "rtx-4060-ti-8gb",
    "4xA100": "a100-pcie-40gb", "nv_a100": "a100-sxm4-40gb", "nv_h100": "h100-sxm5", "mi300x": "mi300x",
}


@pytest.mark.real_data
@needs_data
@pytest.mark.parametrize("path", real_files("nsys/*.sqlite", "pytorch/*.json.gz"), ids=lambda p: p.name)
def test_real_profiles_devices_match(path):
    from gpuscope.tools.model.cache import open_trace

    trace = open_trace(path)
    rows = trace.sql_dicts("SELECT * FROM devices")
    named = [r for r in rows if r["is_compute"] and r["name"]]
    # only the sampled 128-rank traces record no device properties; everywhere else something is checked
    assert named or path.name.startswith("nv_encdec_"), rows
    for r in named:
        dp = peaks_for_device(trace, r["device_id"])
        expected = next((v for k, v in EXPECTED_REAL.items() if k in path.name), None)
        if "mi250" in path.name:  # 'AMD Radeon Graphics': MI250 GCD or MI210
            assert dp is not None and dp.confidence == "ambiguous"
            assert set(dp.match.candidates) == {"mi250-gcd", "mi210"}
            assert dp.value("tflops_bf16_matrix") == 181.0
            continue
        assert expected is not None, f"add {path.name} to EXPECTED_REAL"
        assert dp is not None, (path.name, r["name"])
        assert dp.entry.key == expected and dp.confidence in ("exact", "by properties"), dp.match.rule
        assert dp.value("memory_bandwidth_bytes_per_s"), path.name
        # board-reported bandwidth (Nsight states it) agrees with the datasheet within 1%
        assert not [d for d in dp.discrepancies if "bandwidth" in d], dp.discrepancies
    for r in rows:
        if not r["is_compute"]:
            assert peaks_for_device(trace, r["device_id"]) is None


# ----------------------------------------------------------------------------------------- peaks_for_device


class _Trace:
    """Minimal stand-in for a Trace: only sql_dicts on the devices table."""

    def __init__(self, *rows):
        self.rows = [dict(device_id=i, name=None, vendor=None, is_compute=True, sm_count=None, memory_bytes=None,
                          memory_bandwidth_bytes_per_s=None, clock_hz=None, compute_capability=None, warp_size=None,
                          bus_location=None) | r for i, r in enumerate(rows)]

    def sql_dicts(self, query, params=None):
        assert "FROM devices" in query
        return [r for r in self.rows if r["device_id"] == params[0]]


def test_peaks_for_device_agreeing_profile():
    t = _Trace(dict(name="A100-PCIE-40GB", vendor="NVIDIA", sm_count=108, memory_bytes=42505273344,
                    memory_bandwidth_bytes_per_s=1555200000000, clock_hz=1410000000, compute_capability="8.0"))
    dp = peaks_for_device(t, 0)
    assert dp.entry.key == "a100-pcie-40gb" and dp.confidence == "exact"
    assert dp.discrepancies == []
    assert dp.value("tflops_tf32_matrix") == 156
    assert dp.get("tflops_tf32_matrix").source.startswith("NVIDIA A100 Tensor Core GPU datasheet")
    d = dp.to_dict()
    assert d["profile"]["memory_bandwidth_bytes_per_s"] == 1555200000000
    assert d["peaks"]["memory_bandwidth_bytes_per_s"]["value"] == 1555e9
    json.dumps(d)


def test_peaks_for_device_reports_both_when_profile_disagrees():
    t = _Trace(dict(name="NVIDIA GeForce RTX 3080", sm_count=68, memory_bytes=10 * GiB,
                    memory_bandwidth_bytes_per_s=912e9, clock_hz=1_950_000_000, compute_capability="8.6"))
    dp = peaks_for_device(t, 0)
    assert dp.value("memory_bandwidth_bytes_per_s") == 760e9      # datasheet
    assert dp.profile["memory_bandwidth_bytes_per_s"] == 912e9     # what the board reports
    assert any("912.0 GB/s" in d and "760.0 GB/s" in d for d in dp.discrepancies)
    assert any("1950 MHz" in d and "1710 MHz" in d for d in dp.discrepancies)


def test_peaks_for_device_scales_partitions():
    t = _Trace(dict(name="AMD Instinct MI300X", vendor="AMD", sm_count=38, memory_bytes=192 * GiB, compute_capability="9.4"))
    dp = peaks_for_device(t, 0)
    assert dp.entry.key == "mi300x"
    assert dp.value("tflops_bf16_matrix") == pytest.approx(1307.4 / 8)
    assert "38/304" in dp.get("tflops_bf16_matrix").derived
    assert dp.value("memory_bandwidth_bytes_per_s") == 5.3e12
    assert any("38 SMs/CUs" in d for d in dp.discrepancies)


def test_peaks_for_device_derives_fp32_from_profile_clock():
    t = _Trace(dict(name="GeForce GTX 1060 with Max-Q Design", sm_count=10, memory_bytes=6 * GiB, clock_hz=1341500000))
    dp = peaks_for_device(t, 0)
    assert dp.value("tflops_fp32") == pytest.approx(2 * 1280 * 1.3415e9 / 1e12, rel=1e-3)
    assert "profile clock" in dp.get("tflops_fp32").derived


def test_peaks_for_device_unknown_missing_and_display_devices():
    t = _Trace(dict(name="NVIDIA H800", sm_count=132), dict(name="Intel(R) HD Graphics 630", is_compute=False))
    assert peaks_for_device(t, 0) is None
    assert peaks_for_device(t, 1) is None
    assert peaks_for_device(t, 7) is None


# ----------------------------------------------------------------------------------------- overrides


def test_per_call_override_by_model_key():
    t = load_peaks(extra={"h100-sxm5": {"memory_bandwidth_bytes_per_s": 3.0e12,
                                        "tflops_bf16_matrix": {"value": 700, "source": "our measured ceiling"}}})
    e = t["h100-sxm5"]
    assert e.value("memory_bandwidth_bytes_per_s") == 3.0e12
    assert e.get("memory_bandwidth_bytes_per_s").source == "per-call override"
    assert e.get("tflops_bf16_matrix").source == "our measured ceiling"
    assert e.value("tflops_fp32") == 67  # untouched figures stay
    assert load_peaks()["h100-sxm5"].value("tflops_bf16_matrix") == pytest.approx(989.5)  # no leak


def test_per_call_override_by_device_name_with_base():
    extra = {"NVIDIA H100 80GB HBM3": {"base": "h100-sxm5", "tflops_bf16_matrix": 800}}
    m = match_device("NVIDIA H100 80GB HBM3", table=load_peaks(extra=extra))
    assert m.confidence == "exact" and "user override" in m.rule
    assert m.entry.value("tflops_bf16_matrix") == 800 and m.entry.value("tflops_fp32") == 67


def test_override_new_device_name(tmp_path):
    extra = {"NVIDIA H800": {"name": "NVIDIA H800 SXM", "vendor": "NVIDIA", "tflops_bf16_matrix": 989.5,
                             "memory_bandwidth_bytes_per_s": 3.35e12}}
    table = load_peaks(extra=extra)
    m = match_device("NVIDIA H800", table=table)
    assert m.entry.key == "user:NVIDIA H800" and m.entry.value("tflops_bf16_matrix") == 989.5
    assert m.entry.value("tflops_fp32") is None and "not given" in m.entry.get("tflops_fp32").note
    t = _Trace(dict(name="NVIDIA H800", sm_count=132))
    assert peaks_for_device(t, 0, overrides=extra).value("tflops_bf16_matrix") == 989.5


def test_config_file_explicit_env_and_default(tmp_path, monkeypatch):
    cfg = tmp_path / "peaks.json"
    cfg.write_text(json.dumps({"_comment": "lab ceilings", "a100-sxm4-40gb": {"tflops_bf16_matrix": 280}}))
    assert load_peaks(config_path=cfg)["a100-sxm4-40gb"].value("tflops_bf16_matrix") == 280
    assert str(cfg) in load_peaks(config_path=cfg)["a100-sxm4-40gb"].get("tflops_bf16_matrix").source

    monkeypatch.setenv("GPUSCOPE_PEAKS", str(cfg))
    assert load_peaks()["a100-sxm4-40gb"].value("tflops_bf16_matrix") == 280
    assert match_device("NVIDIA A100-SXM4-40GB").entry.value("tflops_bf16_matrix") == 280
    # per-call overrides win over the config
    assert load_peaks(extra={"a100-sxm4-40gb": {"tflops_bf16_matrix": 250}})["a100-sxm4-40gb"].value("tflops_bf16_matrix") == 250
    monkeypatch.delenv("GPUSCOPE_PEAKS")

    xdg = tmp_path / "xdg"
    (xdg / "gpuscope").mkdir(parents=True)
    (xdg / "gpuscope" / "peaks.json").write_text(json.dumps({"t4": {"tflops_fp32": 7.5}}))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert load_peaks()["t4"].value("tflops_fp32") == 7.5
    assert match_device("Tesla T4").entry.value("tflops_fp32") == 7.5


def test_missing_default_config_is_fine():
    assert load_peaks()["t4"].value("tflops_fp32") == 8.1


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "top level must be an object"),
    ('{"h100-sxm5": 5}', "must map to an object"),
    ('{"h100-sxm5": {"tflops_bf16": -1}}', "not a non-negative number"),
    ('{"h100-sxm5": {"tflops_bf16_matrix": "fast"}}', "not a non-negative number"),
    ('{"h100-sxm5": {"tflops_bf16_matrx": 900}}', "unknown figure 'tflops_bf16_matrx'"),
    ('{"h100-sxm5": {"tflops_bf16_matrix": {"value": 1, "sauce": "x"}}}', "unknown keys"),
    ('{"My GPU": {"base": "h999"}}', "base 'h999' is not a model key"),
    ('{"My GPU": {"name": "x"}}', "neither a model key"),
    ('{"h100-sxm5": {"host_link": 5}}', "must be text"),
])
def test_bad_config_names_file_and_problem(tmp_path, content, problem):
    cfg = tmp_path / "bad.json"
    cfg.write_text(content)
    with pytest.raises(ProfileError) as err:
        load_peaks(config_path=cfg)
    assert str(cfg) in str(err.value) and problem in str(err.value)


def test_missing_config_named_by_env(tmp_path, monkeypatch):
    missing = tmp_path / "nope.json"
    monkeypatch.setenv("GPUSCOPE_PEAKS", str(missing))
    with pytest.raises(ProfileError, match="does not exist") as err:
        load_peaks()
    assert str(missing) in str(err.value) and "GPUSCOPE_PEAKS" in str(err.value)


def test_bad_per_call_override():
    with pytest.raises(ProfileError, match="GPU peaks override.*unknown figure"):
        load_peaks(extra={"h100-sxm5": {"bandwidth": 1}})
