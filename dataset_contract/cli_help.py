"""The command line every command of the package shares: one parser class, its --help format."""

import argparse
import difflib
import sys


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, True, argparse.SUPPRESS):
            return text
        if action.required or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def group_flags(parser: argparse.ArgumentParser, groups: dict[str, tuple[str, ...]]) -> None:
    """Show the named flags under argument groups in --help, in the given order: {title: (flag, ...)}; a flag
    not named stays under "options". Parsing is unchanged."""
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    earlier_groups = parser._action_groups[2:]  # after positionals and "options"
    for title, flags in groups.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            action = by_flag.get(flag)
            if action is None:
                continue
            for existing in parser._action_groups:
                if action in existing._group_actions and existing is not group:
                    existing._group_actions.remove(action)
            group._group_actions.append(action)
            if action.help is None and action.default not in (None, False, argparse.SUPPRESS):
                action.help = "default: %(default)s"  # argparse prints nothing of a flag without help
    # Groups the parser already had (e.g. train's "training recipe") come after the ones named here.
    for group in earlier_groups:
        parser._action_groups.remove(group)
        parser._action_groups.append(group)


def _normal_flag(flag: str) -> str:
    # --image_size for --image-size, --Runner for --runner: compared with '-' and '_' alike.
    return flag.replace("_", "-").lower()


def did_you_mean(word: str, candidates) -> str:
    """' (did you mean --x?)' for the closest of `candidates` to the flag `word`, or ''."""

    by_normal = {_normal_flag(candidate): candidate for candidate in candidates}
    close = difflib.get_close_matches(_normal_flag(word), list(by_normal), n=1, cutoff=0.75)
    return f" (did you mean {by_normal[close[0]]}?)" if close else ""


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (`--flag VALUE` or `--flag=VALUE`), or None; given twice, the last, as
    argparse takes it."""
    value = None
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif word.startswith(f"{flag}="):
            value = word.split("=", 1)[1]
    return value


def unknown_words(words: list[str]) -> list[str]:
    """The words argparse left over, as a user typed them: flags (without '=value'), and stray values.

    A value right after an unknown flag (`--image-szie 64`) belongs to it and is not listed again.
    """
    unknown, previous_was_flag = [], False
    for word in words:
        if word.startswith("-"):
            unknown.append(word.split("=", 1)[0])
            previous_was_flag = "=" not in word
        elif not previous_was_flag:
            unknown.append(word)
        else:
            previous_was_flag = False
    return unknown


class CommandParser(argparse.ArgumentParser):
    """The parser of every command: argparse, with mistakes said in a few lines and exit 2 (an unknown flag
    names the nearest known one; `refuse(message)` for later checks; `unknown_flags_problem` for leftovers)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def flags(self) -> list[str]:
        """Every long flag this parser takes."""
        return [flag for flag in self._option_string_actions if flag.startswith("--")]

    def unknown_flags_problem(self, words: list[str], more_flags=()) -> str | None:
        """What is wrong with the words no flag took: each unknown flag with the nearest of this parser's
        flags and `more_flags`, each stray word; or None when `words` is empty."""
        known = self.flags() + list(more_flags)
        problems = [
            f"unknown flag {word}{did_you_mean(word, known)}"
            if word.startswith("-")
            else f"unexpected argument {word!r}"
            for word in unknown_words(words)
        ]
        return "; ".join(problems) or None

    def mixed_up_flags_problem(self, words: list[str]) -> str | None:
        """The unknown flags among `words` that are this parser's own with dashes and underscores (or
        case) mixed up (`--image_size` for `--image-size`), said as unknown_flags_problem says them; None
        when there is none. No other parser's flag can be one of them, so a command that passes unknown
        flags on (to Beam) can refuse these before it imports that parser."""
        ours = {_normal_flag(flag) for flag in self.flags()}
        mixed_up = [
            word
            for word in unknown_words(words)
            if word.startswith("--") and _normal_flag(word) in ours and word not in self.flags()
        ]
        return self.unknown_flags_problem(mixed_up) if mixed_up else None

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        problem = self.unknown_flags_problem(extras)
        if problem:
            self.refuse(problem)
        return parsed

    def error(self, message: str):
        self.refuse(message)

    def refuse(self, message: str):
        """Exit 2 with `message`: a user's mistake, said in a line or two, without a traceback."""
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        print(f"(see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
