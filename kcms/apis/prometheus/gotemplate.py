"""The part of Go's ``text/template`` that prometheus-adapter configurations use, with ``<<``/``>>`` delimiters.

prometheus-adapter compiles ``metricsQuery``, ``containerQuery``, ``nodeQuery`` and ``resources.template``
with ``template.New(...).Delims("<<", ">>").Parse(text)``. A configuration written for it must render
here to the same text, so this module follows Go's rules for what it supports:

- text, ``<< pipeline >>`` actions, trim markers ``<<- `` / `` ->>`` (a space must separate them from the
  action, as in Go), comments ``<</* ... */>>``;
- operands: the dot ``.``, field chains ``.A.B``, variables ``$``, ``$x``, ``$x.A``, string literals
  (``"..."`` with Go escapes, and raw ``\\`...\\```), integers, ``true``/``false``/``nil``, parenthesised
  pipelines, and ``|`` pipelines (the previous value is passed as the last argument);
- ``if`` / ``else if`` / ``else`` / ``end``, ``range`` (with ``$v :=`` or ``$i, $v :=``, and ``else``),
  ``with`` (and ``else``), ``$x := pipeline``, ``$x = pipeline``, ``break``/``continue`` inside ``range``;
- functions: ``index``, ``len``, ``print``, ``printf``, ``println``, ``eq``, ``ne``, ``lt``, ``le``, ``gt``,
  ``ge``, ``and``, ``or``, ``not``, ``slice``.

Values print as Go's ``fmt`` ``%v`` prints them: a string as is, a list as ``[a b]``, a map as
``map[k:v]`` with sorted keys, a missing value as ``<no value>``. ``define``/``template``/``block`` and
``html``/``js``/``urlquery`` are not supported: using them is a :class:`TemplateError` at parse time
(prometheus-adapter configurations have no use for them). :func:`parse` raises on any syntax error and
on unknown functions, like Go's parser; :meth:`Template.render` raises on evaluation errors (a field
that does not exist, ``index`` out of range), like Go's ``Execute``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kcms.apis.prometheus.gotemplate_parse import Cmd, Node, Pipe, TemplateError, parse_tree

__all__ = ["Fields", "Template", "TemplateError", "go_format", "parse"]

LEFT, RIGHT = "<<", ">>"

_NO_VALUE = object()  # Go prints a missing map key / nil interface as "<no value>"


# ------------------------------------------------------------------------------------------------
# evaluation


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def go_format(value: Any) -> str:
    """``value`` printed as Go's ``fmt.Sprint`` (``%v``) prints it."""
    if value is _NO_VALUE or value is None:
        return "<no value>" if value is _NO_VALUE else "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value) if value != int(value) or abs(value) >= 1e21 else str(int(value))
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{go_format(k)}:{go_format(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    return str(value)


def _truth(value: Any) -> bool:
    if value is _NO_VALUE or value is None:
        return False
    if isinstance(value, (str, list, tuple, Mapping, bool, int, float)):
        return bool(value)
    return True


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        if name in value:
            return value[name]
        if getattr(value, "strict", False):
            raise TemplateError(f"can't evaluate field {name}")
        return _NO_VALUE
    raise TemplateError(f"can't evaluate field {name} in type {_go_type(value)}")


def _go_type(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "[]string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return type(value).__name__


class Fields(dict):  # noqa: FURB189 - a dict whose missing keys are errors, like a Go struct's fields
    """The template's data: a struct (unknown fields are errors), unlike a map (missing keys print
    ``<no value>``)."""

    strict = True


def _printf(fmt: str, *args: Any) -> str:
    out: list[str] = []
    i = n = 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1] if i + 1 < len(fmt) else ""
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if n >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[n]
        n += 1
        if verb in ("v", "s"):
            out.append(go_format(arg))
        elif verb == "d" and isinstance(arg, int) and not isinstance(arg, bool):
            out.append(str(arg))
        elif verb == "q" and isinstance(arg, str):
            from kcms.apis.prometheus.matchers import go_quote  # the one Go-quoting rule

            out.append(go_quote(arg))
        else:
            out.append(f"%!{verb}({_go_type(arg)}={go_format(arg)})")
    if n < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{_go_type(a)}={go_format(a)}" for a in args[n:]) + ")")
    return "".join(out)


def _compare(name: str, a: Any, b: Any) -> bool:
    """Go's ``eq``/``ne``/``lt``/``le``/``gt``/``ge``: basic values only, of one kind (numbers compare
    with numbers); booleans only for ``eq``/``ne``; slices and maps are not comparable."""
    for v in (a, b):
        if not isinstance(v, (str, int, float)) or (isinstance(v, bool) and name not in ("eq", "ne")):
            raise TemplateError(f"error calling {name}: invalid type for comparison")
    numbers = (int, float)
    same = (isinstance(a, bool) == isinstance(b, bool)) and (
        (isinstance(a, str) and isinstance(b, str)) or (isinstance(a, numbers) and isinstance(b, numbers))
    )
    if not same:
        raise TemplateError(f"error calling {name}: incompatible types for comparison")
    return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[name]


def _call(name: str, args: list[Any]) -> Any:
    if name == "index":
        if not args:
            raise TemplateError("wrong number of args for index")
        item = args[0]
        for key in args[1:]:
            if isinstance(item, Mapping):
                item = item.get(key, "" if all(isinstance(v, str) for v in item.values()) else _NO_VALUE)
            elif isinstance(item, (list, tuple, str)) and isinstance(key, int) and not isinstance(key, bool):
                if not 0 <= key < len(item):
                    raise TemplateError(f"error calling index: index out of range: {key}")
                item = item[key]
            else:
                raise TemplateError(f"error calling index: can't index item of type {_go_type(item)}")
        return item
    if name == "slice":
        if not args or not isinstance(args[0], (str, list, tuple)) or len(args) > 3:
            raise TemplateError("error calling slice: wrong arguments")
        bounds = args[1:]
        if not all(isinstance(b, int) and 0 <= b <= len(args[0]) for b in bounds) or bounds != sorted(bounds):
            raise TemplateError("error calling slice: index out of range")
        return args[0][slice(*bounds)] if bounds else args[0]
    if name == "len":
        if len(args) != 1 or not isinstance(args[0], (str, list, tuple, Mapping)):
            raise TemplateError("error calling len: len of this type")
        return len(args[0])
    if name == "print":
        out = []
        for i, a in enumerate(args):
            # Go's Sprint puts spaces between operands when neither is a string
            if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
                out.append(" ")
            out.append(go_format(a))
        return "".join(out)
    if name == "println":
        return " ".join(go_format(a) for a in args) + "\n"
    if name == "printf":
        if not args or not isinstance(args[0], str):
            raise TemplateError("wrong arguments for printf")
        return _printf(args[0], *args[1:])
    if name in ("eq", "ne", "lt", "le", "gt", "ge"):
        if len(args) < 2 or (name != "eq" and len(args) != 2):
            raise TemplateError(f"wrong number of args for {name}")
        if name == "eq":
            return any(_compare("eq", args[0], b) for b in args[1:])
        return _compare(name, args[0], args[1])
    if name == "not":
        if len(args) != 1:
            raise TemplateError("wrong number of args for not")
        return not _truth(args[0])
    if name in ("and", "or"):
        if not args:
            raise TemplateError(f"wrong number of args for {name}")
        for a in args:
            if _truth(a) != (name == "and"):
                return a
        return args[-1]
    raise TemplateError(f'function "{name}" not defined')


class Template:
    """A parsed template; :meth:`render` executes it on a data mapping."""

    def __init__(self, source: str, nodes: list[Node]) -> None:
        self.source = source
        self._nodes = nodes

    def render(self, data: Mapping[str, Any]) -> str:
        out: list[str] = []
        dot = data if isinstance(data, Fields) else Fields(data)
        self._run(self._nodes, dot, [{"$": dot}], out)
        return "".join(out)

    def top_level_fields(self) -> set[str]:
        """The first field names read from the template's data (``.X`` outside ``range``/``with``,
        and ``$.X`` anywhere): what a configuration check compares with the fields that exist."""
        found: set[str] = set()

        def walk_pipe(pipe: Pipe | None, top: bool) -> None:
            if pipe is None:
                return
            for cmd in pipe.cmds:
                for arg in cmd.args:
                    if arg[0] == "field" and top and arg[1]:
                        found.add(arg[1][0])
                    elif arg[0] == "var" and arg[1] == "$" and arg[2]:
                        found.add(arg[2][0])
                    elif arg[0] in ("pipe", "chain"):
                        walk_pipe(arg[1], top)

        def walk(nodes: list[Node], top: bool) -> None:
            for node in nodes:
                walk_pipe(node.pipe, top)
                inner = top and node.kind not in ("range", "with")
                walk(node.body, inner)
                walk(node.orelse, top)

        walk(self._nodes, True)
        return found

    # -- execution

    def _run(self, nodes: list[Node], dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        for node in nodes:
            kind = node.kind
            if kind == "text":
                out.append(node.text)
            elif kind == "action":
                assert node.pipe is not None
                value = self._pipe(node.pipe, dot, scopes)
                if not node.pipe.decl:
                    out.append(go_format(value))
            elif kind in ("if", "with"):
                assert node.pipe is not None
                # one scope to the structure's end: a variable the condition declares is seen by
                # both branches, as in Go
                scopes.append({})
                try:
                    value = self._pipe(node.pipe, dot, scopes)
                    if _truth(value):
                        self._run(node.body, value if kind == "with" else dot, scopes, out)
                    else:
                        self._run(node.orelse, dot, scopes, out)
                finally:
                    scopes.pop()
            elif kind == "range":
                self._range(node, dot, scopes, out)
            elif kind == "break":
                raise _Break
            elif kind == "continue":
                raise _Continue

    def _range(self, node: Node, dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        assert node.pipe is not None
        decl = node.pipe.decl
        pipe = Pipe(cmds=node.pipe.cmds)
        value = self._pipe(pipe, dot, scopes)
        if isinstance(value, Mapping):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        elif value is None or value is _NO_VALUE:
            items = []
        else:
            raise TemplateError(f"range can't iterate over {go_format(value)}")
        if not items:
            scopes.append({})
            self._run(node.orelse, dot, scopes, out)
            scopes.pop()
            return
        for key, item in items:
            scope: dict[str, Any] = {}
            if len(decl) == 1:
                scope[decl[0]] = item
            elif len(decl) == 2:
                scope[decl[0]], scope[decl[1]] = key, item
            scopes.append(scope)
            try:
                self._run(node.body, item, scopes, out)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                scopes.pop()

    def _pipe(self, pipe: Pipe, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        value: Any = _NO_VALUE
        for i, cmd in enumerate(pipe.cmds):
            value = self._cmd(cmd, dot, scopes, value if i else _NO_VALUE, piped=i > 0)
        for name in pipe.decl[-1:]:
            if pipe.assign:
                for scope in reversed(scopes):
                    if name in scope:
                        scope[name] = value
                        break
            else:
                scopes[-1][name] = value
        return value

    def _arg(self, arg: Any, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        kind = arg[0]
        if kind == "lit":
            return arg[1]
        if kind == "field":
            value = dot
            for name in arg[1]:
                value = _field(value, name)
            return value
        if kind == "var":
            for scope in reversed(scopes):
                if arg[1] in scope:
                    value = scope[arg[1]]
                    break
            else:
                raise TemplateError(f"undefined variable {arg[1]}")
            for name in arg[2]:
                value = _field(value, name)
            return value
        if kind == "pipe":
            return self._pipe(arg[1], dot, scopes)
        if kind == "chain":
            value = self._pipe(arg[1], dot, scopes)
            for name in arg[2]:
                value = _field(value, name)
            return value
        raise TemplateError(f"can't evaluate {kind}")

    def _cmd(self, cmd: Cmd, dot: Any, scopes: list[dict[str, Any]], prev: Any, *, piped: bool) -> Any:
        first = cmd.args[0]
        if first[0] == "fn":
            args = [self._arg(a, dot, scopes) for a in cmd.args[1:]]
            if piped:
                args.append(prev)
            return _call(first[1], args)
        if len(cmd.args) > 1 or piped:
            raise TemplateError("can't give argument to non-function")
        return self._arg(first, dot, scopes)


def parse(text: str) -> Template:
    """Parse ``text`` with ``<<``/``>>`` delimiters (Go's ``Parse``: syntax errors and unknown functions raise)."""
    return Template(text, parse_tree(text))
