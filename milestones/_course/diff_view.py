"""``StepChanges`` as text for a terminal: the full view, a unified diff of the overrides, or a ``--stat`` summary.

Full view, per step: the idea, new modules, new classes, extended classes (what they override and add), new
config fields, then every overridden method beside the method it replaces. Side by side when the terminal is
wide enough for two columns of code, one above the other otherwise::

    - old line that changed           | + new line that replaced it
      a line both have                |   a line both have
                                      | + a line only the new one has

``-`` marks lines only the replaced method has, ``+`` lines only the new one has (``difflib`` aligns them).
An override that calls ``super().name(...)`` *extends* the old method, whose lines all still run: it is shown
against its own signature and ``super()`` call, so that only what it adds is marked. A retired method (one
that only raises ``NotImplementedError``) is one line: the path the new engine no longer takes.
"""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Iterator
from itertools import zip_longest

from .catalog import Milestone
from .changes import Override, StepChanges
from .style import Style

SIDE_BY_SIDE_MIN_WIDTH = 140  # two 68-column panes: narrower than that, long lines of code wrap too often
LAYOUTS = ("auto", "side-by-side", "stacked")


def _rule(title: str, width: int, style: Style) -> str:
    return style(f"== {title} " + "=" * max(0, width - len(title) - 4), "bold", "magenta")


def _heading(text: str, style: Style) -> str:
    return style(text, "bold")


def range_preface(old: Milestone, steps: list[Milestone], style: Style) -> list[str]:
    """For a non-adjacent pair: the ideas in between, in order."""
    width = max(len(m.name) for m in steps)
    lines = [style(f"{old.name} -> {steps[-1].name}: {len(steps)} steps, each shown against the one before it",
                   "bold")]
    lines += [f"  {style(m.name.ljust(width), 'cyan')}  {m.idea}" for m in steps]
    return lines + [""]


def _align(old: list[str], new: list[str]) -> Iterator[tuple[str | None, str | None, bool]]:
    """Rows ``(old_line, new_line, same)``; a line present on one side only has None on the other."""
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            yield from ((a, b, True) for a, b in zip(old[i1:i2], new[j1:j2]))
        else:
            yield from ((a, b, False) for a, b in zip_longest(old[i1:i2], new[j1:j2]))


def _kept_lines(override: Override) -> list[str]:
    """What an override that calls ``super()`` keeps of the old method as written: its signature and the call
    (the rest of the old method runs inside that call, unchanged)."""
    lines = list(override.new.lines)
    header = next((i for i, line in enumerate(lines) if line.split("#")[0].rstrip().endswith(":")), 0)
    return lines[:header + 1] + [line for line in lines[header + 1:] if f"super().{override.method}(" in line]


def _dedented(override: Override) -> tuple[list[str], list[str]]:
    """Both sides without their common class-body indentation, tabs expanded (``_kept_lines`` as the old side
    of an override that calls ``super()``)."""
    def clean(lines) -> list[str]:
        return textwrap.dedent("\n".join(lines).expandtabs(4)).splitlines()
    old = _kept_lines(override) if override.calls_super else (override.old.lines if override.old else ())
    return clean(old), clean(override.new.lines)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in pieces of at most ``width`` columns, broken at a space where one is near the end; the pieces
    after the first are indented 4 past the line's own indentation, as a continued line of code would be."""
    indent = " " * (len(text) - len(text.lstrip()) + 4)
    pieces, rest = [], text
    while len(rest) > width:
        cut = rest.rfind(" ", int(width * 0.6), width + 1)
        cut = cut if cut > len(indent) else width
        pieces.append(rest[:cut].rstrip())
        rest = indent + rest[cut:].lstrip()
        if len(indent) >= width // 2:  # deeply indented: do not let the indentation eat the pane
            indent = ""
    return pieces + [rest]


def side_by_side(override: Override, width: int, style: Style) -> list[str]:
    """The replaced method on the left, the new one on the right, changed lines marked and coloured."""
    pane = (width - 3) // 2
    old, new = _dedented(override)
    rows = []
    for left, right, same in _align(old, new):
        left_cells = _wrap(left, pane - 2) if left is not None else []
        right_cells = _wrap(right, pane - 2) if right is not None else []
        for k, (a, b) in enumerate(zip_longest(left_cells, right_cells)):
            mark_a = " " if same or a is None or k else "-"
            mark_b = " " if same or b is None or k else "+"
            cell_a = f"{mark_a} {a}".ljust(pane) if a is not None else " " * pane
            cell_b = f"{mark_b} {b}" if b is not None else ""
            rows.append(style(cell_a, *([] if same else ["red"])) + style(" | ", "dim")
                        + style(cell_b, *([] if same else ["green"])))
    return [line.rstrip() for line in rows]


def stacked(override: Override, style: Style) -> list[str]:
    """The replaced method, then the new one, each line marked ``-``/``+`` where the two differ.

    ``override.old`` must have a source (``full_view`` handles generated methods itself).
    """
    old, new = _dedented(override)
    rows = list(_align(old, new))
    out = [style(f"  replaces: {_old_location(override)}", "dim")]
    out += [style(f"- {a}", "red") if not same else f"  {a}" for a, _, same in rows if a is not None]
    out += [style(f"  with: {override.new.location}", "dim")]
    out += [style(f"+ {b}", "green") if not same else f"  {b}" for _, b, same in rows if b is not None]
    return out


def _override_title(override: Override, style: Style) -> str:
    if override.calls_super:
        note = f"  extends {override.replaced}: calls it through super(), so all of it still runs"
    else:
        note = f"  replaces {override.replaced}"
    return style(f"-- {override.class_name}.{override.method}", "bold", "yellow") + style(note, "dim")


def _old_location(override: Override) -> str:
    return f"{override.old.location} (runs in super())" if override.calls_super else override.old.location


def _fit(text: str, room: int) -> str:
    """``text`` cut to ``room`` columns with ``...`` (left whole when there is hardly any room anyway)."""
    return text if len(text) <= room or room < 24 else text[:room - 3].rstrip() + "..."


def full_view(changes: StepChanges, width: int, layout: str, style: Style) -> list[str]:
    """Everything ``changes`` holds, readable top to bottom."""
    new = changes.new
    out = [_rule(f"{new.name} (after {changes.old.name})", width, style), new.idea]
    links = [f"doc: {new.doc_page}" if new.doc_page else "", f"demo: {new.demo_command}" if new.demo_command else ""]
    out += [style("   ".join(filter(None, links)), "dim")] if any(links) else []
    out.append("")

    out.append(_heading("New modules", style))
    path_width = max((len(m.path) for m in changes.modules), default=0)
    for module in changes.modules:
        unit = "line" if module.num_lines == 1 else "lines"
        head = f"  {module.path.ljust(path_width)}  {module.num_lines:4d} {unit:<5}  "
        out.append(head.replace(module.path, style(module.path, "cyan")) + _fit(module.summary, width - len(head)))
        defines = ", ".join(module.classes + tuple(f"{f}()" for f in module.functions))
        if defines:
            out.append(" " * len(head) + style(f"defines {defines}", "dim"))
    out.append("")

    out.append(_heading("New classes", style))
    package = f"milestones/{new.name}/"
    names = [c.name + (f"({', '.join(c.bases)})" if c.bases else "") for c in changes.new_classes]
    name_width = max(map(len, names), default=0)
    locations = [c.location.removeprefix(package) for c in changes.new_classes]
    location_width = max(map(len, locations), default=0)
    out += [f"  {style(name.ljust(name_width), 'cyan')}  {style(where.ljust(location_width), 'dim')}  "
            + _fit(c.summary, width - name_width - location_width - 6)
            for name, where, c in zip(names, locations, changes.new_classes)] or ["  none"]
    out.append("")

    out.append(_heading("Extended classes", style))
    for cls in changes.extended_classes:
        out.append(f"  {style(cls.name, 'cyan')}  {style(cls.location.removeprefix(package), 'dim')}  "
                   f"extends {cls.extends}")
        out.append(f"    overrides    {', '.join(o.method for o in cls.overrides if not o.retired) or '-'}")
        if cls.retired:
            out.append(f"    retires      {', '.join(o.method for o in cls.retired)}")
        out.append(f"    new methods  {', '.join(cls.new_methods) or '-'}")
        if cls.attributes:
            out.append(f"    sets         {'; '.join(cls.attributes)}")
    if not changes.extended_classes:
        out.append("  none")
    out.append("")

    out.append(_heading("New config fields", style))
    if changes.config_class is None:
        out.append(f"  none (EngineConfig is {changes.old.name}'s)")
    else:
        out.append(style(f"  in {changes.config_class}", "dim"))
        out += [f"  {style(f.name, 'cyan')}: {f.type} = {f.default}" + (f"  {f.doc}" if f.doc else "")
                for f in changes.config_fields] or ["  none (its own EngineConfig adds no field)"]
    out.append("")

    overrides = [o for o in changes.overrides if o.retired is None]
    out.append(_heading(f"Overridden methods ({len(overrides)})", style))
    two_columns = layout == "side-by-side" or (layout == "auto" and width >= SIDE_BY_SIDE_MIN_WIDTH)
    for override in overrides:
        out.append(_override_title(override, style))
        if override.old is None:
            out.append(style(f"  (what it replaces has no source: generated, e.g. by @dataclass)  "
                             f"{override.new.location}", "dim"))
            out += [style(f"+ {line}", "green") for line in _dedented(override)[1]]
        elif two_columns:
            pane = (width - 3) // 2
            out.append(style(f"  {_old_location(override)}".ljust(pane) + " | " + f"  {override.new.location}",
                             "dim"))
            out += side_by_side(override, width, style)
        else:
            out += stacked(override, style)
        out.append("")
    retired = [o for o in changes.overrides if o.retired is not None]
    if retired:
        out.append(_heading(f"Retired methods ({len(retired)}): the new engine no longer takes these paths", style))
        out += [_retired_line(o, style) for o in retired] + [""]
    return [line.rstrip() for line in out]


def _retired_line(override: Override, style: Style) -> str:
    return (style(f"-- {override.class_name}.{override.method}", "bold", "yellow")
            + style(f"  retires {override.replaced}: ", "dim") + override.retired)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def unified(changes: StepChanges, style: Style) -> list[str]:
    """A unified diff of every overridden method against the one it replaces, with the files' line numbers."""
    out = [style(f"# {changes.old.name} -> {changes.new.name}: {changes.new.idea}", "bold")]
    for override in changes.overrides:
        if override.retired is not None:
            out.append(f"# {override.class_name}.{override.method} retires {override.replaced}: {override.retired}")
            continue
        old_lines = _kept_lines(override) if override.calls_super else list(override.old.lines) if override.old else []
        new_lines = list(override.new.lines)
        old_path = f"a/{override.old.path}" if override.old else "/dev/null"
        if override.calls_super:  # the old side is what the new method keeps: signature and super() call
            old_path += f" ({override.replaced} runs whole, through super())"
        diff = list(difflib.unified_diff(old_lines, new_lines, old_path, f"b/{override.new.path}",
                                         n=max(len(old_lines), len(new_lines)), lineterm=""))
        if not diff:
            out.append(f"# {override.class_name}.{override.method} extends {override.replaced} and adds no line")
        for line in diff:
            hunk = _HUNK.match(line)
            if hunk:  # difflib counts from the method's first line; shift to the files' own numbers
                a_first = override.new.first_line if override.calls_super else override.old.first_line
                a0 = int(hunk[1]) + (a_first - 1 if override.old else 0)
                b0 = int(hunk[3]) + override.new.first_line - 1
                a_len = f",{hunk[2]}" if hunk[2] is not None else ""
                b_len = f",{hunk[4]}" if hunk[4] is not None else ""
                out.append(style(f"@@ -{a0}{a_len} +{b0}{b_len} @@", "cyan")
                           + f" {override.class_name}.{override.method}")
            elif line.startswith(("---", "+++")):
                out.append(style(line, "bold"))
            elif line.startswith("-"):
                out.append(style(line, "red"))
            elif line.startswith("+"):
                out.append(style(line, "green"))
            else:
                out.append(line)
    if not changes.overrides:
        out.append("# (it overrides no method)")
    return out + [""]


def stat(all_changes: list[StepChanges], width: int, style: Style) -> list[str]:
    """Per step: one summary line, then each file with its lines and a bar, like ``git diff --stat``."""
    longest = max((n for c in all_changes for n in c.file_lines.values()), default=1)
    name_width = max((len(p.split("/", 2)[-1]) for c in all_changes for p in c.file_lines), default=8)
    bar_room = max(10, min(50, width - name_width - 14))
    out = []
    for changes in all_changes:
        num_new_methods = sum(len(c.new_methods) for c in changes.extended_classes)
        num_retired = sum(len(c.retired) for c in changes.extended_classes)
        retired = f" ({num_retired} of them retired)" if num_retired else ""
        out.append(f"{style(changes.new.name, 'bold', 'cyan')} (after {changes.old.key}): "
                   f"{len(changes.file_lines)} files, +{sum(changes.file_lines.values())} lines; "
                   f"classes {len(changes.new_classes)} new, {len(changes.extended_classes)} extended; "
                   f"methods {len(changes.overrides)} overridden{retired}, {num_new_methods} new; "
                   f"config fields +{len(changes.config_fields)}")
        for path, n in changes.file_lines.items():
            bar = "+" * max(1, round(n / longest * bar_room))
            out.append(f"  {path.split('/', 2)[-1].ljust(name_width)} | {n:4d} {style(bar, 'green')}")
    if len(all_changes) > 1:
        files = sum(len(c.file_lines) for c in all_changes)
        lines = sum(n for c in all_changes for n in c.file_lines.values())
        out.append(f"{len(all_changes)} steps: {files} files, +{lines} lines")
    return out
