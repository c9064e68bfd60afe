"""The command line of ``python -m milestones``.

    python -m milestones [--color auto|always|never]
    python -m milestones diff OLD NEW [--unified | --stat] [--layout auto|side-by-side|stacked] [--width N]
    python -m milestones diff NEW          # against the milestone just before it

Names are full (``m06_prefix_cache``) or short (``m06``). A bad name, a pair in the wrong order or the same name
twice is refused with one line on stderr and exit status 2; a milestone that does not import, with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import catalog, diff_view, listing
from .changes import ImportFailed, step_changes
from .style import COLOR_CHOICES, Style, terminal_width, wants_colour

PROG = "python -m milestones"
USAGE_ERROR = 2


class Refused(ValueError):
    """A request that cannot be answered as asked; its message is one line for stderr."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="The nanoserve milestones: each one's idea, demo, doc page and measured H200 gain "
                               "(no arguments), or what one adds over another (diff).")
    parser.add_argument("--color", choices=COLOR_CHOICES, default="auto",
                        help="colour: auto (only on a terminal, never with NO_COLOR set), always, never")
    commands = parser.add_subparsers(dest="command", metavar="{list,diff}")
    list_parser = commands.add_parser("list", help="every milestone (the default)")
    list_parser.add_argument("--color", choices=COLOR_CHOICES, default=argparse.SUPPRESS, help="as above")

    diff = commands.add_parser(
        "diff", help="what NEW adds or overrides relative to OLD",
        description="What NEW adds or overrides relative to OLD: new modules, new classes, overridden methods beside "
                    "the ones they replace, new config fields. For a non-adjacent pair, every step in between, "
                    "in order. With one name, the milestone against the one before it.")
    diff.add_argument("old", metavar="OLD", help="the earlier milestone, e.g. m06 or m06_prefix_cache")
    diff.add_argument("new", metavar="NEW", nargs="?", help="the later milestone; leave it out to compare OLD with the "
                                                           "milestone just before it")
    mode = diff.add_mutually_exclusive_group()
    mode.add_argument("--unified", action="store_true",
                      help="a unified diff of each overridden method against the one it replaces")
    mode.add_argument("--stat", action="store_true", help="a one-screen summary: lines added per file, counts")
    diff.add_argument("--layout", choices=diff_view.LAYOUTS, default="auto",
                      help=f"overridden methods side by side or one above the other; auto: side by side from "
                           f"{diff_view.SIDE_BY_SIDE_MIN_WIDTH} columns")
    diff.add_argument("--width", type=int, default=None, help="columns to lay out for (default: the terminal's)")
    diff.add_argument("--color", choices=COLOR_CHOICES, default=argparse.SUPPRESS, help="as for the list")
    return parser


def pair(args: argparse.Namespace, milestones: list[catalog.Milestone]) -> tuple[catalog.Milestone, catalog.Milestone]:
    """The (old, new) pair asked for, checked: known names, old strictly before new."""
    first = catalog.resolve(args.old, milestones)
    if args.new is None:  # one name: that milestone against its predecessor
        index = milestones.index(first)
        if index == 0:
            raise Refused(f"{first.name} is the first milestone: there is nothing before it to compare with")
        return milestones[index - 1], first
    old, new = first, catalog.resolve(args.new, milestones)
    if old == new:
        raise Refused(f"nothing to compare: both names are {old.name}; give two different milestones, "
                      f"e.g. {PROG} diff {milestones[max(0, milestones.index(old) - 1)].key} {old.key}")
    if milestones.index(old) > milestones.index(new):
        raise Refused(f"{old.name} comes after {new.name}: put the earlier one first "
                      f"({PROG} diff {new.key} {old.key})")
    return old, new


def run_diff(args: argparse.Namespace, milestones: list[catalog.Milestone], style: Style) -> list[str]:
    old, new = pair(args, milestones)
    steps = catalog.between(old, new, milestones)
    width = args.width or terminal_width()
    everything, previous = [], old
    for milestone in steps:
        everything.append(step_changes(previous, milestone))
        previous = milestone
    if args.stat:
        return diff_view.stat(everything, width, style)
    lines = diff_view.range_preface(old, steps, style) if len(steps) > 1 and not args.unified else []
    for changes in everything:
        lines += diff_view.unified(changes, style) if args.unified else diff_view.full_view(
            changes, width, args.layout, style)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    style = Style(wants_colour(args.color, sys.stdout))
    milestones = catalog.discover()
    try:
        if not milestones:
            raise Refused(f"no milestone packages (mNN_<idea>/) under {catalog.MILESTONES_DIR}")
        if args.command == "diff":
            if args.width is not None and args.width < 40:
                raise Refused(f"--width must be at least 40 columns, got {args.width}")
            print("\n".join(run_diff(args, milestones, style)).rstrip("\n"))
        else:
            listing.print_listing(milestones, style, sys.stdout)
        sys.stdout.flush()
    except (Refused, catalog.UnknownMilestone) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except ImportFailed as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, and let the interpreter's own flush be silent
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
