"""The GPU clock sampler of the benchmarks' orchestrator, against a stand-in ``nvidia-smi``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks.common.gpu_clocks import GpuClocks, page_cache_mb, parse_sample

LINE = "1980, 2619, 350.5, 45, 87, 5, 16, 0x0000000000000004"


def _fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_line_parses_and_a_bad_one_does_not():
    assert parse_sample(LINE) == {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "power_w": 350.5, "temp_c": 45.0, "util": 87.0,
                                  "pcie_gen": 5, "pcie_width": 16, "reasons": 4}  # fmt: skip
    assert parse_sample("[N/A], 2619, 350.5, 45, 87, 5, 16, 0x0") is None and parse_sample("1980, 2619") is None
    vm = parse_sample("1980, 2619, 350.5, 45, 87, [N/A], [N/A], 0x0")  # a link the VM does not show
    assert vm is not None and vm["pcie_gen"] is None and vm["pcie_width"] is None


def test_the_page_cache_is_read_from_meminfo(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263824084 kB\nDirty:            2048000 kB\nWriteback:         10240 kB\n")
    assert page_cache_mb(str(meminfo)) == {"dirty_mb": 2000.0, "writeback_mb": 10.0}
    assert page_cache_mb(str(tmp_path / "none")) == {"dirty_mb": None, "writeback_mb": None}


def test_samples_inside_a_window_are_summed_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, f'echo "{LINE}"\n')
    with GpuClocks(every_s=0.02) as clocks:
        t0 = time.time()
        time.sleep(0.3)
        t1 = time.time()
    window = clocks.window(t0, t1)
    assert window["samples"] >= 3 and window["sm_mhz"] == window["sm_mhz_min"] == 1980
    assert window["power_w"] == 350.5 and window["temp_c_max"] == 45 and window["reasons"] == "0x4"
    assert window["pcie_gen_min"] == 5 and window["pcie_width_min"] == 16
    assert window["dirty_mb_max"] is not None and window["writeback_mb_max"] is not None  # this Linux host's
    assert clocks.window(t1 + 10, t1 + 20) == {"samples": 0, "why": "no sample inside the window"}


def test_an_older_driver_gets_the_older_field_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    refuse = 'case "$*" in *clocks_event_reasons*) echo "unknown field" >&2; exit 2;; esac\n'
    _fake_nvidia_smi(tmp_path, monkeypatch, refuse + f'echo "{LINE}"\n')
    with GpuClocks(every_s=0.02) as clocks:
        time.sleep(0.2)
    assert clocks.samples and clocks.problem is None


def test_a_driver_without_the_link_fields_still_gives_its_clocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    refuse = 'case "$*" in *pcie.link*) echo "unknown field" >&2; exit 2;; esac\n'
    _fake_nvidia_smi(tmp_path, monkeypatch, refuse + 'echo "1980, 2619, 350.5, 45, 87, 0x4"\n')
    with GpuClocks(every_s=0.02) as clocks:
        t0 = time.time()
        time.sleep(0.2)
    window = clocks.window(t0, time.time())
    assert clocks.problem is None and window["sm_mhz"] == 1980 and window["reasons"] == "0x4"
    assert window["pcie_gen_min"] is None and window["pcie_width_min"] is None


def test_without_nvidia_smi_or_a_gpu_nothing_is_sampled_and_it_says_why(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    with GpuClocks() as clocks:
        pass
    assert clocks.window(0, time.time()) == {"samples": 0, "why": "nvidia-smi is not on PATH"}
    with GpuClocks(enabled=False) as off:
        pass
    assert off.window(0, time.time())["why"] == "not sampled (no GPU rows)"


def test_a_failing_query_stops_sampling_with_its_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, 'echo "No devices were found"; exit 6\n')
    with GpuClocks(every_s=0.02) as clocks:
        time.sleep(0.1)
    assert clocks.samples == [] and clocks.problem == "nvidia-smi exited 6: No devices were found"


def test_the_e2e_report_names_the_link_and_page_cache_and_reads_older_json():
    from benchmarks.end_to_end.report import _gpu_words

    old = {"samples": 3, "sm_mhz": 1980, "sm_mhz_min": 1980, "mem_mhz": 3201, "power_w": 281.1, "temp_c_max": 41.0,
           "util": 69.6, "reasons": "0x0"}  # fmt: skip  (a results.json from before the fields)
    assert _gpu_words(old).endswith("reasons 0x0")
    new = {**old, "pcie_gen_min": 5, "pcie_width_min": 16, "dirty_mb_max": 2000.0, "writeback_mb_max": 10.0}
    assert _gpu_words(new).endswith("PCIe gen ≥ 5 x16; host page cache dirty ≤ 2000 MB, writeback ≤ 10 MB")
