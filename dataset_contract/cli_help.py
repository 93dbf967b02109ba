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
