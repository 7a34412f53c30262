"""The machine checks behind honest timings: a busy core is seen as busy."""

import subprocess
import sys

from minillm.machine import busy_cores, describe


def test_a_spinning_process_shows_as_a_busy_core():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert busy_cores(seconds=1.0) >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def test_the_description_names_the_cores():
    assert describe().endswith(" cores")
