"""Python launch rules rendered as C++: one source for a family's host contract.

A family writes how a call becomes its launch (tensor-map dimensions, strides and boxes, the
grid, which layouts are refused) as small Python functions that its runtime calls directly;
:func:`render` turns the same functions into inline C++ for the launchers that cannot run
Python (the production extension's rows, the dev harness). The family's generator writes
that C++ into a header kept in the repository, and a test keeps it equal to what
:func:`render` writes now (kernels/hopper/gen_launch.py, tests/test_hopper_launch.py).

The subset translated, and its contract (anything else is a :class:`TranslationError`
naming the line):

* a function of integer parameters, a docstring, then statements ``name = expr`` (a local,
  assigned once), ``if cond: return expr`` and a final ``return expr``;
* a return value is an integer expression, or a dict literal of string keys to integer
  expressions or tuples of them (a C++ struct ``<Prefix><CamelName>`` whose fields are the
  keys, tuples as arrays); every return of one function has the same keys and lengths;
* expressions: integer literals, ``True``/``False``, parameters, locals, the module's own
  integer constants (inlined as literals), ``+ - * // %``, comparisons (one operator each),
  ``and``/``or``/``not``, unary ``-``, ``a if c else b``, ``min``/``max`` of two arguments,
  and calls of functions rendered earlier in the same header that return an integer;
* every value is an ``int64_t``; ``//`` and ``%`` are C++'s, which agree with Python's for
  non-negative operands only: a rule must test a value's sign before dividing it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from evotuner.errors import EvotunerError

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_INT64_MAX = (1 << 63) - 1


class TranslationError(EvotunerError):
    """A launch rule uses Python the C++ rendering cannot express."""


@dataclass
class _Function:
    name: str                    # C++ name
    scalar: bool                 # returns one int64_t (else a struct)
    struct: str | None = None
    fields: dict[str, int] = field(default_factory=dict)   # key -> array length (0: scalar)


def render(module: ModuleType, functions: Sequence[Callable[..., object]], *, prefix: str,
           banner: str) -> str:
    """The C++ header text of ``functions`` (in order; a function may call those before it),
    each named ``<prefix>_<name>``; ``banner`` is the comment at its top."""
    head = "".join(f"// {line}".rstrip() + "\n" for line in banner.splitlines())
    return head + "#pragma once\n#include <algorithm>\n#include <cstdint>\n\n" + render_functions(
        module, functions, prefix=prefix)


def render_functions(module: ModuleType, functions: Sequence[Callable[..., object]], *, prefix: str,
                     constexpr: bool = False) -> str:
    """The C++ definitions of ``functions`` alone (no banner, guard or include), for a header
    that holds other code too: ``inline``, or ``constexpr`` (usable in constant expressions,
    C++14 and later) when asked. The includer provides ``<cstdint>`` (and ``<algorithm>`` for
    ``min``/``max``)."""
    rendered: dict[str, _Function] = {}
    specifier = "constexpr" if constexpr else "inline"
    return "\n".join(_Translator(module, fn, prefix, rendered, specifier).render() for fn in functions)


class _Translator:
    def __init__(self, module: ModuleType, fn: Callable[..., object], prefix: str,
                 rendered: dict[str, _Function], specifier: str = "inline") -> None:
        self.module, self.fn, self.prefix, self.rendered = module, fn, prefix, rendered
        self.specifier = specifier
        self.tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        if not isinstance(self.tree, ast.FunctionDef):
            self._fail(self.tree, "not a plain function")
        self.params = [a.arg for a in self.tree.args.args]
        if self.tree.args.vararg or self.tree.args.kwarg or self.tree.args.kwonlyargs or self.tree.args.defaults:
            self._fail(self.tree, "only plain positional parameters are translated")
        self.locals: set[str] = set()
        self.cname = f"{prefix}_{self.tree.name}"

    def _fail(self, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        source = inspect.getsourcefile(self.fn) or "?"
        first = inspect.getsourcelines(self.fn)[1]
        raise TranslationError(f"{source}:{first + line - 1}: {self.fn.__name__}: {what}",
                               "write the rule in the subset evotuner/compiler/cxx.py describes")

    def render(self) -> str:
        body = list(self.tree.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]   # the docstring
        if not body or not isinstance(body[-1], ast.Return):
            self._fail(self.tree, "must end with a return")
        returns = [s.value for s in body if isinstance(s, ast.Return)]
        returns += [s.body[0].value for s in body if isinstance(s, ast.If)
                    and len(s.body) == 1 and isinstance(s.body[0], ast.Return)]
        info = self._signature(returns)
        self.rendered[self.tree.name] = info
        rtype = "int64_t" if info.scalar else info.struct
        lines = []
        if not info.scalar:
            members = "".join(f"    int64_t {k}{f'[{n}]' if n else ''};\n" for k, n in info.fields.items())
            lines.append(f"struct {info.struct} {{\n{members}}};\n")
        doc = ast.get_docstring(self.tree)
        if doc:
            lines.extend(f"// {line}".rstrip() + "\n" for line in doc.splitlines())
        args = ", ".join(f"int64_t {p}" for p in self.params)
        lines.append(f"{self.specifier} {rtype} {self.cname}({args}) {{\n")
        for stmt in body:
            lines.append(self._statement(stmt, info))
        lines.append("}\n")
        return "".join(lines)

    def _signature(self, returns: list[ast.expr | None]) -> _Function:
        shapes = []
        for value in returns:
            if value is None:
                self._fail(self.tree, "a bare return")
            if isinstance(value, ast.Dict):
                shape = {}
                for k, v in zip(value.keys, value.values):
                    if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.isidentifier()):
                        self._fail(value, "a returned dict's keys must be identifier strings")
                    shape[k.value] = len(v.elts) if isinstance(v, ast.Tuple) else 0
                shapes.append(shape)
            else:
                shapes.append(None)
        if any(s != shapes[0] for s in shapes):
            self._fail(self.tree, "every return must have the same form (the same keys and tuple lengths)")
        if shapes[0] is None:
            return _Function(self.cname, scalar=True)
        camel = "".join(part.capitalize() for part in f"{self.prefix}_{self.tree.name}".split("_"))
        return _Function(self.cname, scalar=False, struct=camel, fields=shapes[0])

    # -- statements --------------------------------------------------------------------------

    def _statement(self, stmt: ast.stmt, info: _Function) -> str:
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                self._fail(stmt, "assign one plain name at a time")
            name = stmt.targets[0].id
            if name in self.locals or name in self.params:
                self._fail(stmt, f"{name} is assigned twice (a local is assigned once)")
            value = self._expr(stmt.value)
            self.locals.add(name)
            return f"    const int64_t {name} = {value};\n"
        if isinstance(stmt, ast.If):
            if stmt.orelse or len(stmt.body) != 1 or not isinstance(stmt.body[0], ast.Return):
                self._fail(stmt, "an if must hold one return and no else")
            return f"    if ({self._expr(stmt.test)}) {self._return(stmt.body[0], info).lstrip()}"
        if isinstance(stmt, ast.Return):
            return self._return(stmt, info)
        self._fail(stmt, f"{type(stmt).__name__} statements are not translated")
        return ""

    def _return(self, stmt: ast.Return, info: _Function) -> str:
        if info.scalar:
            return f"    return {self._expr(stmt.value)};\n"
        assert isinstance(stmt.value, ast.Dict)
        inits = []
        for key, value in zip(stmt.value.keys, stmt.value.values):
            if isinstance(value, ast.Tuple):
                inits.append("{" + ", ".join(self._expr(e) for e in value.elts) + "}")
            else:
                inits.append(self._expr(value))
        return f"    return {info.struct}{{{', '.join(inits)}}};\n"

    # -- expressions -------------------------------------------------------------------------

    def _expr(self, node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                return "1" if value else "0"
            if isinstance(value, int) and 0 <= value <= _INT64_MAX:
                return f"INT64_C({value})"
            self._fail(node, f"the constant {value!r} is not a non-negative int64")
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return f"({self._expr(node.left)} {_BINOPS[type(node.op)]} {self._expr(node.right)})"
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in _CMPOPS:
                self._fail(node, "one comparison operator per comparison (no chains, no `in`/`is`)")
            return f"({self._expr(node.left)} {_CMPOPS[type(node.ops[0])]} {self._expr(node.comparators[0])})"
        if isinstance(node, ast.BoolOp):
            op = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + op.join(self._expr(v) for v in node.values) + ")"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            return f"({'!' if isinstance(node.op, ast.Not) else '-'}{self._expr(node.operand)})"
        if isinstance(node, ast.IfExp):
            return f"({self._expr(node.test)} ? {self._expr(node.body)} : {self._expr(node.orelse)})"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return self._call(node)
        self._fail(node, f"{ast.unparse(node)!r} is not translated")
        return ""

    def _name(self, node: ast.Name) -> str:
        if node.id in self.params or node.id in self.locals:
            return node.id
        value = getattr(self.module, node.id, None)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(node, f"{node.id} is neither a parameter, a local nor an integer constant of "
                             f"{self.module.__name__}")
        return self._expr(ast.copy_location(ast.Constant(value), node))

    def _call(self, node: ast.Call) -> str:
        name = node.func.id
        args = [self._expr(a) for a in node.args]
        if name in ("min", "max"):
            if len(args) != 2:
                self._fail(node, f"{name} takes two arguments here")
            return f"std::{name}<int64_t>({args[0]}, {args[1]})"
        called = self.rendered.get(name)
        if called is None or not called.scalar:
            self._fail(node, f"{name}() is not an integer rule rendered earlier in this header")
        return f"{called.name}({', '.join(args)})"
