"""The machine checks behind honest timings: a busy core is seen as busy."""

import subprocess
import sys

from minillm.machine import VECTOR_EXTENSIONS, busy_cores, cpu_flags, describe, vector_extensions


def test_a_spinning_process_shows_as_a_busy_core():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert busy_cores(seconds=1.0) >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def test_the_description_names_the_cores():
    assert describe().endswith(" cores")


def test_vector_extensions_are_the_cpu_flags_of_interest():
    found = vector_extensions()
    assert set(found) == set(VECTOR_EXTENSIONS)
    assert {name for name, present in found.items() if present} <= set(cpu_flags())
