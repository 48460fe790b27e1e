"""Benchmarks never overwrite a file they did not write (bench/results_guard.py), checked before measuring."""

import json

import bench_batch
import pytest
from results_guard import refuse_foreign, written_by


def test_own_files_are_recognised_and_foreign_ones_refused(tmp_path):
    own = {"command": "python3 bench/bench_kernels.py --out x"}
    (tmp_path / "kernels.json").write_text(json.dumps({"meta": own, "rows": []}))
    (tmp_path / "kernels.png").write_bytes(b"\x89PNG")
    (tmp_path / "bench_batch.json").write_text(json.dumps({"benchmark": "bench_batch"}))
    (tmp_path / "notes.json").write_text("[1, 2]")
    (tmp_path / "plot.png").write_bytes(b"\x89PNG")  # no JSON beside it: not a result of ours
    assert written_by(tmp_path / "kernels.json", "bench_kernels")
    assert written_by(tmp_path / "kernels.png", "bench_kernels")  # through the JSON beside it
    assert written_by(tmp_path / "bench_batch.json", "bench_batch")
    assert not written_by(tmp_path / "kernels.json", "bench_batch")
    assert not written_by(tmp_path / "notes.json", "bench_batch")
    refuse_foreign("bench_kernels", tmp_path / "kernels.json", tmp_path / "kernels.png", tmp_path / "absent.json")
    for path, script in ((tmp_path / "notes.json", "bench_batch"), (tmp_path / "plot.png", "bench_kernels"),
                         (tmp_path / "kernels.json", "bench_engine")):
        with pytest.raises(SystemExit, match=f"{path.name} exists and was not written by {script}.py"):
            refuse_foreign(script, path)


def test_a_benchmark_stops_before_measuring_when_its_file_is_someone_elses(tmp_path, monkeypatch):
    (tmp_path / "bench_batch.json").write_text("the user's own file")
    monkeypatch.setattr(bench_batch, "part_smollm2", lambda *a: pytest.fail("measured before checking its output"))
    with pytest.raises(SystemExit, match="bench_batch.json exists and was not written by bench_batch.py"):
        bench_batch.main(["--smoke", "--parts", "smollm2", "--out", str(tmp_path)])
    assert (tmp_path / "bench_batch.json").read_text() == "the user's own file"
