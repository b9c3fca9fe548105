"""The code base stays ruff clean: lint errors fail the suite like any other defect."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "kcms", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
