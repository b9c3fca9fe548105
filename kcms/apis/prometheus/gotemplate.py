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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Template", "TemplateError", "go_format", "parse"]

LEFT, RIGHT = "<<", ">>"
_FUNCS = {
    "index",
    "len",
    "print",
    "printf",
    "println",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "and",
    "or",
    "not",
    "slice",
}
_NO_VALUE = object()  # Go prints a missing map key / nil interface as "<no value>"


class TemplateError(ValueError):
    """A template that does not parse, or an evaluation that fails."""


# ------------------------------------------------------------------------------------------------
# the tree


@dataclass
class _Cmd:
    # operands: ("field", names) | ("var", name, names) | ("lit", value) | ("fn", name) | ("pipe", _Pipe)
    # | ("chain", _Pipe, names)
    args: list[Any]


@dataclass
class _Pipe:
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    cmds: list[_Cmd] = field(default_factory=list)


@dataclass
class _Node:
    kind: str  # text | action | if | range | with | break | continue
    text: str = ""
    pipe: _Pipe | None = None
    body: list[_Node] = field(default_factory=list)
    orelse: list[_Node] = field(default_factory=list)


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# lexing of one action's inside

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:[^'\\\n]|\\.)+')
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<num>[-+]?(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?))
  | (?P<var>\$[A-Za-z0-9_]*)
  | (?P<chain>(?<=[)])(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<dot>\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[|(),])
    """,
    re.VERBOSE,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"unexpected {text[pos]!r} in command")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "space":
            continue
        value = m.group()
        # a field chain right after a variable belongs to it: "$x.A" lexes as var "$x" + field ".A"
        if kind == "field" and out and out[-1][0] == "var" and text[m.start() - 1] != " ":
            out[-1] = ("var", out[-1][1] + value)
            continue
        out.append((kind, value))
    return out


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


def _unquote(text: str) -> str:
    """A Go interpreted string literal's value (``strconv.Unquote``)."""
    body = text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise TemplateError(f"invalid escape in {text}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif nxt in "01234567":
            digits = body[i + 1 : i + 4]
            if not re.fullmatch(r"[0-7]{3}", digits):
                raise TemplateError(f"invalid escape in {text}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise TemplateError(f"invalid escape in {text}")
    return "".join(out)


# ------------------------------------------------------------------------------------------------
# parsing


def _split_actions(text: str) -> list[tuple[str, str]]:
    """``text`` as ("text", s) and ("action", inside) items, trim markers applied."""
    items: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    while True:
        start = text.find(LEFT, pos)
        chunk = text[pos:] if start < 0 else text[pos:start]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        if start < 0:
            if chunk:
                items.append(("text", chunk))
            return items
        inner_start = start + len(LEFT)
        if (
            text.startswith("- ", inner_start)
            or text.startswith("-\t", inner_start)
            or text.startswith("-\n", inner_start)
        ):
            chunk = chunk.rstrip(" \t\r\n")
            inner_start += 1
        if chunk:
            items.append(("text", chunk))
        if text.startswith("/*", inner_start):
            close = text.find("*/", inner_start + 2)
            if close < 0:
                raise TemplateError("unclosed comment")
            rest = close + 2
            trim_next = False
            if text.startswith(" -" + RIGHT, rest):
                trim_next, rest = True, rest + 2
            if not text.startswith(RIGHT, rest):
                raise TemplateError("comment ends before closing delimiter")
            pos = rest + len(RIGHT)
            continue
        end = _find_right(text, inner_start)
        inner = text[inner_start:end]
        trim_next = False
        if inner.endswith(" -") or inner.endswith("\t-") or inner.endswith("\n-"):
            inner, trim_next = inner[:-1], True
        items.append(("action", inner))
        pos = end + len(RIGHT)


def _find_right(text: str, pos: int) -> int:
    """Where the action starting at ``pos`` closes: the first ``>>`` outside a string literal."""
    i = pos
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                if text[j] == "\n":
                    raise TemplateError("unterminated quoted string")
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise TemplateError("unterminated raw quoted string")
            i = j + 1
            continue
        if text.startswith(RIGHT, i):
            return i
        i += 1
    raise TemplateError("unclosed action")


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _split_actions(text)
        self.pos = 0
        self.vars: list[set[str]] = [{"$"}]

    def parse(self) -> list[_Node]:
        nodes, stop = self.list_until(set())
        if stop is not None:
            raise TemplateError(f"unexpected {{{{{stop}}}}}")
        return nodes

    def list_until(self, stops: set[str]) -> tuple[list[_Node], str | None]:
        nodes: list[_Node] = []
        while self.pos < len(self.items):
            kind, value = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                nodes.append(_Node("text", text=value))
                continue
            toks = _tokens(value)
            if not toks:
                raise TemplateError("missing value for command")
            word = toks[0][1] if toks[0][0] == "ident" else ""
            if word in ("end", "else"):
                if word not in stops:
                    raise TemplateError(f"unexpected {{{{{word}}}}}")
                if word == "end" and len(toks) > 1:
                    raise TemplateError("unexpected tokens after end")
                self.pending = toks[1:]
                return nodes, word
            if word in ("if", "range", "with"):
                nodes.append(self.control(word, toks[1:]))
            elif word in ("break", "continue"):
                if len(toks) > 1:
                    raise TemplateError(f"unexpected tokens after {word}")
                if not getattr(self, "range_depth", 0):
                    raise TemplateError(f"{{{{{word}}}}} outside {{{{range}}}}")
                nodes.append(_Node(word))
            elif word in ("define", "template", "block"):
                raise TemplateError(f"{word!r} is not supported")
            else:
                nodes.append(_Node("action", pipe=self.pipeline(toks, allow_decl=True)))
        if stops:
            raise TemplateError("unexpected EOF")
        return nodes, None

    def control(self, word: str, toks: list[tuple[str, str]]) -> _Node:
        if not toks:
            raise TemplateError(f"missing value for {word}")
        self.vars.append(set())
        pipe = self.pipeline(toks, allow_decl=True, in_range=word == "range")
        if word == "range":
            self.range_depth = getattr(self, "range_depth", 0) + 1
        body, stop = self.list_until({"end", "else"})
        if word == "range":
            self.range_depth -= 1
        self.vars.pop()
        node = _Node(word, pipe=pipe, body=body)
        if stop == "else":
            rest = self.pending
            if rest and rest[0] == ("ident", "if") and word == "if":
                # "else if" nests an if that shares this one's end
                node.orelse = [self.control("if", rest[1:])]
                return node
            if rest:
                raise TemplateError("unexpected tokens after else")
            self.vars.append(set())
            node.orelse, stop = self.list_until({"end"})
            self.vars.pop()
        return node

    def pipeline(self, toks: list[tuple[str, str]], *, allow_decl: bool, in_range: bool = False) -> _Pipe:
        pipe = _Pipe()
        # declarations: "$x :=", "$i, $v :=" (range only), "$x ="
        if allow_decl and len(toks) >= 2 and toks[0][0] == "var":
            if toks[1][0] in ("decl", "assign"):
                pipe.decl, pipe.assign = [toks[0][1]], toks[1][0] == "assign"
                toks = toks[2:]
            elif (
                in_range
                and toks[1] == ("punct", ",")
                and len(toks) >= 4
                and toks[2][0] == "var"
                and toks[3][0] == "decl"
            ):
                pipe.decl = [toks[0][1], toks[2][1]]
                toks = toks[4:]
            for name in pipe.decl:
                if "." in name:
                    raise TemplateError(f"cannot declare {name}")
                if pipe.assign:
                    self.check_var(name)
                else:
                    self.vars[-1].add(name)
        if not toks:
            raise TemplateError("missing value for command")
        cmds: list[list[tuple[str, str]]] = [[]]
        depth = 0
        for tok in toks:
            if tok == ("punct", "("):
                depth += 1
            elif tok == ("punct", ")"):
                depth -= 1
                if depth < 0:
                    raise TemplateError("unexpected right paren")
            if tok == ("punct", "|") and depth == 0:
                cmds.append([])
            else:
                cmds[-1].append(tok)
        if depth:
            raise TemplateError("unclosed left paren")
        for raw in cmds:
            if not raw:
                raise TemplateError("missing command in pipeline")
            pipe.cmds.append(self.command(raw))
        for cmd in pipe.cmds[1:]:
            if cmd.args[0][0] != "fn" and len(cmd.args) == 1 and cmd.args[0][0] == "lit":
                raise TemplateError("non executable command in pipeline stage")
        return pipe

    def check_var(self, name: str) -> None:
        base = name.split(".", 1)[0]
        if not any(base in scope for scope in self.vars):
            raise TemplateError(f"undefined variable {base!r}")

    def command(self, toks: list[tuple[str, str]]) -> _Cmd:
        args: list[Any] = []
        i = 0
        while i < len(toks):
            kind, value = toks[i]
            if kind == "punct" and value == "(":
                depth, j = 1, i + 1
                while depth:
                    if j >= len(toks):
                        raise TemplateError("unclosed left paren")
                    if toks[j] == ("punct", "("):
                        depth += 1
                    elif toks[j] == ("punct", ")"):
                        depth -= 1
                    j += 1
                inner = self.pipeline(toks[i + 1 : j - 1], allow_decl=False)
                arg: Any = ("pipe", inner)
                if j < len(toks) and toks[j][0] == "chain":
                    arg = ("chain", inner, toks[j][1][1:].split("."))
                    j += 1
                args.append(arg)
                i = j
                continue
            if kind == "field":
                args.append(("field", value[1:].split(".")))
            elif kind == "dot":
                args.append(("field", []))
            elif kind == "var":
                self.check_var(value)
                name, _, rest = value.partition(".")
                args.append(("var", name, rest.split(".") if rest else []))
            elif kind == "str":
                args.append(("lit", _unquote(value)))
            elif kind == "raw":
                args.append(("lit", value[1:-1]))
            elif kind == "char":
                text = _unquote('"' + value[1:-1] + '"')
                if len(text) != 1:
                    raise TemplateError(f"malformed character constant {value}")
                args.append(("lit", ord(text)))
            elif kind == "num":
                args.append(("lit", _number(value)))
            elif kind == "ident":
                if value in ("true", "false"):
                    args.append(("lit", value == "true"))
                elif value == "nil":
                    args.append(("lit", None))
                elif value in _FUNCS:
                    if args:
                        raise TemplateError(f"function {value!r} is not the first word of the command")
                    args.append(("fn", value))
                else:
                    raise TemplateError(f'function "{value}" not defined')
            else:
                raise TemplateError(f"unexpected {value!r} in command")
            i += 1
        if len(args) > 1 and args[0][0] not in ("fn",) and args[0][0] != "field":
            raise TemplateError("can't give argument to non-function")
        return _Cmd(args)


def _number(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        if clean.lower().lstrip("+-").startswith("0x"):
            return int(clean, 16)
        return int(clean) if re.fullmatch(r"[-+]?[0-9]+", clean) else float(clean)
    except ValueError:
        raise TemplateError(f"bad number syntax: {text!r}") from None


# ------------------------------------------------------------------------------------------------
# evaluation


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
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        raise TemplateError(f"error calling {name}: incompatible types for comparison")
    try:
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[name]
    except TypeError:
        raise TemplateError(f"error calling {name}: invalid type for comparison") from None


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

    def __init__(self, source: str, nodes: list[_Node]) -> None:
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

        def walk_pipe(pipe: _Pipe | None, top: bool) -> None:
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

        def walk(nodes: list[_Node], top: bool) -> None:
            for node in nodes:
                walk_pipe(node.pipe, top)
                inner = top and node.kind not in ("range", "with")
                walk(node.body, inner)
                walk(node.orelse, top)

        walk(self._nodes, True)
        return found

    # -- execution

    def _run(self, nodes: list[_Node], dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
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
                scopes.append({})
                value = self._pipe(node.pipe, dot, scopes)
                if _truth(value):
                    self._run(node.body, value if kind == "with" else dot, scopes, out)
                    scopes.pop()
                else:
                    scopes.pop()
                    scopes.append({})
                    self._run(node.orelse, dot, scopes, out)
                    scopes.pop()
            elif kind == "range":
                self._range(node, dot, scopes, out)
            elif kind == "break":
                raise _Break
            elif kind == "continue":
                raise _Continue

    def _range(self, node: _Node, dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        assert node.pipe is not None
        decl = node.pipe.decl
        pipe = _Pipe(cmds=node.pipe.cmds)
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

    def _pipe(self, pipe: _Pipe, dot: Any, scopes: list[dict[str, Any]]) -> Any:
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

    def _cmd(self, cmd: _Cmd, dot: Any, scopes: list[dict[str, Any]], prev: Any, *, piped: bool) -> Any:
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
    return Template(text, _Parser(text).parse())
