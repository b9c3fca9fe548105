"""Parsing for :mod:`.gotemplate`: the lexer and parser of Go's ``text/template`` subset with ``<<``/``>>``.

The tree is small: text, actions (a pipeline, possibly declaring variables), ``if``/``range``/``with``
with their ``else`` branches, ``break``/``continue``. Errors follow Go's parser: unknown functions,
unbalanced ``end``, unclosed actions and strings, variables used before they are declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FUNCS", "Cmd", "Node", "Pipe", "TemplateError", "parse_tree"]

LEFT, RIGHT = "<<", ">>"

FUNCS = {
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


class TemplateError(ValueError):
    """A template that does not parse, or an evaluation that fails."""


# ------------------------------------------------------------------------------------------------
# the tree


@dataclass
class Cmd:
    # operands: ("field", names) | ("var", name, names) | ("lit", value) | ("fn", name) | ("pipe", Pipe)
    # | ("chain", Pipe, names)
    args: list[Any]


@dataclass
class Pipe:
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    cmds: list[Cmd] = field(default_factory=list)


@dataclass
class Node:
    kind: str  # text | action | if | range | with | break | continue
    text: str = ""
    pipe: Pipe | None = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


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
            inner_start += 2  # the marker is "-" and one space
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

    def parse(self) -> list[Node]:
        nodes, stop = self.list_until(set())
        if stop is not None:
            raise TemplateError(f"unexpected {{{{{stop}}}}}")
        return nodes

    def list_until(self, stops: set[str]) -> tuple[list[Node], str | None]:
        nodes: list[Node] = []
        while self.pos < len(self.items):
            kind, value = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                nodes.append(Node("text", text=value))
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
                nodes.append(Node(word))
            elif word in ("define", "template", "block"):
                raise TemplateError(f"{word!r} is not supported")
            else:
                nodes.append(Node("action", pipe=self.pipeline(toks, allow_decl=True)))
        if stops:
            raise TemplateError("unexpected EOF")
        return nodes, None

    def control(self, word: str, toks: list[tuple[str, str]]) -> Node:
        if not toks:
            raise TemplateError(f"missing value for {word}")
        self.vars.append(set())
        pipe = self.pipeline(toks, allow_decl=True, in_range=word == "range")
        if word == "range":
            self.range_depth = getattr(self, "range_depth", 0) + 1
        body, stop = self.list_until({"end", "else"})
        if word == "range":
            self.range_depth -= 1
        node = Node(word, pipe=pipe, body=body)
        try:
            if stop == "else":
                rest = self.pending
                if rest and rest[0] == ("ident", "if") and word == "if":
                    # "else if" nests an if that shares this one's end
                    node.orelse = [self.control("if", rest[1:])]
                elif rest:
                    raise TemplateError("unexpected tokens after else")
                else:
                    node.orelse, stop = self.list_until({"end"})
        finally:
            self.vars.pop()  # the structure's variables are known up to its end, else branch included
        return node

    def pipeline(self, toks: list[tuple[str, str]], *, allow_decl: bool, in_range: bool = False) -> Pipe:
        pipe = Pipe()
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

    def command(self, toks: list[tuple[str, str]]) -> Cmd:
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
                elif value in FUNCS:
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
        return Cmd(args)


def _number(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        if clean.lower().lstrip("+-").startswith("0x"):
            return int(clean, 16)
        return int(clean) if re.fullmatch(r"[-+]?[0-9]+", clean) else float(clean)
    except ValueError:
        raise TemplateError(f"bad number syntax: {text!r}") from None


def parse_tree(text: str) -> list[Node]:
    """Parse ``text`` into the tree :class:`~.gotemplate.Template` executes."""
    return _Parser(text).parse()
