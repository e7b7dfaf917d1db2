"""JSON profiles are recognised by their content: a UTF-8 BOM and any leading whitespace (up to a
cap, with a clear error beyond it) are accepted before the document's first '{' or '['."""

from __future__ import annotations

import gzip

import pytest

from gpuscope.fixtures.scenario import ApiCall, Device, Kernel, Process, Scenario, Thread
from gpuscope.fixtures.writers import kineto
from gpuscope.tools.model.detect import JSON_LEAD_MAX, detect
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def body(tmp_path_factory) -> bytes:
    s = Scenario("json_lead", [Device(0)], [Process(1, "python")], [Thread(1, 2, "python")])
    for i in range(5):
        s.api_calls.append(ApiCall(1, 2, 1_000 * i, 1_000 * i + 300, "cudaLaunchKernel", i + 1))
        s.kernels.append(Kernel(0, 7, 10_000 + 2_000 * i, 11_000 + 2_000 * i, f"k{i}", f"k{i}", 1, i + 1))
    return kineto.write(s, tmp_path_factory.mktemp("lead") / "t.json").read_bytes()


@pytest.mark.parametrize("lead", [BOM, b" " * 65, b"\r\n\t " * 40, BOM + b"\n" * (2 << 20)], ids=["bom", "65-spaces", "mixed", "bom+2MiB"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_bom_and_leading_whitespace_are_accepted(body, lead, gz, tmp_path):
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    data = gzip.compress(lead + body) if gz else lead + body
    path.write_bytes(data)
    assert detect(path).format == "kineto" and detect(path).compressed == gz
    trace = load_trace(path)
    assert trace.count("kernels") == 5 and trace.count("api_calls") == 5 and trace.count("data_issues") == 0
    trace.close()
    assert path.read_bytes() == data  # the profile is never modified


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_whitespace_only_and_endless_whitespace_are_refused_clearly(body, gz, tmp_path):
    def write(data: bytes):
        path = tmp_path / ("t.json.gz" if gz else "t.json")
        path.write_bytes(gzip.compress(data) if gz else data)
        return path

    with pytest.raises(ProfileError, match="holds nothing but whitespace"):
        detect(write(BOM + b" \n" * 1000))
    with pytest.raises(ProfileError, match=f"more than {JSON_LEAD_MAX >> 20} MiB of whitespace"):
        detect(write(b" " * (JSON_LEAD_MAX + (1 << 20)) + body))


def test_other_text_is_still_not_a_profile(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(BOM + b"  hello")
    with pytest.raises(ProfileError, match="not a profile gpuscope can read"):
        detect(path)
