"""benchmarks/measure.py's in-process half: a block's wall and CPU time, the peak-RSS mark, scaling ratios;
and the option the stage 1 benchmarks share."""

import os
import subprocess
import sys
import time

import pytest

from benchmarks import measure, stage1_memory, stage1_vs_handwritten


def test_timed_gives_the_blocks_wall_and_cpu_seconds():
    with measure.timed() as sleeping:
        time.sleep(0.2)
    with measure.timed() as spinning:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
    assert sleeping.wall_seconds >= 0.2 and sleeping.cpu_seconds < 0.1
    assert spinning.cpu_seconds >= 0.2


def test_the_peak_rss_mark_starts_over_from_the_current_rss():
    block = bytearray(64 << 20)
    block[::4096] = b"\x01" * len(range(0, 64 << 20, 4096))  # every page touched: resident
    del block  # the peak stays at least this much above what is resident now
    assert measure.status_bytes("VmHWM") >= measure.status_bytes("VmRSS") + (32 << 20)
    assert measure.reset_peak_rss()
    assert measure.status_bytes("VmHWM") < measure.status_bytes("VmRSS") + (32 << 20)


def test_scaling_ratios_pair_each_repeats_runs_and_select_by_field():
    runs = [
        {"repeat": 0, "factor": 1, "peak": 100, "contender": "a"},
        {"repeat": 0, "factor": 4, "peak": 130, "contender": "a"},
        {"repeat": 1, "factor": 1, "peak": 200, "contender": "a"},
        {"repeat": 1, "factor": 4, "peak": 220, "contender": "a"},
        {"repeat": 0, "factor": 1, "peak": 10, "contender": "b"},
        {"repeat": 0, "factor": 4, "peak": 40, "contender": "b"},
    ]
    assert measure.scaling_ratios(runs[:4], "peak", 4) == pytest.approx([1.3, 1.1])
    assert measure.scaling_ratios(runs[4:], "peak", 4, contender="b") == [4.0]


def stage1_arg_help(module: str) -> str:
    """The --stage1-arg paragraph of `python -m benchmarks.MODULE --help`, as a user sees it."""
    env = {**os.environ, "COLUMNS": "100"}
    text = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paragraph = text[text.index("  --stage1-arg ARG") :]
    return paragraph.split("\n  -")[0]


def test_both_stage1_benchmarks_show_and_parse_the_one_stage1_arg_option():
    # One declaration in the harness: the same help in both --help texts, the same words in args.stage1_args.
    shown = {module: stage1_arg_help(module) for module in ("stage1_memory", "stage1_vs_handwritten")}
    assert shown["stage1_memory"] == shown["stage1_vs_handwritten"], shown
    assert "--in-process-below" in shown["stage1_memory"] and "--near-" in shown["stage1_memory"]
    for module in (stage1_memory, stage1_vs_handwritten):
        args = module.build_parser().parse_args(["--stage1-arg=--near-duplicates", "--stage1-arg=off"])
        assert args.stage1_args == ["--near-duplicates", "off"]
        assert module.build_parser().parse_args([]).stage1_args == []
