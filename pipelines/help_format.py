"""How every subcommand's --help reads: each flag with its default. No Beam import (the plain
tools use it too)."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help that shows every flag's default: appended as "(default: X)" unless the help already
    says it; "none" for a flag that is off unless given, "off" for a switch."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{text} (default: {'off' if isinstance(action, argparse._StoreTrueAction) else 'on'})"
        return f"{text} (default: {'none' if action.default is None else '%(default)s'})"
