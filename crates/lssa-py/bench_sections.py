"""Benchmark files that keep one section per CPU model, as the Rust benchmarks' tables do
(``benches/src/sections.rs``, the same layout): a run replaces its own CPU's ``## CPU: <model>``
section of the Markdown file and its entry of the JSON file (``{"per_cpu": {model: report}}``) and
keeps every other CPU's; a file of the older one-run layout becomes the section of the CPU its
``- CPU: `` line names. Standard library only."""
import json
import os

SECTION = "## CPU: "
ABOUT = ("One section per CPU model seen, each from one interleaved run on that machine; a new run replaces "
         "its own CPU's section and keeps the others.")


def cpu_key():
    """The CPU's name as the Rust benchmarks give it: model name, logical CPUs, widest SIMD."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else "AVX2+FMA" if {"avx2", "fma"} <= flags else "no AVX2"
    return f"{model} ({os.cpu_count()} logical CPUs, {simd})"


def _split_title(md):
    first, _, rest = md.partition("\n")
    return (first, rest) if first.startswith("# ") else ("# Benchmark", md)


def _demote(md):
    out, fenced = [], False
    for line in md.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and line.startswith("#") else line)
    return "\n".join(out)


def _sections(text):
    lines = text.split("\n")
    if not any(l.startswith(SECTION) for l in lines):
        cpu = next((l[len("- CPU: "):] for l in lines if l.startswith("- CPU: ")), "unknown CPU")
        return {cpu.split(";")[0].strip(): _demote(_split_title(text)[1])}
    sections, name, body = {}, None, []
    for line in lines:
        if line.startswith(SECTION):
            if name is not None:
                sections[name] = "\n".join(body)
            name, body = line[len(SECTION):].strip(), []
        elif name is not None:
            body.append(line)
    if name is not None:
        sections[name] = "\n".join(body)
    return sections


def merge_markdown(existing, cpu, run_md):
    title, body = _split_title(run_md)
    sections = _sections(existing) if existing is not None else {}
    sections[cpu] = _demote(body)
    out = f"{title}\n\n{ABOUT}\n"
    for name in sorted(sections):
        out += f"\n{SECTION}{name}\n\n{sections[name].strip()}\n"
    return out


def _legacy_cpu(md):
    """The CPU a Markdown file of the one-run layout names, if it is one."""
    if md is None or any(l.startswith(SECTION) for l in md.split("\n")):
        return None
    return next(iter(_sections(md)))


def merge_json(existing, cpu, run, legacy_cpu=None):
    """``existing`` with ``cpu``'s entry replaced by ``run``; a JSON file of the one-run layout that does not
    name its CPU is kept under ``legacy_cpu`` (the CPU its Markdown file names)."""
    per_cpu = {}
    if existing is not None:
        old = json.loads(existing)
        if isinstance(old.get("per_cpu"), dict):
            per_cpu.update(old["per_cpu"])
        else:
            per_cpu[(old.get("header") or {}).get("cpu") or old.get("cpu") or legacy_cpu or "unknown CPU"] = old
    per_cpu[cpu] = run
    return json.dumps({"per_cpu": dict(sorted(per_cpu.items()))}, indent=1) + "\n"


def write(md_path, cpu, run_md, run_json):
    """Merges a run into ``md_path`` and the ``.json`` beside it, and writes both."""
    json_path = os.path.splitext(md_path)[0] + ".json"

    def read(p):
        try:
            with open(p) as f:
                return f.read()
        except FileNotFoundError:
            return None

    old_md = read(md_path)
    md = merge_markdown(old_md, cpu, run_md)
    js = merge_json(read(json_path), cpu, run_json, legacy_cpu=_legacy_cpu(old_md))
    for path, text in ((md_path, md), (json_path, js)):
        with open(path, "w") as f:
            f.write(text)
