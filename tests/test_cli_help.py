"""dataset_contract.cli_help.CommandParser: the parser every command uses says a mistake in a few lines,
exit 2, and names the flag a typo meant."""

import pytest

from dataset_contract.cli_help import CommandParser, flag_value


def _parser():
    parser = CommandParser(prog="python -m tool")
    parser.add_argument("--data", required=True, help="the dataset")
    parser.add_argument("--image-size", type=int, default=224, help="pixels")
    parser.add_argument("--epochs", type=int, default=10, help="passes")
    return parser


def _refusal(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and len(err.strip().splitlines()) == 2, err
    assert err.strip().splitlines()[-1] == "(see python -m tool --help)"
    return err


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--epocs", "--epochs"), ("--image_size", "--image-size"), ("--Image-Sise", "--image-size")],
)
def test_an_unknown_flag_names_the_nearest_known_flag(capsys, typo, meant):
    err = _refusal(capsys, ["--data", "d", typo, "3"])
    assert f"python -m tool: error: unknown flag {typo} (did you mean {meant}?)" in err


def test_a_flag_like_no_other_and_a_stray_word_are_named_without_a_guess(capsys):
    err = _refusal(capsys, ["--data", "d", "--colour=red", "stray"])
    assert "unknown flag --colour; unexpected argument 'stray'" in err and "did you mean" not in err


def test_argparses_own_mistakes_come_without_the_usage_block(capsys):
    assert "the following arguments are required: --data" in _refusal(capsys, [])
    assert "argument --epochs: invalid int value: 'ten'" in _refusal(
        capsys, ["--data", "d", "--epochs", "ten"]
    )


def test_help_shows_defaults_but_not_on_a_required_flag():
    text = _parser().format_help()
    assert "(default: 224)" in text and "(default: None)" not in text


def test_parse_known_args_leaves_other_parsers_flags_for_them():
    args, rest = _parser().parse_known_args(["--data", "d", "--runner", "DirectRunner"])
    assert args.data == "d" and rest == ["--runner", "DirectRunner"]


def test_flag_value_reads_both_spellings_and_takes_the_last_as_argparse_does():
    parsed = _parser().parse_args(["--data", "a", "--data=b"])
    assert flag_value(["--data", "a", "--data=b"], "--data") == parsed.data == "b"
    assert flag_value(["--data=a", "--epochs", "3"], "--data") == "a"
    assert flag_value(["--data"], "--data") is None  # no value after it: argparse refuses it, not this
    assert flag_value(["--database", "x"], "--data") is None
