"""bench/gpu_check.sh and the lent-GPU wrapper on a machine without a GPU: the parts table, the output folder, the
packing of what comes back. Only the `env` part runs (it needs no GPU)."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args, out=None):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PYTHON"] = sys.executable
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_unknown_part_is_refused_with_the_list_of_parts(tmp_path):
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(tmp_path / "set"), "benchmarks"])
    assert r.returncode == 2
    assert "unknown part 'benchmarks'" in r.stderr and "fused" in r.stderr and "engine" in r.stderr
    assert not (tmp_path / "set").exists()


def test_a_folder_with_files_is_not_written_into(tmp_path):
    (tmp_path / "kernels.json").write_text("{}")
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(tmp_path), "env"])
    assert r.returncode == 2 and "not empty" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels.json"]


def test_env_part_writes_its_log_summary_and_run_record(tmp_path):
    out = tmp_path / "set"
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(out), "env"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / "env.log").read_text())["eagle_triton"]
    assert "--- env: rc=0" in (out / "summary.txt").read_text()
    run = json.loads((out / "run.json").read_text())
    assert run["parts"] == ["env"] and run["command"].endswith("env") and run["date"]


def test_lent_gpu_wrapper_packs_the_results_into_out(tmp_path):
    r = _run(["bash", "bench/lent_gpu/run.sh", "--", "bash", "bench/gpu_check.sh", "env"], out=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.tar.gz", "summary.txt"]
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"env.log", "run.json", "summary.txt"} <= names


def test_lent_gpu_wrapper_needs_out():
    r = _run(["bash", "bench/lent_gpu/run.sh", "--", "true"])
    assert r.returncode != 0 and "OUT is not set" in r.stderr


def test_heads_part_needs_old_head_and_says_so(tmp_path):
    out = tmp_path / "set"
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(out), "heads"])
    assert r.returncode == 1
    assert "OLD_HEAD must name a head folder" in (out / "summary.txt").read_text()
    assert not (out / "heads.log").exists()  # nothing ran


def test_ab_part_needs_a_base_and_says_so(tmp_path):
    out = tmp_path / "set"
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(out), "ab"])
    assert r.returncode == 1
    assert "AB_BASE must name a src folder" in (out / "summary.txt").read_text()


def _ab_libraries():
    """bench/ab_libraries.py as a module (bench/ is not a package)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import ab_libraries
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return ab_libraries


def test_ab_libraries_alternates_the_versions_and_refuses_bad_folders(tmp_path):
    """Round 0 runs base then new, round 1 new then base, each with its own src on PYTHONPATH, every drafter case
    in turn (the profiles first); a base without the package, an output folder with files in it and malformed
    cases are refused before anything runs."""
    base = tmp_path / "base" / "src"
    (base / "eagle_triton").mkdir(parents=True)
    (base / "eagle_triton" / "__init__.py").write_text("")
    r = _run([sys.executable, "bench/ab_libraries.py", "--base", str(base), "--out", str(tmp_path / "ab"),
              "--what", "engine,drafter", "--cases", "llama31-8b:bf16,llama32-1b:fp8", "--profile", "--dry-run"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(": PYTHONPATH")[0] for line in lines] == [
        "drafter llama31-8b:bf16 base profile", "drafter llama31-8b:bf16 new profile",
        "engine base round 0", "engine new round 0",
        "drafter llama31-8b:bf16 base round 0", "drafter llama31-8b:bf16 new round 0",
        "drafter llama32-1b:fp8 base round 0", "drafter llama32-1b:fp8 new round 0",
        "engine new round 1", "engine base round 1",
        "drafter llama31-8b:bf16 new round 1", "drafter llama31-8b:bf16 base round 1",
        "drafter llama32-1b:fp8 new round 1", "drafter llama32-1b:fp8 base round 1"]
    assert f"PYTHONPATH={base}" in lines[0] and f"PYTHONPATH={ROOT / 'src'}" in lines[1]
    assert "--profile" in lines[0] and "--tunings" not in lines[0]
    assert "bench/bench_engine.py --parts b --trees-8b 60/7/10" in lines[2]
    assert ("--weights fp8 --tune-case llama32-1b:60/7/10" in lines[6]
            and "--tunings 0:0:0:0,0:0:0:0:0:16" in lines[6] and "drafter_llama32-1b_fp8_base_0" in lines[6])
    r = _run([sys.executable, "bench/ab_libraries.py", "--base", str(base), "--out", str(tmp_path / "ab"),
              "--what", "drafter", "--cases", "llama31-8b", "--dry-run"])
    assert r.returncode == 2 and "--cases takes shape:weights" in r.stderr
    r = _run([sys.executable, "bench/ab_libraries.py", "--base", str(tmp_path), "--out", str(tmp_path / "ab")])
    assert r.returncode == 2 and "holds no eagle_triton package" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.json").write_text("{}")
    r = _run([sys.executable, "bench/ab_libraries.py", "--base", str(base), "--out", str(tmp_path / "full")])
    assert r.returncode == 2 and "is not empty" in r.stderr
    r = _run([sys.executable, "bench/ab_libraries.py", "--base", str(base), "--out", str(tmp_path / "ab"),
              "--what", "speed"])
    assert r.returncode == 2 and "--what takes" in r.stderr


def test_ab_libraries_reads_the_figures_of_a_committed_run(tmp_path):
    """The engine figures an A/B compares, read from a committed bench_engine.json (session 26, lease E)."""
    import shutil

    ab_libraries = _ab_libraries()
    src = ROOT / "bench/results/session26_2026-11-28/bench_engine_8b_e2_new.json"
    shutil.copy(src, tmp_path / "bench_engine.json")
    got = ab_libraries.figures("engine", tmp_path)
    assert round(got["spec_step_ms"], 3) == 8.403 and round(got["spec_floor_ms"], 3) == 7.343
    assert round(got["plain_ms"], 3) == 5.547 and got["plain_floor_ms"] > 5
    assert ab_libraries.figures("drafter", tmp_path) == {}  # no drafter JSON there


def test_bench_scripts_run_the_library_pythonpath_names(tmp_path):
    """An A/B arm points PYTHONPATH at its version's src: the bench scripts import that version (and record its
    folder), not the repository's; without it they import the repository's. (They used to put the repository's src
    first whatever PYTHONPATH said: both arms of session 26's engine A/Bs ran the same code.) ab_libraries reads the
    folder a run recorded."""
    import shutil

    base = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "eagle_triton", base / "eagle_triton", ignore=shutil.ignore_patterns("assets"))
    code = ("import sys; sys.path.insert(0, 'bench'); import bench_engine, eagle_triton; "
            "print(bench_engine.git_commit()['library_src']); print(eagle_triton.__file__)")
    for pythonpath, want in ((f"{base}{os.pathsep}{ROOT / 'bench'}", base), ("", ROOT / "src")):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        recorded, imported = r.stdout.split()
        assert Path(recorded) == (want / "eagle_triton").resolve()
        assert Path(imported).resolve().parent == (want / "eagle_triton").resolve()
    ab_libraries = _ab_libraries()
    (tmp_path / "fused_drafter.json").write_text(json.dumps({"meta": {"library_src": str(base / "eagle_triton")},
                                                             "rows": []}))
    assert ab_libraries.library_ran("drafter", tmp_path) == str(base / "eagle_triton")
    assert ab_libraries.library_ran("engine", tmp_path) is None  # no engine JSON there


def test_ab_libraries_reads_a_committed_drafter_run(tmp_path):
    """The drafter figures of an A/B, and the library the run imported, read from a committed bench_fused_drafter
    JSON (session 34: batch 1 and 16 at the 8B shape). (Until session 35 ab_libraries looked for ``library_src`` at
    the top of that document, where bench_fused_drafter does not write it, and rejected every drafter run.)"""
    import shutil

    ab_libraries = _ab_libraries()
    src = ROOT / "bench/results/session34_2026-11-28/treeab_8b/treeab_llama31-8b_bf16_new_0.json"
    shutil.copy(src, tmp_path / "fused_drafter.json")
    doc = json.loads(src.read_text())
    assert ab_libraries.library_ran("drafter", tmp_path) == doc["meta"]["library_src"]
    got = ab_libraries.figures("drafter", tmp_path)
    assert round(got["llama31-8b/bf16/60/7/10/b1/0:0:0:0/fused_ms"], 3) == 1.744
    assert round(got["llama31-8b/bf16/60/7/10/b16/0:0:0:0:0:16/fused_ms"], 3) == 7.193
    assert len(got) == 4 and got["llama31-8b/bf16/60/7/10/b1/0:0:0:0/floor_ms"] > 1


def test_treeab_part_needs_a_base_and_says_so(tmp_path):
    out = tmp_path / "set"
    r = _run(["bash", "bench/gpu_check.sh", "--out", str(out), "treeab"])
    assert r.returncode == 1
    assert "AB_BASE must name a src folder" in (out / "summary.txt").read_text()


def test_every_part_is_documented_and_every_documented_part_exists():
    """The header's parts table and the part_<name> functions name the same parts, so that a part added to one is
    not missing from the other (`bash bench/gpu_check.sh mustshow` must do what the header says it does)."""
    text = (ROOT / "bench" / "gpu_check.sh").read_text()
    header = text.split("set -uo pipefail")[0]
    table = header[header.index("# Parts (default"):]
    documented = set(re.findall(r"^#   ([a-z0-9]+)\s", table, re.M))
    defined = set(re.findall(r"^part_([a-z0-9]+)\(\)", text, re.M))
    assert documented == defined, (sorted(documented - defined), sorted(defined - documented))
    assert "mustshow" in defined
