"""The Python benchmarks' per-CPU sections (crates/lssa-py/bench_sections.py), the layout of the Rust ones."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_sections as s  # noqa: E402


def run(cpu, ms):
    return f"# Decoding\n\n- CPU: {cpu}; threads: 2\n\n## Table\n\n| T | ms |\n|---|---|\n| 512 | {ms} |\n"


def test_a_run_replaces_its_own_cpus_section_and_keeps_the_others():
    amd, intel = "AMD EPYC (2 logical CPUs, AVX-512)", "Intel(R) Xeon(R) (2 logical CPUs, AVX-512)"
    one = s.merge_markdown(run(amd, "7.27"), intel, run(intel, "9.10"))
    assert one.startswith("# Decoding\n\n") and one.count(s.SECTION) == 2
    assert f"{s.SECTION}{amd}" in one and "| 512 | 7.27 |" in one
    assert "### Table" in one and "\n## Table" not in one
    assert one.index(amd) < one.index(intel)
    two = s.merge_markdown(one, intel, run(intel, "8.00"))
    assert "| 512 | 8.00 |" in two and "| 512 | 9.10 |" not in two and "| 512 | 7.27 |" in two
    assert s.merge_markdown(two, intel, run(intel, "8.00")) == two


def test_the_json_keeps_a_report_per_cpu():
    one = json.loads(s.merge_json(json.dumps({"config": {}, "cells": {"a": 1}}), "Intel", {"cells": {"a": 2}}))
    assert one["per_cpu"]["unknown CPU"]["cells"]["a"] == 1 and one["per_cpu"]["Intel"]["cells"]["a"] == 2
    two = json.loads(s.merge_json(json.dumps(one), "Intel", {"cells": {"a": 3}}))
    assert two["per_cpu"]["Intel"]["cells"]["a"] == 3 and len(two["per_cpu"]) == 2


def test_write_keeps_an_old_files_run_under_the_cpu_its_markdown_names(tmp_path):
    md = tmp_path / "decode-cpu.md"
    md.write_text(run("AMD EPYC (2 logical CPUs)", "7.27"))
    (tmp_path / "decode-cpu.json").write_text(json.dumps({"cells": {"a": 1}}))
    s.write(str(md), "Intel (2 logical CPUs, AVX-512)", run("Intel", "9.10"), {"cells": {"a": 2}})
    js = json.loads((tmp_path / "decode-cpu.json").read_text())
    assert sorted(js["per_cpu"]) == ["AMD EPYC (2 logical CPUs)", "Intel (2 logical CPUs, AVX-512)"]
    assert md.read_text().count(s.SECTION) == 2


def test_the_cpu_key_names_cores_and_simd():
    key = s.cpu_key()
    assert f"({os.cpu_count()} logical CPUs, " in key and key.endswith(("AVX-512)", "AVX2+FMA)", "no AVX2)"))
