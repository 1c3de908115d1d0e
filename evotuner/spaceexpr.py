"""The space files' expression language: integer expressions checked when the file is loaded
(:func:`compile_expr`), evaluated per config (:meth:`Expr.evaluate`), and their canonical form
(:func:`canonical_expr`, what a space's fingerprint hashes).

The checked tree accepts integers, names, ``+ - * // % **``, comparisons, ``and or not``
and calls to ``min``, ``max`` and ``abs`` -- nothing else (no attributes, no subscripts,
no lambdas, no ``/``). Its meaning is a small interpreter over Python's AST
(:meth:`Expr.interpret`, the reference). :meth:`Expr.evaluate` runs the same tree
translated once into a Python function (:func:`_translate`): the translation builds new
AST nodes from the checked tree's -- names become ``env["NAME"]`` lookups, every
arithmetic result passes the same bit limit, divisors and powers the same checks, with
the same messages -- never from the file's text, and runs without builtins. Anything
but a :class:`SpaceError` raised by it (a name with no value) is answered by the
interpreter, so both give the same value or the same error.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from evotuner import spacelimits
from evotuner.errors import SpaceError
from evotuner.spacelimits import check_bits, check_depth, check_pow

_MAX_EXPR_CHARS = 400
_MAX_POW_EXPONENT = 64


@dataclass(frozen=True)
class Expr:
    """An integer expression checked at load time; ``source`` is what the file says."""

    source: str
    names: frozenset[str] = field(compare=False)
    _tree: ast.Expression = field(compare=False, repr=False)
    _where: str = field(compare=False, repr=False)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value at ``env`` (or the error) :meth:`interpret` gives, by the translated function."""
        compiled = self.__dict__.get("_compiled")
        if compiled is None or compiled[0] != spacelimits.MAX_BITS:
            compiled = (spacelimits.MAX_BITS, _translate(self._tree, self._where))
            self.__dict__["_compiled"] = compiled    # a cache beside the frozen fields
        try:
            return int(compiled[1](env))
        except SpaceError:
            raise
        except Exception:   # a name with no value (KeyError), or anything unforeseen: the reference decides
            return self.interpret(env)

    def interpret(self, env: Mapping[str, int]) -> int:
        """The reference meaning: the checked tree walked by :class:`_Evaluator`."""
        value = _Evaluator(env, self._where).visit(self._tree.body)
        return int(value)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_compiled", None)   # a function: rebuilt on the first evaluate()
        return state


def canonical_expr(expr: Expr) -> str:
    """A prefix form of the checked tree, independent of spacing, redundant
    parentheses and the Python version's ``ast.dump`` format."""
    return _canonical(expr._tree.body)


def _canonical(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        return f"({type(node.op).__name__} {_canonical(node.left)} {_canonical(node.right)})"
    if isinstance(node, ast.UnaryOp):
        return f"({type(node.op).__name__} {_canonical(node.operand)})"
    if isinstance(node, ast.BoolOp):
        return f"({type(node.op).__name__} {' '.join(_canonical(v) for v in node.values)})"
    if isinstance(node, ast.Compare):
        parts = [_canonical(node.left)]
        for op, right in zip(node.ops, node.comparators):
            parts += [type(op).__name__, _canonical(right)]
        return f"(Compare {' '.join(parts)})"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"({node.func.id} {' '.join(_canonical(a) for a in node.args)})"
    raise AssertionError(f"unchecked node {type(node).__name__}")  # compile_expr admits nothing else


_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a ** b,
}
_CMPOPS: dict[type, Callable[[int, int], bool]] = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}
_FUNCS: dict[str, Callable[..., int]] = {"min": min, "max": max, "abs": abs}
#: How many arguments each function takes (min and max of one integer would iterate it).
_ARITY = {"min": (2, 1 << 16), "max": (2, 1 << 16), "abs": (1, 1)}
_ARITY_EXAMPLE = {"min": "min(x, 128)", "max": "max(1, x // 2)", "abs": "abs(x - y)"}
_ALLOWED = "integers, names, + - * // % **, comparisons, and/or/not, min() max() abs()"


def compile_expr(source: str, where: str, known: Mapping[str, Any],
                 unusable: Callable[[str], tuple[str, str] | None] | None = None) -> Expr:
    """Parse ``source`` and check that it uses only allowed syntax and ``known`` names.

    ``where`` ("file: key") prefixes every error message. ``unusable(name)``: (why, remedy)
    for a name not ``known`` that exists but cannot be used here (the [derived] name being
    defined, or one defined below it), refused with that reason rather than as unknown.
    """
    if len(source) > _MAX_EXPR_CHARS:
        raise SpaceError(f"{where}: expression longer than {_MAX_EXPR_CHARS} characters",
                         "split it into [derived] names")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise SpaceError(f"{where}: cannot parse {source!r}: {exc.msg}", f"expressions may use {_ALLOWED}") from None
    names: set[str] = set()
    check_depth(tree.body, where)
    _check_node(tree.body, where, known, names, unusable or (lambda name: None))
    return Expr(source.strip(), frozenset(names), tree, where)


def _check_node(node: ast.AST, where: str, known: Mapping[str, Any], names: set[str],
                unusable: Callable[[str], tuple[str, str] | None]) -> None:
    """Recursively accept only the syntax ``_Evaluator`` knows; collect the names used."""

    def bad(what: str) -> SpaceError:
        return SpaceError(f"{where}: {what} is not allowed", f"expressions may use {_ALLOWED}")

    def check(child: ast.AST) -> None:
        _check_node(child, where, known, names, unusable)

    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            hint = " (use // for integer division)" if isinstance(node.op, ast.Div) else ""
            raise bad(f"operator {type(node.op).__name__}{hint}")
        check(node.left)
        check(node.right)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise bad(f"operator {type(node.op).__name__}")
        check(node.operand)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            check(v)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise bad(f"comparison {type(op).__name__}")
        check(node.left)
        for c in node.comparators:
            check(c)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise bad(f"the constant {node.value!r}")
    elif isinstance(node, ast.Name):
        reason = None if node.id in known else unusable(node.id)
        if reason is not None:
            raise SpaceError(f"{where}: {node.id!r} {reason[0]}", reason[1])
        if node.id not in known:
            raise SpaceError(f"{where}: unknown name {node.id!r}", f"known names: {', '.join(known)}")
        names.add(node.id)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            callee = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise bad(f"calling {callee}()")
        if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            raise bad(f"{node.func.id}() with keyword, starred or no arguments")
        lo, hi = _ARITY[node.func.id]
        if not lo <= len(node.args) <= hi:
            wants = f"exactly {lo}" if lo == hi else f"at least {lo}"
            raise SpaceError(f"{where}: {node.func.id}() takes {wants} argument{'s' if lo > 1 else ''}, "
                             f"got {len(node.args)}", f"e.g. {_ARITY_EXAMPLE[node.func.id]}")
        for a in node.args:
            check(a)
    elif isinstance(node, ast.Attribute):
        raise bad("attribute access")
    else:
        raise bad(type(node).__name__)


def _division_by_zero(where: str) -> SpaceError:
    return SpaceError(f"{where}: division by zero", "guard the divisor, e.g. max(1, ...)")


def _power(a: int, b: int, where: str) -> int:
    """``a ** b`` after the exponent's and the result's limits."""
    if not 0 <= b <= _MAX_POW_EXPONENT:
        raise SpaceError(f"{where}: exponent {b} outside 0..{_MAX_POW_EXPONENT}",
                         f"powers are of integers: keep the exponent within 0..{_MAX_POW_EXPONENT}")
    check_pow(a, b, where)
    return check_bits(a ** b, where)


def _translate(tree: ast.Expression, where: str) -> Callable[[Mapping[str, int]], Any]:
    """The checked ``tree`` as a Python function of ``env`` with :class:`_Evaluator`'s values,
    evaluation order and SpaceErrors (``env`` holding ints).

    The function is compiled from AST nodes built here for each checked node, never from
    source text: constants are the tree's ints, a name is ``env["NAME"]``, the file's names
    never become Python identifiers, and the only globals are the helpers below (no builtins).
    """

    def divide_check() -> None:
        raise _division_by_zero(where)

    namespace: dict[str, Any] = {
        "__builtins__": {},
        "_min": min, "_max": max, "_abs": abs,
        "_pow": lambda a, b: _power(a, b, where),
        "_bits": lambda v: check_bits(v, where),
        "_divzero": divide_check,
    }
    body = _Translator(1 << spacelimits.MAX_BITS).node(tree.body)
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg="env")], kwonlyargs=[], kw_defaults=[], defaults=[])
    code = compile(ast.fix_missing_locations(ast.Expression(body=ast.Lambda(args=args, body=body))),
                   f"<space expression {where}>", "eval")
    return eval(code, namespace)   # noqa: S307 -- code built above from checked nodes only


class _Translator:
    """Builds the Python expression of one checked node (``_translate``)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound      # |value| < 2**MAX_BITS: check_bits passes
        self.temps = 0

    def temp(self) -> str:
        self.temps += 1
        return f"_t{self.temps}"

    @staticmethod
    def call(name: str, *args: ast.expr) -> ast.expr:
        return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])

    def bounded(self, value: ast.expr) -> ast.expr:
        """``t if -bound < (t := value) < bound else _bits(t)``: check_bits of every arithmetic result."""
        t = self.temp()
        test = ast.Compare(left=ast.Constant(-self.bound), ops=[ast.Lt(), ast.Lt()],
                           comparators=[ast.NamedExpr(target=ast.Name(id=t, ctx=ast.Store()), value=value),
                                        ast.Constant(self.bound)])
        return ast.IfExp(test=test, body=ast.Name(id=t, ctx=ast.Load()), orelse=self.call("_bits", ast.Name(id=t, ctx=ast.Load())))

    def node(self, node: ast.AST) -> ast.expr:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int) and not isinstance(node.value, bool)
            return ast.Constant(node.value)
        if isinstance(node, ast.Name):
            return ast.Subscript(value=ast.Name(id="env", ctx=ast.Load()), slice=ast.Constant(node.id), ctx=ast.Load())
        if isinstance(node, ast.BinOp):
            left, right = self.node(node.left), self.node(node.right)
            if isinstance(node.op, ast.Pow):
                return self.call("_pow", left, right)     # checks, then a ** b, then check_bits
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                d = self.temp()   # the divisor, after both operands, before dividing: d if (d := right) != 0 else raise
                right = ast.IfExp(
                    test=ast.Compare(left=ast.NamedExpr(target=ast.Name(id=d, ctx=ast.Store()), value=right),
                                     ops=[ast.NotEq()], comparators=[ast.Constant(0)]),
                    body=ast.Name(id=d, ctx=ast.Load()), orelse=self.call("_divzero"))
            op = {ast.Add: ast.Add, ast.Sub: ast.Sub, ast.Mult: ast.Mult, ast.FloorDiv: ast.FloorDiv,
                  ast.Mod: ast.Mod}[type(node.op)]()
            return self.bounded(ast.BinOp(left=left, op=op, right=right))
        if isinstance(node, ast.UnaryOp):
            op = {ast.Not: ast.Not, ast.USub: ast.USub, ast.UAdd: ast.UAdd}[type(node.op)]()
            return ast.UnaryOp(op=op, operand=self.node(node.operand))
        if isinstance(node, ast.BoolOp):   # all()/any() of the values, short-circuit: a bool
            op = ast.And() if isinstance(node.op, ast.And) else ast.Or()
            return ast.IfExp(test=ast.BoolOp(op=op, values=[self.node(v) for v in node.values]),
                             body=ast.Constant(True), orelse=ast.Constant(False))
        if isinstance(node, ast.Compare):   # a chain stops at its first false link, as the interpreter's
            ops = [{ast.Lt: ast.Lt, ast.LtE: ast.LtE, ast.Gt: ast.Gt, ast.GtE: ast.GtE, ast.Eq: ast.Eq,
                    ast.NotEq: ast.NotEq}[type(op)]() for op in node.ops]
            return ast.Compare(left=self.node(node.left), ops=ops, comparators=[self.node(c) for c in node.comparators])
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            return self.call(f"_{node.func.id}", *(self.node(a) for a in node.args))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # compile_expr admits nothing else


class _Evaluator:
    """Evaluates a checked expression tree; every value is an int (or bool)."""

    def __init__(self, env: Mapping[str, int], where: str) -> None:
        self.env = env
        self.where = where

    def visit(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            try:
                return self.env[node.id]
            except KeyError:
                raise SpaceError(f"{self.where}: name {node.id!r} has no value here") from None
        if isinstance(node, ast.BinOp):
            a, b = self.visit(node.left), self.visit(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                raise _division_by_zero(self.where)
            if isinstance(node.op, ast.Pow):
                return _power(a, b, self.where)
            return check_bits(_BINOPS[type(node.op)](a, b), self.where)
        if isinstance(node, ast.UnaryOp):
            v = self.visit(node.operand)
            if isinstance(node.op, ast.Not):
                return not v
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self.visit(v) for v in node.values)
            return any(self.visit(v) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.visit(right_node)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return _FUNCS[node.func.id](*(self.visit(a) for a in node.args))
        raise SpaceError(f"{self.where}: cannot evaluate {type(node).__name__}")  # unreachable after the check
