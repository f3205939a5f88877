"""The CLI reference page, written from the argument parsers themselves (docs/gen_cli_reference.py renders it
into the docs at build time), so the documented flags are the flags the commands take."""

import argparse


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.ArgumentParser, str]]:
    """('serve', parser, its help), ('bench throughput', ...), ... depth first, in the order they were registered."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{prefix}{name}", sub, helps.get(name, "")))
                found.extend(subcommands(sub, f"{prefix}{name} "))
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return ""
    if isinstance(action, argparse.BooleanOptionalAction):
        return f"`{'on' if action.default else 'off'}`"
    return f"`{action.default}`"


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    return _cell(text)


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
        rows.append(f"| {name} | {_default(action)} | {_help(action)} |")
    return rows


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """'nvllm serve [options] [model]': argparse's own usage line lists every flag, which the table does."""
    words = [f"nvllm {name}", "[options]"]
    for action in parser._actions:
        if action.option_strings:
            continue
        if isinstance(action, argparse._SubParsersAction):
            words.append("{" + ",".join(action.choices) + "} ...")
        else:
            metavar = action.metavar or action.dest
            words.append(f"[{metavar}]" if action.nargs in ("?", "*") else metavar)
    return " ".join(words)


def _section(name: str, parser: argparse.ArgumentParser, help_text: str) -> list[str]:
    lines = [f"## nvllm {name}", ""]
    if help_text:
        lines += [help_text[0].upper() + help_text[1:] + ".", ""]
    if parser.description and parser.description != help_text:
        lines += [parser.description, ""]
    lines += ["```", _synopsis(name, parser), "```", ""]
    rows = _argument_rows(parser)
    if rows:
        lines += ["| Argument | Default | What it does |", "|---|---|---|", *rows, ""]
    return lines


def markdown(parser: argparse.ArgumentParser) -> str:
    """Every command and subcommand: its usage line and a table of its arguments with defaults and help."""
    lines = ["# CLI reference", "",
             "Every `nvllm` command and its flags, generated from the command's own argument parser "
             "(`nvllm COMMAND --help` prints the same).", ""]
    for name, sub, help_text in subcommands(parser):
        lines += _section(name, sub, help_text)
    return "\n".join(lines)
