"""The --help format every command of the package shares: argument groups, each flag's default shown.

argparse's ArgumentDefaultsHelpFormatter appends "(default: X)" to every flag; this one skips the
flags whose help already states its default (the word "default" in it: a default that needs a
sentence, e.g. "one pass over the train split"), switches (store_true: off unless given) and flags
without a default, where "(default: None)" would say nothing. It lives here, in the one module both
stages import, so that `preprocess`, `train` and `pipelines` print their defaults the same way.
"""

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, True, argparse.SUPPRESS):
            return text
        if not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def group_flags(parser: argparse.ArgumentParser, groups: dict[str, tuple[str, ...]]) -> None:
    """Show the named flags under argument groups in --help, in the given order: {title: (flag, ...)}.

    For parsers whose flags are added one by one elsewhere (a module's own build_parser): the grouping is
    stated in one place, and a flag not named stays under "options". Parsing is unchanged: argparse's
    groups only shape the help. (argparse keeps a group's actions in `_group_actions`; there is no public
    way to move one after it was added.)
    """
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    earlier_groups = [group for group in parser._action_groups[2:]]  # after positionals and "options"
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
