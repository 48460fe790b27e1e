"""bench/gpu_check.sh and the lent-GPU wrapper on a machine without a GPU: the parts table, the output folder, the
packing of what comes back. Only the `env` part runs (it needs no GPU)."""

import json
import os
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
