"""reference/cli.md: every `kvplan` command, subcommand and option, read from the real argument parsers.

The parsers (`kvplan.cli.build_parser`, each verb's `register`) are walked as argparse holds them: the
subcommands of every `add_subparsers`, and per command its argument groups with each visible option's spellings,
value, default, choices and help (`%(default)s` expanded as `--help` expands it). Options hidden from `--help`
(earlier spellings kept for old scripts) are left out here too.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from kvplan.reference.cells import code, prose, table, value

DEFAULT_IN_HELP = re.compile(r"\bdefault[: ]")


def commands(parser: argparse.ArgumentParser, depth: int = 0
             ) -> Iterator[tuple[str, argparse.ArgumentParser, str, int]]:
    """(prog, parser, one-line help, depth) of every subcommand below `parser`, depth first in the CLI's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield sub.prog, sub, helps.get(name, ""), depth
                yield from commands(sub, depth + 1)


def visible(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)


def metavar(action: argparse.Action) -> str:
    """The value an option takes, as `--help` shows it ('' for a switch)."""
    if action.nargs == 0:
        return ""
    if isinstance(action.metavar, tuple):  # one name per value: `--window START_S END_S`
        return " ".join(action.metavar)
    if action.metavar is not None:
        name = action.metavar
    elif action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest.upper() if action.option_strings else action.dest
    if isinstance(action.nargs, int):
        return " ".join([name] * action.nargs)
    shapes = {"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}
    return shapes.get(action.nargs or "", name)


def value_cell(action: argparse.Action) -> str:
    """The value column: each choice as its own code span (a table cell can wrap between them), else the
    metavar."""
    shown = metavar(action)
    if not action.option_strings or not shown:
        return ""
    choices = action.choices
    if choices is None and isinstance(action.metavar, str) and action.metavar[:1] + action.metavar[-1:] == "{}":
        choices = action.metavar[1:-1].split(",")  # a settings flag checks its choices itself (settings_cli)
    if choices is not None:
        return ", ".join(code(c) for c in choices) + (" ..." if action.nargs in ("+", "*") else "")
    return code(shown)


def default_text(action: argparse.Action) -> str:
    """The default worth stating: not for a switch that is off, nothing set, or a help/version action."""
    default = action.default
    if (default is None or default == argparse.SUPPRESS or (action.nargs == 0 and default is False)
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)):
        return ""
    if isinstance(default, Path):
        default = str(default)
    return code(value(default))


def usage(parser: argparse.ArgumentParser) -> str:
    """`kvplan simulate [options] --trace TRACE ...`: the command, the required options, then the positionals."""
    actions = [a for a in parser._actions if visible(a) or isinstance(a, argparse._SubParsersAction)]
    optional = any(a.option_strings and not a.required for a in actions)
    words = [parser.prog, *(["[options]"] if optional else [])]
    words += [f"{a.option_strings[0]} {metavar(a)}".strip() for a in actions if a.option_strings and a.required]
    words += [metavar(a) if not isinstance(a, argparse._SubParsersAction) else f"{a.metavar or 'COMMAND'} ..."
              for a in actions if not a.option_strings]
    return " ".join(words)


def option_rows(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> list[list[str]]:
    """[spellings, value, help] per visible option of `group` (a positional: [name, '', help]); the help ends
    with the default, as ArgumentDefaultsHelpFormatter would show it, unless it states it already."""
    formatter = parser._get_formatter()
    rows = []
    for action in group._group_actions:
        if not visible(action) or isinstance(action, argparse._HelpAction):  # every command has -h
            continue
        shown = formatter._expand_help(action) if action.help else ""
        default = default_text(action)
        if default and not DEFAULT_IN_HELP.search(shown):  # `(default: 16)`: the settings' flags say it already
            shown = f"{shown} (default: {default})".strip()
        if action.option_strings:
            rows.append([", ".join(code(o) for o in action.option_strings), value_cell(action), shown])
        else:
            choices = ", ".join(code(c) for c in action.choices) if action.choices is not None else ""
            rows.append([code(metavar(action)), "", f"{shown} (one of {choices})" if choices else shown])
    return rows


def command_section(prog: str, parser: argparse.ArgumentParser, summary: str, depth: int) -> list[str]:
    lines = [f"{'#' * (depth + 2)} {prog}", ""]
    if summary:
        lines += [f"{summary[:1].upper()}{summary[1:]}.", ""]
    lines += ["```text", usage(parser), "```", ""]
    if parser.description:
        lines += [prose(parser.description), ""]
    subs = [(p, s, h) for p, s, h, d in commands(parser) if d == 0]
    if subs:
        lines += table(["subcommand", "what it does"], [[f"[{code(p)}](#{anchor(p)})", h] for p, _, h in subs])
        lines.append("")
    for group in parser._action_groups:
        rows = option_rows(parser, group)
        if rows:
            title = group.title or "options"
            lines.append(f"**{title[:1].upper()}{title[1:]}**")
            if all(not a.option_strings for a in group._group_actions):
                lines += ["", *table(["argument", "help"], [[name, shown] for name, _, shown in rows]), ""]
            else:
                lines += ["", *table(["option", "value", "help"], rows), ""]
    return lines


def anchor(prog: str) -> str:
    """The heading id Python-Markdown's toc gives `kvplan trace stats` (and mkdocs-material keeps)."""
    return prog.replace(" ", "-").lower()


def cli_page(parser: argparse.ArgumentParser | None = None) -> str:
    """The page for `parser` (default: the `kvplan` parser as `kvplan` builds it)."""
    from kvplan.cli import build_parser

    parser = build_parser() if parser is None else parser
    found = list(commands(parser))
    flags = sum(1 for _, sub, _, _ in found for a in sub._actions if visible(a) and a.option_strings
                and not isinstance(a, argparse._HelpAction))
    top = [(p, h) for p, _, h, d in found if d == 0]
    lines = ["# Command line", "",
             f"Every `{parser.prog}` command ({len(top)}; {len(found)} with their subcommands) and every option "
             f"they take ({flags} in all), generated from the argument parsers (`kvplan/cli.py` and "
             "`kvplan/commands/`) when the docs are built. `--help` on any command prints the same. The serving "
             "settings' flags are described once more, with their ranges and sides, in "
             "[Settings](settings.md).", "",
             "```text", usage(parser), "```", "",
             *table(["command", "what it does"], [[f"[{code(p)}](#{anchor(p)})", h] for p, h in top]), ""]
    for prog, sub, summary, depth in found:
        lines += command_section(prog, sub, summary, depth)
    return "\n".join(lines).rstrip("\n") + "\n"
