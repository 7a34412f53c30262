"""Every measured number the notebooks' prose quotes is in their outputs (or declared as a
paper's or a datasheet's constant): see ``tests/notebook_prose.py``."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from notebook_prose import quoted_measurements, unbacked_numbers

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_prose_quotes_only_numbers_the_outputs_hold(path):
    found = unbacked_numbers(path)
    assert not found, "measured numbers in the prose that no output holds (print or glue " \
        "them, or declare a paper's number in a constants comment):\n" + \
        "\n".join(map(str, found))


def test_the_check_finds_what_it_should_and_skips_what_it_should():
    quotes = [n for n, _ in quoted_measurements(
        "Paging ran 5.9 requests per step, 1.2× faster, in 43 s, at 1,142 tokens/s and "
        "41% waste; 16 blocks of 16. Exercise 12.5, §7.2, Figure 2, torch 2.13.0, "
        "`x = 3.5`, $0.5$, [link](https://a.b/1.5%).")]
    assert quotes == ["5.9", "1.2", "43", "1,142", "41"]


def test_a_number_is_backed_by_an_output_that_rounds_to_it(tmp_path):
    notebook = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(waste)")
    code.outputs = [nbformat.v4.new_output("stream", text="waste: 41.6%, speed 1,142.3\n")]
    notebook.cells = [code, nbformat.v4.new_markdown_cell(
        "About 42% waste at 1,142 tokens/s, not 33% or 2.5×.\n"
        "<!-- constants: 96.3% (Kwon et al. 2023) -->\nThe paper: 96.3%.")]
    path = tmp_path / "01_example.ipynb"
    nbformat.write(notebook, path)
    assert [u.quote for u in unbacked_numbers(path)] == ["33", "2.5"]
