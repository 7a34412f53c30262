"""`make gpu-check` cannot rot between GPU runs: its correctness rows run here, on the CPU, in
Triton's interpreter (the speed rows skip with a message), and every row must come out right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_its_correctness_rows_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                             "--out", str(out)], capture_output=True, text=True, env=env,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = json.loads(out.read_text())
    results = {(row["check"], row["case"]): row["result"] for row in table["rows"]}
    assert "FAIL" not in results.values()
    checks = {check for check, _ in results}
    assert {"flash attention", "paged decode", "w4a16 matmul", "engine eager on cpu",
            "engine compiled on cpu"} <= checks
    assert results[("speed", "all")] == "skipped"
