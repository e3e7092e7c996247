"""The docs tell the truth: docs/ARCHITECTURE.md's files of one steady-state batch are the
ones it runs (traced, every thread), at most MAX_BATCH_FILES of them; no docstring, comment
or user doc names a file that does not exist; the user docs stay a user's (README.md a
front page that starts with the two set-up commands, docs/benchmarks.md current results,
no internal issue numbers); docs/loader.md names every Loader option, its option tables
being the ones reader/batch/options.py makes (``python tests/test_architecture.py``
rewrites them)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MAX_BATCH_FILES = 12
PRODUCT = ("reader", "packer", "kernels", "tools")

# Steady-state batches of the documented recipe, traced in a fresh process: batches 0-1 warm
# the pipeline up, then every product file whose code runs (in any thread) while batches
# 2-9 are delivered is recorded. 20 batches of 2 with 4 in flight: the batches submitted in
# that window (6-13) are planned and built inside it, those delivered (2-9) finished there.
TRACE = r"""
import json, os, sys, threading
from dlpack_io.reader import (Dataset, Loader, Normalize, RandomHorizontalFlip,
                              RandomResizedCrop)
import dlpack_io.reader as reader
root = os.path.dirname(os.path.dirname(reader.__file__))
product = tuple(os.path.join(root, d) + os.sep for d in %r)
seen, on = set(), [False]

def tracer(frame, event, arg):
    if on[0] and frame.f_code.co_filename.startswith(product):
        seen.add(os.path.relpath(frame.f_code.co_filename, root))
    return None

threading.settrace(tracer)
sys.settrace(tracer)
loader = Loader(Dataset(sys.argv[1]), batch_size=2, num_workers=2,
                transforms=[RandomResizedCrop(32), RandomHorizontalFlip(), Normalize()])
it = iter(loader)
next(it), next(it)
on[0] = True
for _ in range(8):
    next(it)
on[0] = False
sys.settrace(None)
threading.settrace(None)
loader.close()
print(json.dumps(sorted(seen)))
""" % (PRODUCT,)


def documented_batch_files() -> list[str]:
    """The files docs/ARCHITECTURE.md lists for one batch (its fenced block after the
    marker line ``<!-- the files of one batch -->``), first word of each line."""
    text = DOC.read_text()
    block = text.split("<!-- the files of one batch -->", 1)[1].split("```", 2)[1]
    return [line.split()[0] for line in block.strip().splitlines() if line.strip()]


def test_one_batch_runs_the_files_the_architecture_lists():
    golden = ROOT / "tests" / "data" / "golden" / "photos"
    done = subprocess.run([sys.executable, "-c", TRACE, str(golden)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    traced = json.loads(done.stdout.strip().splitlines()[-1])
    listed = documented_batch_files()
    assert len(traced) <= MAX_BATCH_FILES, traced
    assert sorted(listed) == traced, (f"docs/ARCHITECTURE.md lists {sorted(listed)}, one "
                                      f"batch runs {traced}")


# Python files named in prose that are not ours to have (other projects' files, or names
# that describe what a user writes).
FOREIGN = {"setup.py", "naflex_loader.py", "tariterators.py", "train.py", "conftest.py",
           "my_transforms.py", "transforms.py"}


def _named_files(text: str) -> set[str]:
    return set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*\.py)\b", text))


OUTPUT_FOLDERS = ("bench-out/",)  # what commands write: named in the docs, not in the tree


def user_docs() -> list[Path]:
    """README.md and every page of docs/: what users read."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _named_paths(text: str) -> set[str]:
    """Paths with at least one folder (``reader/batch/plan.py``, ``docs/gpu.md``,
    ``scripts/bench.sh``) named in a text."""
    return set(re.findall(r"(?<![\w/.-])((?:[A-Za-z_][\w-]*/)+[A-Za-z_]\w*\."
                          r"(?:py|c|md|sh|toml))\b", text))


def test_no_docstring_comment_or_doc_names_a_file_that_does_not_exist():
    have = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts and
            ".git" not in p.parts}
    sources = [p for d in PRODUCT for p in (ROOT / d).rglob("*.py")]
    missing = {}
    for path in sources + user_docs():
        for name in _named_files(path.read_text()) - have - FOREIGN:
            missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    for path in user_docs():  # a path in a doc names its folder too: that must hold as well
        for named in _named_paths(path.read_text()):
            if named.startswith(OUTPUT_FOLDERS) or (ROOT / named).exists() or \
                    (path.parent / named).exists():
                continue
            missing.setdefault(named, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"named but not in the tree: {missing}"


# ---- the user docs stay a user's --------------------------------------------------------
MAX_README_LINES, MAX_BENCHMARKS_LINES = 250, 400
SETUP_COMMANDS = ("bash scripts/demo.sh", "bash scripts/test.sh")
ISSUE_NUMBER = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)


def test_readme_is_a_front_page_that_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, \
        f"README.md has {len(text.splitlines())} lines; at most {MAX_README_LINES}: " \
        f"the details belong in docs/"
    first_block = text.split("```", 2)[1].splitlines()[1:]  # the first fenced block
    commands = [line.split("#")[0].strip() for line in first_block if line.strip()]
    assert commands == list(SETUP_COMMANDS), (
        f"README.md's first code block must be the two set-up commands {SETUP_COMMANDS} "
        f"(CI runs them), got {commands}")
    assert text.index("```") < text.index("\n## "), "the set-up commands come first"


def test_benchmarks_md_holds_current_results_not_a_diary():
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    assert len(lines) <= MAX_BENCHMARKS_LINES, \
        f"docs/benchmarks.md has {len(lines)} lines; at most {MAX_BENCHMARKS_LINES}: " \
        f"keep the latest figure of each comparison, the history is in git"


def test_no_user_doc_names_an_internal_issue_number():
    found = {str(p.relative_to(ROOT)): ISSUE_NUMBER.findall(p.read_text())
             for p in user_docs()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"user docs name internal issues (say what is true now): {found}"


# ---- docs/loader.md and reader/batch/options.py -----------------------------------------
LOADER_MD = ROOT / "docs" / "loader.md"
BLOCK = "<!-- generated from reader/batch/options.py: {} (python tests/test_architecture.py) -->"
END = "<!-- end of generated block -->"


def _options():
    from dlpack_io.reader.batch import options
    return options


def _default(f) -> str:
    value = f.default if f.default is not MISSING else None
    if f.default is MISSING:
        return f"`{f.default_factory.__name__}()`"
    return "`" + repr(value).replace("'", '"') + "`"


def _md(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|").strip()


def option_tables() -> dict[str, str]:
    """docs/loader.md's generated blocks, made from reader/batch/options.py: the keyword
    options and the three groups (defaults and one-line docs), DataLoader's names, and the
    keywords of earlier releases with their new spelling."""
    o = _options()
    lines = ["| option | default | what it sets |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {_default(f)} | {_md(f.metadata['doc'])} |"
              for f in fields(o.LoaderOptions) if f.name not in o.GROUPS]
    for name, cls in o.GROUPS.items():
        lines += ["", f"`{name}={cls.__name__}(...)`: {_md(cls.__doc__)}", "",
                  f"| `{cls.__name__}` field | default | what it sets |", "|---|---|---|"]
        lines += [f"| `{f.name}` | {_default(f)} | {_md(f.metadata['doc'])} |"
                  for f in fields(cls)]
    options = "\n".join(lines)
    lines = ["| DataLoader's keyword | in `Loader(...)` |", "|---|---|"]
    lines += [f"| `{name}=` | the same: `{group}={o.GROUPS[group].__name__}({key}=...)` |"
              for name, (group, key) in o.DATALOADER_NAMES.items()]
    lines += ["| `prefetch_factor=` | the same: batches in flight per worker "
              "(`workers=Workers(prefetch=...)` counts them in all) |"]
    lines += [f"| `{name}=` | refused with the fix: {_md(fix)} |"
              for name, fix in o.DATALOADER_ONLY.items()]
    dataloader = "\n".join(lines)
    lines = ["| earlier keyword | new spelling |", "|---|---|"]
    lines += [f"| `{name}=` | `{group}={o.GROUPS[group].__name__}({key}=...)` |"
              for name, (group, key) in o.LEGACY_NAMES.items()]
    lines += ["| `options=LoaderOptions(...)` | the options as keywords: "
              "`Loader(ds, **vars(options))` |"]
    return {"options": options, "dataloader": dataloader, "deprecated": "\n".join(lines)}


def _blocks(text: str) -> dict[str, str]:
    out = {}
    for name in option_tables():
        start = BLOCK.format(name)
        assert start in text, f"docs/loader.md lacks the generated block {start}"
        out[name] = text.split(start, 1)[1].split(END, 1)[0].strip()
    return out


def test_loader_md_option_tables_are_those_options_py_makes():
    stale = [name for name, block in _blocks(LOADER_MD.read_text()).items()
             if block != option_tables()[name]]
    assert not stale, (f"docs/loader.md's {stale} tables differ from reader/batch/options.py: "
                       f"run python tests/test_architecture.py to rewrite them")


def test_loader_md_names_every_loader_option():
    o = _options()
    text = LOADER_MD.read_text()
    missing = [f"{cls.__name__}.{f.name}" for cls in (o.LoaderOptions, *o.GROUPS.values())
               for f in fields(cls) if not re.search(rf"`{f.name}\b", text)]
    missing += [f"{name}=" for name in [*o.DATALOADER_NAMES, *o.LEGACY_NAMES,
                                         *o.DATALOADER_ONLY] if f"`{name}=`" not in text]
    assert not missing, f"docs/loader.md does not name {missing}"


def write_option_tables() -> None:
    """Rewrite docs/loader.md's generated blocks from reader/batch/options.py."""
    text = LOADER_MD.read_text()
    for name, table in option_tables().items():
        start = BLOCK.format(name)
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{table}\n{END}{rest.split(END, 1)[1]}"
    LOADER_MD.write_text(text)


if __name__ == "__main__":
    write_option_tables()
