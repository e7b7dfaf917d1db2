"""Hardware peaks: datasheet figures per GPU model (peaks.json), matched to the devices a profile lists.

    from gpuscope.tools.hardware import match_device, peaks_for_device, load_peaks
"""

from .peaks import (
    CONFIDENCES,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    VALUE_FIELDS,
    DevicePeaks,
    Match,
    PeakEntry,
    PeakTable,
    PeakValue,
    default_config_path,
    device_peaks,
    load_peaks,
    match_device,
    normalize_name,
    peaks_for_device,
)

__all__ = [
    "CONFIDENCES", "OPTIONAL_FIELDS", "REQUIRED_FIELDS", "VALUE_FIELDS", "DevicePeaks", "Match", "PeakEntry",
    "PeakTable", "PeakValue", "default_config_path", "device_peaks", "load_peaks", "match_device",
    "normalize_name", "peaks_for_device",
]
