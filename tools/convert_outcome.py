"""How a ``dlpack convert`` ends: the exit codes, the ``--max-rejects`` verdict, and the one
command that resumes an interrupted run (what cli_convert prints, kept apart so it can be
tested without running a conversion)."""
from __future__ import annotations

import os
import re
import shlex

EXIT_FAILED = 1        # the conversion failed (the message names the retry)
EXIT_REJECTS = 3       # complete, but more inputs were rejected than --max-rejects allows
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)

_LIMIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


def parse_max_rejects(text: str) -> tuple[float, bool]:
    """'5' -> (5, False): at most 5 rejects; '2.5%' -> (2.5, True): at most 2.5% of the
    inputs. Raises ValueError naming the value and the two accepted forms."""
    match = _LIMIT.match(str(text))
    if not match:
        raise ValueError(f"--max-rejects {text!r}: expected a count (e.g. 10) or a percentage "
                         f"of the inputs (e.g. 0.5%)")
    value, percent = float(match.group(1)), bool(match.group(2))
    if percent and value > 100:
        raise ValueError(f"--max-rejects {text!r}: a percentage is at most 100%")
    if not percent and value != int(value):
        raise ValueError(f"--max-rejects {text!r}: a count is a whole number (or add % for a "
                         f"percentage)")
    return value, percent


def rejects_verdict(rejects: int, packed: int, limit: tuple[float, bool],
                    listed_in: str = "rejects.tsv") -> tuple[str, bool]:
    """(the summary line about rejects, '' for none; whether they exceed ``limit``) for a
    finished run that packed ``packed`` inputs and rejected ``rejects`` (``listed_in``)."""
    inputs = rejects + packed
    value, percent = limit
    allowed = value * inputs / 100 if percent else value
    over = rejects > allowed
    shown = f"{value:g}%" if percent else f"{int(value)}"
    if not rejects:
        return "", False
    share = 100 * rejects / inputs
    line = (f"rejects: {rejects} of {inputs} inputs ({share:.1f}%) were rejected and are listed "
            f"in {listed_in}; the data set holds the other {packed}")
    if over:
        line += (f"; that is more than --max-rejects {shown}: exit code {EXIT_REJECTS} (pass "
                 f"--max-rejects with a higher count or percentage to accept them)")
    return line, over


def resume_command(argv: list[str], dst: str) -> str:
    """The one command that continues an interrupted ``dlpack convert``: the same command
    with --resume (and without --overwrite, which would start over), unless the run was
    stopped before it touched a finished data set it was told to overwrite."""
    from dlpack_io.packer.journal import JOURNAL_NAME
    from dlpack_io.reader.format import MANIFEST_NAME

    args = list(argv)
    untouched = "--overwrite" in args and "://" not in dst and \
        os.path.exists(os.path.join(dst, MANIFEST_NAME)) and \
        not os.path.exists(os.path.join(dst, JOURNAL_NAME))
    if untouched:
        return shlex.join(["dlpack"] + args)
    args = [a for a in args if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["dlpack"] + args)
