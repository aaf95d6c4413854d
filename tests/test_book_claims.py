"""The numbers that book/modern-decoder.md quotes from its experiments are checked against the data.

The chapter's hidden cells call ``claim(text, value)`` for each number of its prose about its experiments, so
a rerun that moves a number stops the book build. These tests check that the helper fails on a moved number,
that the chapter's checks fail when the data move (by running its cells on an altered copy of a CSV), and
that every decimal number and every number written with thousands separators in the experiment sections'
prose is claimed, or named below with the reason it needs no claim.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "modern-decoder.md"
DATA = ROOT / "book" / "data"
CELL = re.compile(r"^(`{3,4})\{code-cell\} ipython3\n(.*?)^\1$", flags=re.S | re.M)
NUMBER = re.compile(r"[−+-]?\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+")  # decimals and 1,234

# The prose about the chapter's experiments: (first line, the line that ends it).
EXPERIMENT_SECTIONS = [
    ("(modern-ablation)=", "(modern-context-extension)="),
    ("### Measured on a tiny model", "(modern-loading)="),
    ("How large the growth can be, and what each fix does", "### Mixture of experts"),
    ("## Summary", "## Check your understanding"),
    ("```{admonition} Expected outcome of exercise 3", "```{admonition} Expected outcome of exercise 6"),
]
# Decimal numbers in those sections that need no claim(): a phrase around each, and why.
NOT_CLAIMED = {
    "within 0.01 nats of the best possible loss": "an inequality, asserted in the context-extension checks",
    "within 0.01 nats of the floor": "the same inequality",
    "all\nwithin 0.01 nats)": "an inequality, asserted in the stability checks",
    "end above 2.7 nats": "a threshold; the count of seeds above it is asserted",
    "within 0.003 nats of the others": "an inequality, asserted after exercise 5",
    "Llama 3.1": "a model's name",
    "multiplies by 1.3 (14,336)": "Llama 3's published FFN multiplier and width, not an experiment",
    "up (11,008)": "Llama 2's published FFN width",
    "1,000 steps": "Chen et al.'s fine-tuning, cited",
}


def code_cells(text: str) -> list[str]:
    return [match.group(2) for match in CELL.finditer(text)]


def claim_helper():
    """The chapter's ``claim``, from the cell that defines it."""
    (source,) = [cell for cell in code_cells(CHAPTER.read_text()) if "def claim(" in cell]
    namespace: dict = {}
    exec("\n".join(line for line in source.splitlines() if not line.startswith(":tags:")), namespace)
    return namespace["claim"]


@pytest.mark.parametrize("text, value", [
    ("0.116 ± 0.041", (0.1161, 0.0409)),
    ("−0.007 ± 0.026", (-0.0071, 0.0262)),
    ("0.000 ± 0.004", (-0.0002, 0.0041)),  # a rounded zero has no sign
    ("+0.26 ± 0.14", (0.2583, 0.1424)),
    ("1,320", 1320),
    ("11", 10.998),
])
def test_claim_accepts_the_number_the_text_shows(text, value):
    claim_helper()(text, value)


@pytest.mark.parametrize("text, value", [
    ("0.116 ± 0.041", (0.1175, 0.041)),  # the mean moved
    ("0.116 ± 0.041", (0.116, 0.043)),   # the interval moved
    ("+0.26", -0.26),                    # the sign
    ("−0.007", 0.007),
    ("1,320", 1321),
    ("0.116 ± 0.041", 0.116),            # a pair claimed with one number
])
def test_claim_fails_on_a_number_the_data_do_not_give(text, value):
    with pytest.raises(AssertionError, match="update the text|values"):
        claim_helper()(text, value)


def run_chapter_until(marker: str, data_dir: Path, workdir: Path) -> None:
    """Execute the chapter's code cells, in workdir with ``DATA`` = data_dir, up to the cell containing
    ``marker``, as the book build does (figures closed, tables printed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = code_cells(CHAPTER.read_text())
    last = next(i for i, cell in enumerate(cells) if marker in cell)
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for source in cells[: last + 1]:
            lines = [line for line in source.splitlines() if not line.startswith((":tags:", "%"))]
            exec("\n".join(lines).replace("plt.show()", "plt.close('all')"), namespace)
            namespace["DATA"] = data_dir
    finally:
        os.chdir(cwd)
        plt.close("all")


def altered_data(tmp_path: Path, name: str, row_filter, column: str, shift: float) -> Path:
    """A copy of book/data with ``column`` of the rows of ``name`` that ``row_filter`` picks moved by shift."""
    data = tmp_path / "data"
    shutil.copytree(DATA, data, ignore=shutil.ignore_patterns("*.npz", "*.pt"))
    with (DATA / name).open(newline="") as f:
        rows = list(csv.DictReader(f))
    moved = 0
    for row in rows:
        if row_filter(row):
            row[column] = f"{float(row[column]) + shift:.5f}"
            moved += 1
    assert moved, "the filter picks no row"
    with (data / name).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return data


CASES = {
    # post-LN's loss at 3e-3, seed 0, final: moves "0.116 ± 0.041 nats behind"
    "ablation": ("modern_decoder_ablation.csv", 'claim("0.116 ± 0.041"',
                 lambda r: (r["variant"], r["lr"], r["seed"], r["step"]) == ("post_ln", "0.003", "0", "150"),
                 "eval_loss", 0.05),
    # YaRN fine-tuned at 256 tokens, seed 2: moves "+0.0023 ± 0.0024 against YaRN"
    "context": ("modern_decoder_context.csv", 'claim("+0.0023 ± 0.0024"',
                lambda r: (r["rule"], r["ft_length"], r["seed"]) == ("yarn", "256", "2"), "nll_last", -0.004),
    # QK-norm at 3e-2, seed 1, last step: moves "0.241 ± 0.104 nats below the baseline"
    "stability": ("logit_stability.csv", 'claim("0.241 ± 0.104"',
                  lambda r: (r["variant"], r["lr"], r["seed"], r["step"]) == ("qk_norm", "0.03", "1", "120"),
                  "eval_loss", 0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chapter_checks_pass_on_its_data_and_fail_when_a_run_moves(case, tmp_path):
    name, marker, row_filter, column, shift = CASES[case]
    if not (DATA / name).exists():
        pytest.skip(f"run `make experiments` first ({name})")
    run_chapter_until(marker, DATA, tmp_path)
    with pytest.raises(AssertionError):
        run_chapter_until(marker, altered_data(tmp_path, name, row_filter, column, shift), tmp_path)


def prose_of_experiment_sections(text: str) -> str:
    """The experiment sections without code cells, code blocks and math."""
    parts = []
    for start, end in EXPERIMENT_SECTIONS:
        assert text.count(start) == 1, f"section start {start!r} not found once"
        begin = text.index(start)
        parts.append(text[begin : text.index(end, begin)])
    prose = "\n".join(parts)
    prose = re.sub(r"^(`{3,4})\{code-cell\}.*?^\1$", "", prose, flags=re.S | re.M)
    prose = re.sub(r"\$\$.*?\$\$", "", prose, flags=re.S)
    return re.sub(r"\$[^$]*\$", "", prose)


def test_every_decimal_number_of_the_experiment_prose_is_claimed():
    """Decimals and numbers with thousands separators; small integers (settings) are asserted in the cells."""
    text = CHAPTER.read_text()
    claimed = set()
    for cell in code_cells(text):
        for quoted in re.findall(r'claim\("([^"]+)"', cell):
            claimed.update(part.replace("−", "").lstrip("+-") for part in quoted.split(" ± "))
    prose = prose_of_experiment_sections(text)
    excused = []
    for phrase in NOT_CLAIMED:
        assert phrase in prose, f"NOT_CLAIMED phrase {phrase!r} is no longer in the experiment prose"
        excused += [range(m.start(), m.end()) for m in re.finditer(re.escape(phrase), prose)]
    unchecked = [match.group() for match in NUMBER.finditer(prose)
                 if match.group().replace("−", "").lstrip("+-") not in claimed
                 and not any(match.start() in span for span in excused)]
    assert not unchecked, f"numbers in the prose that no claim() checks: {unchecked}"
