"""Mutation operators that `make mutation` adds to mutmut's own (``mutmut.mutation.mutators``), each a
plausible one-line bug that mutmut does not plant and that survived the suite when planted by hand:

* ``all`` ↔ ``any`` (a condition over every element read as over one), ``triu`` ↔ ``tril`` (a mask on
  the wrong side of the diagonal), as functions or methods;
* a slice's step dropped (``x[::2]`` read as ``x[:]``) and one operand of ``and``/``or`` dropped (a
  ``step == 1`` condition left out of ``a and b and step == 1``);
* two adjacent independent statements swapped, one of them a call for its effect (a value saved after
  the call that changes it: ``level = get(); set(quiet)`` → ``set(quiet); level = get()``).

:func:`install` makes mutmut generate them (in this process, and in ``mutmut run``'s, which
``tools/mutation.py`` starts through it). They come after mutmut's own mutants of a function, so the
numbers of those (``x_f__mutmut_12``, the names in ``tools/mutation_equivalent.yaml``) do not move.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst

SWAPPED_NAMES = {"all": "any", "any": "all", "triu": "tril", "tril": "triu"}


def operator_swapped_call(node: cst.Call) -> Iterable[cst.Call]:
    """``all(…)`` ↔ ``any(…)``, ``x.triu(1)`` ↔ ``x.tril(1)``, ``torch.tril(…)`` ↔ ``torch.triu(…)``."""
    func = node.func
    if isinstance(func, cst.Name) and func.value in SWAPPED_NAMES:
        yield node.with_changes(func=func.with_changes(value=SWAPPED_NAMES[func.value]))
    elif isinstance(func, cst.Attribute) and func.attr.value in SWAPPED_NAMES:
        yield node.with_changes(func=func.with_changes(attr=cst.Name(SWAPPED_NAMES[func.attr.value])))


def operator_slice_step(node: cst.Slice) -> Iterable[cst.Slice]:
    """``a[i:j:k]`` → ``a[i:j]``: the step dropped (mutmut's number operator alters a literal one)."""
    if node.step is not None:
        yield node.with_changes(step=None, second_colon=cst.MaybeSentinel.DEFAULT)


def operator_dropped_operand(node: cst.BooleanOperation) -> Iterable[cst.BaseExpression]:
    """``a and b`` → ``a`` and → ``b`` (a condition left out; mutmut swaps ``and``/``or`` only)."""
    for kept in (node.left, node.right):
        yield kept.with_changes(lpar=node.lpar, rpar=node.rpar) if node.lpar else kept


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in _walk(node) if isinstance(n, cst.Name)}


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _written(statement: cst.BaseSmallStatement) -> set[str]:
    """The names a statement binds or changes (an attribute or item target: its base names)."""
    if isinstance(statement, cst.Assign):
        return set().union(*(_names(t.target) for t in statement.targets))
    if isinstance(statement, cst.AnnAssign | cst.AugAssign):
        return _names(statement.target)
    return set()


def _simple(line: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The statement of a one-statement line that assigns or is an expression (not a docstring)."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    (statement,) = line.body
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.BaseString):
        return None
    return statement if isinstance(statement, cst.Assign | cst.AnnAssign | cst.AugAssign | cst.Expr) else None


def _independent(first: cst.BaseSmallStatement, second: cst.BaseSmallStatement) -> bool:
    """Neither reads or rebinds a name the other binds, and one is a call made for its effect."""
    if not any(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) for s in (first, second)):
        return False
    w1, w2 = _written(first), _written(second)
    return not (w1 & _names(second) or w2 & _names(first))


def operator_swapped_statements(node: cst.IndentedBlock) -> Iterable[cst.IndentedBlock]:
    """Two adjacent independent statements of a block in the other order (:func:`_independent`)."""
    body = list(node.body)
    for i in range(len(body) - 1):
        first, second = _simple(body[i]), _simple(body[i + 1])
        if first is not None and second is not None and _independent(first, second):
            swapped = [*body[:i], body[i + 1], body[i], *body[i + 2 :]]
            yield node.with_changes(body=swapped)


EXTRA_OPERATORS = [
    (cst.Call, operator_swapped_call),
    (cst.Slice, operator_slice_step),
    (cst.BooleanOperation, operator_dropped_operand),
    (cst.IndentedBlock, operator_swapped_statements),
]


def install() -> None:
    """mutmut's ``create_mutations`` followed by a second pass with :data:`EXTRA_OPERATORS` over the same
    parsed module, its mutants appended after mutmut's own (whose numbering stays)."""
    from libcst.metadata import MetadataWrapper
    from mutmut.mutation import file_mutation as fm

    if getattr(fm.create_mutations, "extra_operators", False):
        return

    def create_mutations(filename, code, covered_lines=None, coverage_excluded_lines=None):
        module = cst.parse_module(code)
        wrapper = MetadataWrapper(module)
        ignored = fm.get_ignored_lines(filename, code, wrapper, coverage_excluded_lines)
        own = fm.MutationVisitor(fm.mutation_operators, ignored, covered_lines)
        module = wrapper.visit(own)
        extra = fm.MutationVisitor(EXTRA_OPERATORS, ignored, covered_lines)
        wrapper.visit(extra)
        return module, own.mutations + extra.mutations, own.ignored_classes, own.ignored_functions

    create_mutations.extra_operators = True
    fm.create_mutations = create_mutations
