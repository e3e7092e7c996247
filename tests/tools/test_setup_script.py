"""scripts/setup.sh says what it does before each step that can take minutes (installing
torch, building pillow-simd, the editable install, Azurite) instead of staying silent, and
a second run skips the editable install when nothing it is built from changed.

Runs the real script in a copy of the repository's build inputs, with stand-ins for
python, pip and npm that record what they are asked and 'install' by leaving a marker."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_PYTHON = r"""#!/usr/bin/env bash
# a stand-in: "import X" succeeds once X was "installed"; pip installs leave markers
state="$(dirname "$0")/../state"; mkdir -p "$state"
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "PIP ${*:3}"
  for arg in "${@:3}"; do case "$arg" in
    *numpy*) touch "$state/numpy";; *torch*) touch "$state/torch";;
    pillow*) touch "$state/PIL";; -e) touch "$state/dlpack_io";; esac; done
  exit 0
fi
if [ "$1" = "-c" ]; then
  mod=$(echo "$2" | sed -E 's/^import ([A-Za-z_]+).*/\1/; s/^from ([A-Za-z_]+).*/\1/')
  [ -e "$state/$mod" ] && exit 0 || exit 1
fi
exit 0
"""


def _sandbox(tmp_path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "reader").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts")
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(ROOT / name, repo)
    for c in (ROOT / "reader").glob("*.c"):
        shutil.copy(c, repo / "reader")
    bin_ = repo / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "pip").write_text('#!/usr/bin/env bash\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    (bin_ / "npm").write_text('#!/usr/bin/env bash\necho "NPM $*"\n')
    (bin_ / "activate").write_text(f'export PATH="{bin_}:$PATH"\n')
    for tool in ("python", "pip", "npm"):
        (bin_ / tool).chmod(stat.S_IRWXU)
    return repo


def _run(repo) -> list[str]:
    env = dict(os.environ, PATH=f"{repo / '.venv' / 'bin'}:/usr/bin:/bin")
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True).stdout
    return out.splitlines()


def test_each_long_step_is_announced_and_a_second_run_skips_the_install(tmp_path):
    repo = _sandbox(tmp_path)
    lines = _run(repo)
    installs = [k for k, line in enumerate(lines) if line.startswith(("PIP", "NPM"))]
    assert len(installs) >= 4, lines  # numpy, torch, pillow-simd, dlpack-io (+ azurite)
    for k in installs:  # the line before each install (or group of them) says what starts
        before = [line for line in lines[:k] if not line.startswith(("PIP", "NPM"))]
        assert before and before[-1].startswith("setup: "), (k, lines)
    assert any("torch" in line and line.startswith("setup: installing") for line in lines)
    again = _run(repo)
    assert not [line for line in again if line.startswith("PIP")], again
    assert any("already installed" in line for line in again)
