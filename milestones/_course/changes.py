"""What one milestone adds or overrides relative to the one before it, read from the code itself.

A milestone never edits an earlier one: it adds modules and classes, and changes behaviour by subclassing.
So its delta is fully described by four lists, which ``step_changes`` computes:

* **new modules**: every file of its package (all of it is new code);
* **new classes**: classes defined there whose ancestors are all outside the course (``KVCache``, ``Scheduler``);
* **extended classes**: classes that subclass an earlier milestone's class, each with the methods it
  overrides, the methods it *retires* (an override that only raises ``NotImplementedError``: the new engine no
  longer takes that path), the methods it adds and the class attributes it sets (``scheduler_class = ...``).
  The method an override replaces is found the way Python finds it: the first class after the new one in its
  MRO whose body defines that name (so m05's ``run`` may replace m04's, and a method m04 never touched is
  replaced straight from m02). An override that calls ``super().name(...)`` *extends* the method: every line
  of the old one still runs;
* **new config fields**: dataclass fields of its ``EngineConfig`` that the previous ``EngineConfig`` lacks.

``ast`` says what is *written* in a class body (a ``@dataclass`` also puts generated ``__init__``/``__eq__``
into the class, which are not the author's); the imported classes give the MRO. Sources are cut from the
files by the ``ast`` line numbers, decorators included.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import REPO_ROOT, Milestone, one_line_summary

COURSE_PREFIX = "milestones.m"


class ImportFailed(RuntimeError):
    """A milestone module that does not import; the message names it and the error."""


@dataclass(frozen=True)
class Source:
    """A method's source as written: where it is and its lines (original indentation, no trailing newlines)."""

    path: str  # relative to the repository root
    first_line: int
    lines: tuple[str, ...]
    owner: str  # e.g. "m01_naive_loop.engine.LLMEngine.generate_one"

    @property
    def location(self) -> str:
        return f"{self.path}:{self.first_line}"


@dataclass(frozen=True)
class Module:
    path: str
    num_lines: int
    summary: str
    classes: tuple[str, ...]
    functions: tuple[str, ...]


@dataclass(frozen=True)
class NewClass:
    name: str
    location: str
    summary: str
    bases: tuple[str, ...]


@dataclass(frozen=True)
class Override:
    class_name: str
    method: str
    new: Source
    old: Source | None  # None when the replaced method has no source of its own (e.g. made by @dataclass)
    replaced: str  # qualified name of what it replaces, e.g. "m01_naive_loop.engine.LLMEngine.generate_one"
    retired: str | None = None  # the NotImplementedError's message, when the override only raises it

    @property
    def calls_super(self) -> bool:
        """Whether the new method runs the one it replaces (``super().name(``): then the old lines still run."""
        return any(f"super().{self.method}(" in line for line in self.new.lines)


@dataclass(frozen=True)
class ExtendedClass:
    name: str
    location: str
    extends: str  # the nearest earlier-milestone ancestor, e.g. "m01_naive_loop.engine.LLMEngine"
    overrides: tuple[Override, ...]
    new_methods: tuple[str, ...]
    attributes: tuple[str, ...] = ()  # class attributes set in its body, as written: 'scheduler_class = Scheduler'

    @property
    def retired(self) -> tuple[Override, ...]:
        return tuple(o for o in self.overrides if o.retired is not None)


@dataclass(frozen=True)
class ConfigField:
    name: str
    type: str
    default: str
    doc: str  # from the config class's docstring ("``name``: ..."), "" when it says nothing


@dataclass
class StepChanges:
    """Everything ``new`` adds over ``old`` (its predecessor)."""

    old: Milestone
    new: Milestone
    modules: list[Module] = field(default_factory=list)
    new_classes: list[NewClass] = field(default_factory=list)
    extended_classes: list[ExtendedClass] = field(default_factory=list)
    config_fields: list[ConfigField] = field(default_factory=list)
    config_class: str | None = None  # "m04_continuous_batching.config.EngineConfig" if new has its own
    file_lines: dict[str, int] = field(default_factory=dict)  # every file of the package -> lines, for --stat

    @property
    def overrides(self) -> list[Override]:
        return [o for cls in self.extended_classes for o in cls.overrides]


def _import(module_name: str):
    try:
        return importlib.import_module(module_name)
    except Exception as error:  # a half-written milestone: say which module and why, not a traceback
        raise ImportFailed(f"cannot import {module_name}: {type(error).__name__}: {error}") from error


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _short(qualified_module: str) -> str:
    """``milestones.m02_kv_cache.engine`` -> ``m02_kv_cache.engine`` (the prefix is the same everywhere)."""
    return qualified_module.removeprefix("milestones.")


def _is_course_class(cls: type, package: str) -> bool:
    """A class from an earlier milestone (not from ``package`` itself, not from torch or the stdlib)."""
    module = cls.__module__
    return module.startswith(COURSE_PREFIX) and not (module == package or module.startswith(package + "."))


def _rel(path: Path | str) -> str:
    return Path(path).resolve().relative_to(REPO_ROOT).as_posix()


def _defined_methods(node: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _class_node(cls: type) -> tuple[ast.ClassDef, Path, list[str]] | None:
    """The ``ast`` node of a top-level class, its file, and the file's lines; None if it cannot be found."""
    try:
        path = Path(inspect.getsourcefile(cls) or "")
    except TypeError:  # a builtin
        return None
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node, path, text.splitlines()
    return None


def _source(node: ast.AST, path: Path, lines: list[str], owner: str) -> Source:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return Source(_rel(path), first, tuple(lines[first - 1:node.end_lineno]), owner)


def _method_source(cls: type, name: str) -> Source | None:
    """The source of ``name`` as written in ``cls``'s own body, or None (generated, or not found)."""
    found = _class_node(cls)
    if found is None:
        return None
    node, path, lines = found
    for method in _defined_methods(node):
        if method.name == name:
            return _source(method, path, lines, f"{_short(cls.__module__)}.{cls.__qualname__}.{name}")
    return None


def _retired_message(method: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The message of ``raise NotImplementedError("...")`` when that (after a docstring) is the whole body."""
    body = method.body[1:] if ast.get_docstring(method) else method.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return None
    call = body[0].exc
    if not (isinstance(call.func, ast.Name) and call.func.id == "NotImplementedError"):
        return None
    return call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else ""


def _attributes(cls: type, node: ast.ClassDef, lines: list[str]) -> tuple[str, ...]:
    """Class attributes given a value in the class body, each as its source on one line; an annotated one (a
    dataclass field) only where it redeclares an inherited one (a new field is listed as a config field)."""
    def inherited(name: str) -> bool:
        return any(name in getattr(base, "__annotations__", {}) for base in cls.__mro__[1:])

    assigned = [n for n in node.body if isinstance(n, ast.Assign) or (
        isinstance(n, ast.AnnAssign) and n.value and isinstance(n.target, ast.Name) and inherited(n.target.id))]
    return tuple(" ".join(line.strip() for line in lines[n.lineno - 1:n.end_lineno]).split("  #")[0]
                 for n in assigned)


def _extended_class(cls: type, node: ast.ClassDef, path: Path, lines: list[str], ancestor: type) -> ExtendedClass:
    overrides, new_methods = [], []
    owner = f"{_short(cls.__module__)}.{cls.__qualname__}"
    for method in _defined_methods(node):
        replaced_cls = next((base for base in cls.__mro__[1:] if method.name in vars(base)), None)
        if replaced_cls is None or not replaced_cls.__module__.startswith("milestones."):
            new_methods.append(method.name)  # nothing of the course's had it (object's __repr__ does not count)
            continue
        overrides.append(Override(
            class_name=cls.__name__, method=method.name,
            new=_source(method, path, lines, f"{owner}.{method.name}"),
            old=_method_source(replaced_cls, method.name),
            replaced=f"{_short(replaced_cls.__module__)}.{replaced_cls.__qualname__}.{method.name}",
            retired=_retired_message(method)))
    return ExtendedClass(cls.__name__, f"{_rel(path)}:{node.lineno}",
                         f"{_short(ancestor.__module__)}.{ancestor.__qualname__}", tuple(overrides),
                         tuple(new_methods), _attributes(cls, node, lines))


def _field_doc(config_cls: type, name: str) -> str:
    """What the config class's docstring says of ``name`` (``"``name``: what it is."``), on one line."""
    doc = inspect.getdoc(config_cls) or ""
    marker = f"``{name}``:"
    if marker not in doc:
        return ""
    return one_line_summary(doc.split(marker, 1)[1])


def _config_fields(old: Milestone, new: Milestone) -> tuple[list[ConfigField], str | None]:
    old_cls, new_cls = _import(old.module).EngineConfig, _import(new.module).EngineConfig
    if new_cls is old_cls:
        return [], None
    known = {f.name for f in dataclasses.fields(old_cls)}
    fields = []
    for f in dataclasses.fields(new_cls):
        if f.name in known:
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = f"{getattr(f.default_factory, '__name__', 'factory')}()"
        else:
            default = "(required)"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        fields.append(ConfigField(f.name, kind, default, _field_doc(new_cls, f.name)))
    return fields, f"{_short(new_cls.__module__)}.{new_cls.__qualname__}"


def step_changes(old: Milestone, new: Milestone) -> StepChanges:
    """What ``new`` adds or overrides over ``old``; raises ``ImportFailed`` if a module does not import."""
    changes = StepChanges(old, new)
    for path in new.source_files():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        changes.file_lines[_rel(path)] = len(lines)
        class_nodes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if path.name != "__init__.py":  # the package docstring is the step's heading already
            changes.modules.append(Module(_rel(path), len(lines), one_line_summary(ast.get_docstring(tree)),
                                          tuple(n.name for n in class_nodes), tuple(functions)))
        if not class_nodes:
            continue
        module = _import(_module_name(path))
        for node in class_nodes:
            cls = getattr(module, node.name, None)
            if not inspect.isclass(cls):
                continue
            ancestors = [base for base in cls.__mro__[1:] if _is_course_class(base, new.module)]
            if ancestors:
                changes.extended_classes.append(_extended_class(cls, node, path, lines, ancestors[0]))
            else:
                bases = tuple(b.__name__ for b in cls.__bases__ if b is not object)
                changes.new_classes.append(NewClass(node.name, f"{_rel(path)}:{node.lineno}",
                                                    one_line_summary(ast.get_docstring(node)), bases))
    changes.config_fields, changes.config_class = _config_fields(old, new)
    return changes
