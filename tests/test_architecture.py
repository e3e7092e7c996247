"""docs/ARCHITECTURE.md tells the truth: the files one steady-state batch runs are the ones it
lists (traced, every thread), at most MAX_BATCH_FILES of them; and no docstring, comment or
user doc names a Python file that does not exist."""
from __future__ import annotations

import json
import re
import subprocess
import sys
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


def test_no_docstring_comment_or_doc_names_a_file_that_does_not_exist():
    have = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts and
            ".git" not in p.parts}
    sources = [p for d in PRODUCT for p in (ROOT / d).rglob("*.py")]
    docs = [ROOT / "docs" / "ARCHITECTURE.md"]
    missing = {}
    for path in sources + docs:
        for name in _named_files(path.read_text()) - have - FOREIGN:
            missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"named but not in the tree: {missing}"
