"""Every sub-command has a description and every option a help text, printed as written."""

import argparse

from plexus_tune.cli import build_parser


def _parsers(parser, prog=()):
    """(command words, parser) of the top-level parser and every sub-command, depth first."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, prog + (name,))


def test_every_command_and_option_is_described():
    parsers = list(_parsers(build_parser()))
    leaves = [words for words, p in parsers if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]
    assert len(leaves) >= 20  # predict ... plot importances: the walk reaches every command
    missing = []
    for words, parser in parsers:
        name = " ".join(words) or "plexus-tune"
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):  # the listing: one line per sub-command
                listed = {choice.dest: choice.help for choice in action._choices_actions}
                missing += [f"{name} {sub}: not in the listing" for sub in action.choices if not (listed.get(sub) or "").strip()]
                continue
            label = "/".join(action.option_strings) or action.dest
            if not (action.help or "").strip():
                missing.append(f"{name} {label}: no help")
        text = parser.format_help()
        if "%%" in text or "%(" in text:
            missing.append(f"{name}: help shows a doubled percent sign or a format field")
    assert not missing, "\n".join(missing)
