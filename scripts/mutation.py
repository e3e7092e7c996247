#!/usr/bin/env python3
"""Mutation testing of dlpack's core modules: do the tests fail when the code is wrong?

    python scripts/mutation.py                      # every module, the sampled mutants
    python scripts/mutation.py order spec --sample 0 # all mutants of two modules
    python scripts/mutation.py format --list        # show the mutants, run nothing

Each mutant is one small change to one module (a comparison or arithmetic operator
swapped, a constant off by one, ``and``/``or`` swapped, a ``not`` dropped, a ``raise`` or a
call statement deleted, ``True``/``False`` swapped). The script copies the repository to a
temporary folder, makes that copy the one ``dlpack_io`` imports (PYTHONPATH), writes one
mutant at a time into it and runs the tests that exercise the module (``-x``, under a
deadline): the mutant is *killed* when they fail, *survived* when they pass. Mutants are
sampled per module with a fixed seed (``--sample``, ``--seed``), so a run is repeatable.

Error-message texts, docstrings and log calls are not mutated (a changed message is not a
wrong behaviour). A survivor is either a gap in the tests or an *equivalent* mutant (one
that cannot change behaviour); docs/testing.md names every survivor and why. Equivalent
mutants are listed in EQUIVALENT below by module and line text, and reported apart.
It need not run in CI: ``--jobs`` runs mutants in parallel copies.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"packer": "packer", "reader": "reader", "kernels": "kernels", "tools": "tools"}

# module name -> (source files, the test files that exercise them)
MODULES = {
    "order": (["reader/batch/order.py"], ["tests/batch/test_pinned.py", "tests/batch/test_order.py",
                                    "tests/batch/test_ranks.py"]),
    "format": (["reader/format/spec.py", "reader/format/schema.py"], ["tests/reader/test_format.py", "tests/reader/test_format_checks.py",
                                      "tests/reader/test_manifest_checks.py", "tests/reader/test_fuzz_format.py",
                                      "tests/tools/test_verify.py"]),
    "indexcheck": (["reader/format/checks.py"], ["tests/reader/test_format_checks.py",
                                              "tests/reader/test_fuzz_format.py"]),
    "shard": (["reader/shard.py"], ["tests/reader/test_format_checks.py", "tests/reader/test_shard_changes.py",
                                    "tests/tools/test_verify.py", "tests/reader/test_lmdb_structure.py"]),
    "journal": (["packer/journal.py"], ["tests/packer/test_journal.py", "tests/batch/test_resume_options.py",
                                        "tests/packer/test_convert.py"]),
    "spec": (["reader/batch/plan.py", "reader/transforms/geometry.py",
              "reader/transforms/colour.py"],
             ["tests/reader/test_spec.py", "tests/batch/test_transforms.py",
              "tests/batch/test_loader_api.py", "tests/batch/test_pinned.py"]),
    "kernels": (["kernels/reference.py", "kernels/epilogue.py"],
                ["tests/kernels/test_kernels_reference.py", "tests/kernels/test_kernels_validation.py",
                 "tests/kernels/test_kernels_jitter.py",
                 "tests/kernels/test_kernels_records.py::test_packed_errors"]),
}

# Mutants that cannot change behaviour, by (file, line before, line after the mutation) ->
# why (docs/testing.md repeats each). Filled in from the survivors of real runs.
EQUIVALENT: dict = {
    ('reader/shard.py', 'check_regular(self.path)', 'pass'):
        "every LmdbShard open reaches _lmdb_keys, whose check_lmdb opens the path with "
        "open_regular and refuses a non-regular file with the same message",
    ('reader/batch/order.py',
     'if len(sizes) < batches and len(sizes) and (sizes[-1] > 1):',
     'if len(sizes) < batches and len(sizes) and (sizes[-1] >= 1):'):
        'a last batch of 1 split into 1 + 0 gives the same boundaries as padding it with an empty batch',
    ('reader/format/spec.py',
     'body = HEADER_STRUCT.pack(*fields, 0)[:-4]',
     'body = HEADER_STRUCT.pack(*fields, 1)[:-4]'):
        'the packed placeholder CRC is the last 4 bytes, cut off by [:-4]',
    ('reader/format/schema.py',
     "if not isinstance(source.get('num_inputs', 0), int) or any((not isinstance(source.get(k), (str, type(None))) for k in ('root', 'list'))):",
     "if not isinstance(source.get('num_inputs', 1), int) or any((not isinstance(source.get(k), (str, type(None))) for k in ('root', 'list'))):"):
        'the default is only tested for being an int; 0 and 1 both are',
    ('reader/shard.py',
     'for stale in [k for k in _LMDB_OPEN if k[1] == key[1] and k[0] != key[0]]:',
     'for stale in [k for k in _LMDB_OPEN if k[1] == key[1] and k[1] != key[0]]:'):
        'a path never equals a pid, and an entry with this pid and path cannot exist (the key is not in _LMDB_OPEN)',
    ('reader/shard.py',
     'env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, max_readers=1, max_spare_txns=0)',
     'env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=True, max_readers=1, max_spare_txns=0)'):
        'MDB_NORDAHEAD is an madvise hint: the same bytes are read; its effect is page-cache use on data larger than RAM (a benchmark matter)',
    ('packer/journal.py',
     'return plan_hash(inputs, stats, {}, 0)',
     'return plan_hash(inputs, stats, {}, 1)'):
        'the inputs digest is only compared with digests made by the same function',
    ('packer/journal.py',
     "f.write(json.dumps(entry, sort_keys=True) + '\\n')",
     "f.write(json.dumps(entry, sort_keys=False) + '\\n')"):
        'the journal is read back as JSON objects: key order is not seen',
    ('packer/journal.py',
     'f.flush()',
     'pass'):
        "closing the file flushes it anyway; only the fsync's durability on power loss is lost, which no test can observe",
    ('packer/journal.py',
     'self.shards.append(entry)',
     'pass'):
        'nothing reads Journal.shards once the journal is written',
}

SWAP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
                ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
              ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
              ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
              ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr}
SWAP_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
QUIET_CALLS = ("log", "logging", "warnings")  # log.debug(...) etc.: not behaviour


@dataclass
class Mutant:
    """One change: where it is and what it does."""

    file: str
    line: int
    kind: str
    before: str
    after: str
    source: str = ""     # the whole mutated module
    outcome: str = ""    # killed / survived / timeout / equivalent
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}: {self.before} -> {self.after}"


def _skipped_nodes(tree: ast.AST) -> set:
    """Nodes whose subtrees are not mutated: docstrings, messages, log calls, annotations."""
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.add(body[0])
        if isinstance(node, ast.JoinedStr):
            skip.add(node)
        if isinstance(node, ast.Raise) and node.exc is not None:
            skip.add(node.exc)  # the message; deleting the raise itself is a mutant
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id in QUIET_CALLS:
            skip.add(node)
        for name in ("annotation", "returns"):
            if getattr(node, name, None) is not None:
                skip.add(getattr(node, name))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            skip.add(node)
    inside = set()
    for node in skip:
        inside.update(id(n) for n in ast.walk(node))
    return inside


def _sites(tree: ast.AST):
    """Yield (node, kind, apply, undo) for every mutation site of ``tree``."""
    skip = _skipped_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in SWAP_COMPARE:
                    yield _swap(node, i, SWAP_COMPARE[type(op)]())
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in SWAP_BINOP:
            yield _attr(node, "op", SWAP_BINOP[type(node.op)](), "arith")
        elif isinstance(node, ast.BoolOp):
            yield _attr(node, "op", SWAP_BOOL[type(node.op)](), "bool")
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                yield _attr(node, "value", not value, "constant")
            elif isinstance(value, (int, float)):
                yield _attr(node, "value", value + 1, "constant")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
            yield ("unary", node)
        elif isinstance(node, ast.If):
            yield _attr(node, "test", ast.UnaryOp(op=ast.Not(), operand=node.test), "negate")
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for i, stmt in enumerate(stmts):
                if id(stmt) in skip:
                    continue
                if isinstance(stmt, ast.Raise) or (isinstance(stmt, ast.Expr) and
                                                   isinstance(stmt.value, ast.Call)):
                    yield _replace(stmts, i, ast.Pass(), "delete")


def _swap(node, i, new):
    def apply():
        old = node.ops[i]
        node.ops[i] = new
        return lambda: node.ops.__setitem__(i, old)
    return ("compare", apply, node)


def _attr(node, name, new, kind):
    def apply():
        old = getattr(node, name)
        setattr(node, name, new)
        return lambda: setattr(node, name, old)
    return (kind, apply, node)


def _replace(stmts, i, new, kind):
    def apply():
        old = stmts[i]
        stmts[i] = ast.copy_location(new, old)
        return lambda: stmts.__setitem__(i, old)
    return (kind, apply, stmts[i])


def mutants_of(path: str) -> list[Mutant]:
    """Every mutant of one source file (relative to the repository root)."""
    text = open(os.path.join(ROOT, path)).read()
    tree = ast.parse(text)
    lines = text.splitlines()
    out = []
    for site in list(_sites(tree)):
        if site[0] == "unary":
            node = site[1]
            parent_fix = _unwrap_unary(tree, node)
            if parent_fix is None:
                continue
            kind, apply, anchor = "unary", parent_fix, node
        else:
            kind, apply, anchor = site
        before = ast.unparse(tree)
        undo = apply()
        try:
            source = ast.unparse(ast.fix_missing_locations(tree))
        finally:
            undo()
        if source == before:
            continue
        line = _changed_line(before, source)
        lineno = getattr(anchor, "lineno", None) or _find_line(lines, line[0])
        out.append(Mutant(path, lineno, kind, line[0].strip(), line[1].strip(), source))
    return out


def _unwrap_unary(tree, target):
    """An apply() that replaces the UnaryOp ``target`` by its operand in its parent."""
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is target:
                def apply(parent=parent, field=field):
                    setattr(parent, field, target.operand)
                    return lambda: setattr(parent, field, target)
                return apply
            if isinstance(value, list) and any(v is target for v in value):
                i = next(k for k, v in enumerate(value) if v is target)

                def apply(value=value, i=i):
                    value[i] = target.operand
                    return lambda: value.__setitem__(i, target)
                return apply
    return None


def _changed_line(before: str, after: str) -> tuple[str, str]:
    a, b = before.splitlines(), after.splitlines()
    for x, y in zip(a, b):
        if x != y:
            return x, y
    return (a[len(b)] if len(a) > len(b) else "", b[len(a)] if len(b) > len(a) else "")


def _find_line(lines, unparsed: str) -> int:
    """Best-effort source line of an unparsed statement (for the report)."""
    words = [w for w in unparsed.replace("(", " ").replace(")", " ").split() if len(w) > 3]
    best, score = 0, -1
    for i, line in enumerate(lines):
        s = sum(w in line for w in words[:6])
        if s > score:
            best, score = i + 1, s
    return best


# ---- running ------------------------------------------------------------------------------
def make_copy(where: str) -> str:
    """A copy of the repository (tracked and untracked-unignored files, plus the built
    extension) with ``pkgroot/dlpack_io/*`` pointing into it; returns the copy's root."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    files += [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT)
              if ".venv" not in d and ".git" not in d for f in fs if f.endswith(".so")]
    for rel in files:
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue
        dst = os.path.join(where, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    ns = os.path.join(where, "pkgroot", "dlpack_io")
    os.makedirs(ns)
    for name, folder in PACKAGES.items():
        os.symlink(os.path.join(where, folder), os.path.join(ns, name))
    return where


def run_tests(copy: str, tests: list, timeout: float) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout', seconds, tail of the output)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(copy, "pkgroot"),
               PYTHONDONTWRITEBYTECODE="1", DLPACK_FUZZ_EXAMPLES=os.environ.get(
                   "DLPACK_FUZZ_EXAMPLES", "60"))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=--import-mode=importlib", *tests]
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, ""
    took = time.monotonic() - start
    return ("pass" if done.returncode == 0 else "fail"), took, (done.stdout + done.stderr)[-1500:]


def _check_imports_copy(copy: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.path.join(copy, "pkgroot"))
    got = subprocess.run([sys.executable, "-c", "import dlpack_io.reader.batch.order as m; print(m.__file__)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not got.startswith(copy):
        raise SystemExit(f"the copy is not what dlpack_io imports ({got}); is the project "
                         f"installed non-editable?")


def run_module(name: str, mutants: list, jobs: int, timeout: float, log) -> None:
    files, tests = MODULES[name]
    tests = [t for t in tests if os.path.exists(os.path.join(ROOT, t.split("::")[0]))]
    base = tempfile.mkdtemp(prefix=f"dlpack-mutation-{name}-")
    copies = [make_copy(os.path.join(base, f"copy{j}")) for j in range(jobs)]
    _check_imports_copy(copies[0])
    status, took, tail = run_tests(copies[0], tests, 3 * timeout if timeout > 0 else 1800)
    if status != "pass":
        raise SystemExit(f"{name}: the tests fail without any mutant:\n{tail}")
    log(f"{name}: tests pass unmutated in {took:.0f} s; {len(mutants)} mutants, "
        f"{len(tests)} test files")
    # parallel copies and a shared machine slow every run down: a deadline near the quiet
    # time would count slow survivors as "killed (timeout)"
    deadline = max(120.0, 4 * jobs * took) if timeout <= 0 else timeout
    free = list(copies)

    def one(m: Mutant) -> Mutant:
        copy = free.pop()
        path = os.path.join(copy, m.file)
        original = open(path).read()
        try:
            with open(path, "w") as f:
                f.write(m.source)
            status, m.seconds, _ = run_tests(copy, tests, deadline)
        finally:
            with open(path, "w") as f:
                f.write(original)
            free.append(copy)
        m.outcome = {"fail": "killed", "timeout": "killed (timeout)", "pass": "survived"}[status]
        if m.outcome == "survived" and (m.file, m.before, m.after) in EQUIVALENT:
            m.outcome = "equivalent"
        log(f"  {m.outcome:16s} {m.seconds:5.0f} s  {m.key}")
        return m

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, mutants))
    shutil.rmtree(base, ignore_errors=True)


def summarise(results: dict) -> str:
    lines = ["| module | mutants | killed | equivalent | survived | caught of non-equivalent |",
             "|---|---|---|---|---|---|"]
    for name, ms in results.items():
        killed = sum(m.outcome.startswith("killed") for m in ms)
        equiv = sum(m.outcome == "equivalent" for m in ms)
        surv = sum(m.outcome == "survived" for m in ms)
        rate = 100.0 * killed / max(killed + surv, 1)
        lines.append(f"| {name} | {len(ms)} | {killed} | {equiv} | {surv} | {rate:.0f}% |")
    return "\n".join(lines)


def _not_killed(path: str, name: str) -> set:
    """(file, line, mutated line) of module ``name``'s mutants not killed in an earlier run."""
    with open(path) as f:
        earlier = json.load(f).get(name, [])
    return {(m["file"], m["before"], m["after"]) for m in earlier
            if not m["outcome"].startswith("killed")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("modules", nargs="*", help=f"modules to mutate: {', '.join(MODULES)} "
                                               f"(default: all)")
    p.add_argument("--sample", type=int, default=40, help="mutants per module (0: all)")
    p.add_argument("--seed", type=int, default=17, help="seed of the sample")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested in parallel")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds per mutant (default: 4 x jobs x the unmutated run, at "
                        "least 120)")
    p.add_argument("--list", action="store_true", help="list the sampled mutants, run nothing")
    p.add_argument("--only", help="run only mutants whose description contains this text")
    p.add_argument("--json", help="write every mutant's outcome to this file")
    p.add_argument("--rerun", metavar="JSON",
                   help="run only the mutants that survived (or were equivalent) in this "
                        "earlier --json file, e.g. after adding tests")
    args = p.parse_args(argv)
    names = args.modules or list(MODULES)
    unknown = sorted(set(names) - set(MODULES))
    if unknown:
        p.error(f"unknown modules {unknown}: expected some of {', '.join(MODULES)}")
    results, start = {}, time.monotonic()
    for name in names:
        every = [m for f in MODULES[name][0] for m in mutants_of(f)]
        picked = every if args.sample <= 0 or len(every) <= args.sample else \
            random.Random(f"{args.seed}:{name}").sample(every, args.sample)
        picked.sort(key=lambda m: (m.file, m.line, m.kind, m.after))
        if args.only:
            picked = [m for m in picked if args.only in m.key]
        if args.rerun:
            picked = [m for m in picked
                      if (m.file, m.before, m.after) in _not_killed(args.rerun, name)]
        if args.list:
            print(f"{name}: {len(picked)} of {len(every)} mutants")
            for m in picked:
                print(f"  {m.kind:9s} {m.key}")
            continue
        run_module(name, picked, args.jobs, args.timeout, lambda s: print(s, flush=True))
        results[name] = picked
    if results:
        print()
        print(summarise(results))
        print(f"\n{sum(len(v) for v in results.values())} mutants in "
              f"{(time.monotonic() - start) / 60:.1f} min")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({k: [dict(file=m.file, line=m.line, kind=m.kind, before=m.before,
                                    after=m.after, outcome=m.outcome, seconds=round(m.seconds, 1))
                               for m in v] for k, v in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
